"""Loading never runs code: malicious CIFAR pickles are refused and their payload never runs."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from alm_opacus.data import DataError, load_dataset
from alm_opacus.data.safe_pickle import UnsafePickleError, safe_load

from .test_readers import CIFAR10_DIR, cifar_rows, py2_pickle, py3_pickle, write_cifar10


class WriteMarker:
    """Unpickling this calls ``exec``, which writes ``path``: a stand-in for any payload."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:
        return (exec, (f"open({str(self.path)!r}, 'w').write('pwned')",))


class SystemMarker(WriteMarker):
    def __reduce__(self) -> tuple[object, ...]:
        return (os.system, (f"touch {self.path}",))


class ObjectArray(WriteMarker):
    """An object-dtype array whose element is the payload (numpy pickles its elements)."""

    def __reduce__(self) -> tuple[object, ...]:
        arr = np.empty(1, dtype=object)
        arr[0] = WriteMarker(self.path)
        return arr.__reduce__()


def _payloads(marker: Path) -> dict[str, object]:
    rows, _ = cifar_rows(2, first=0)
    return {
        "exec-in-data": {b"data": WriteMarker(marker), b"labels": [0, 1]},
        "os.system-in-labels": {b"data": rows, b"labels": SystemMarker(marker)},
        "exec-as-whole-file": WriteMarker(marker),
        "object-array": {b"data": ObjectArray(marker), b"labels": [0, 1]},
    }


@pytest.mark.parametrize(
    "kind", ["exec-in-data", "os.system-in-labels", "exec-as-whole-file", "object-array"]
)
def test_malicious_cifar_batch_is_refused_and_never_runs(tmp_path: Path, kind: str) -> None:
    write_cifar10(tmp_path)
    marker = tmp_path / "marker"
    blob = pickle.dumps(_payloads(marker)[kind], protocol=2)
    # The payload is live: plain pickle runs it.
    pickle.loads(blob)
    assert marker.read_text() == "pwned" or marker.exists()
    marker.unlink()

    path = tmp_path / CIFAR10_DIR / "data_batch_2"
    path.write_bytes(blob)
    with pytest.raises(DataError) as info:
        load_dataset("cifar10", root=tmp_path)
    message = str(info.value)
    assert message.startswith(f"{path}: refused to unpickle (refused ")
    assert "may be malicious" in message and "\n" not in message
    assert not marker.exists()


@pytest.mark.parametrize("dump", [py2_pickle, py3_pickle], ids=["python2", "python3"])
def test_genuine_batches_pass_the_restricted_unpickler(dump) -> None:  # type: ignore[no-untyped-def]
    rows, _ = cifar_rows(3, first=5)
    batch = {b"data": rows, b"labels": [1, 2, 3], b"batch_label": b"x", b"num": 10000}
    back = safe_load(io.BytesIO(dump(batch)), encoding="bytes")
    assert isinstance(back, dict) and back[b"labels"] == [1, 2, 3] and back[b"num"] == 10000
    np.testing.assert_array_equal(back[b"data"], rows)


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({b"x": np.array([1.5], dtype=np.float64)}, None),
        ((1, 2.5, "s", None, True), None),
        (np.array([object()], dtype=object), "refused"),
        ({1, 2}, "refused global __builtin__.set"),
        (Path("x"), "refused global pathlib"),
    ],
)
def test_only_arrays_and_plain_types_are_admitted(obj: object, expected: str | None) -> None:
    blob = pickle.dumps(obj, protocol=2)
    if expected is None:
        back = safe_load(io.BytesIO(blob))
        assert pickle.dumps(back, protocol=2) == blob
    else:
        with pytest.raises(UnsafePickleError, match=expected):
            safe_load(io.BytesIO(blob))


def test_codecs_encode_admits_only_latin1() -> None:
    # protocol 2 stores bytes as _codecs.encode(text, "latin1"); any other codec is refused.
    blob = pickle.dumps(b"\x00\xff", protocol=2)
    assert safe_load(io.BytesIO(blob)) == b"\x00\xff"
    forged = (
        b"\x80\x02c_codecs\nencode\nq\x00X\x02\x00\x00\x00abq\x01X\x05\x00\x00\x00rot13"
        b"q\x02\x86q\x03Rq\x04."
    )
    with pytest.raises(UnsafePickleError, match="codec 'rot13'"):
        safe_load(io.BytesIO(forged))
