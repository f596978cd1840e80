"""``features:PATH``: a user's own features, mapped from an uncompressed .npz, and its errors."""

from __future__ import annotations

import io
import re
import struct
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from alm_opacus.data import DataError, dataset_spec, load_dataset
from alm_opacus.data.features import (
    UNIT_NORM_TOLERANCE,
    default_split,
    read_features,
    release_pages,
)
from alm_opacus.data.split import SplitSizes, make_split


def _mixture(
    rows: int, dim: int = 6, classes: int = 3, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.arange(rows) % classes
    x = rng.standard_normal((rows, dim)) + 2 * np.eye(classes, dim)[y]
    return x.astype(np.float32), y.astype(np.int64)


def _write(path: Path, **fields: object) -> Path:
    np.savez(path, **fields)  # type: ignore[arg-type]
    return path


@pytest.fixture
def good(tmp_path: Path) -> Path:
    x, y = _mixture(60)
    return _write(tmp_path / "good.npz", x=x, y=y)


def test_a_file_written_by_numpy_is_read_mapped_and_unit_norm(tmp_path: Path) -> None:
    x, y = _mixture(60)
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    mapped = read_features(_write(tmp_path / "unit.npz", x=unit, y=y))
    assert isinstance(mapped.features, np.memmap)  # used in place: no copy
    np.testing.assert_array_equal(np.asarray(mapped.features), unit)
    raw = read_features(_write(tmp_path / "raw.npz", x=x, y=y))
    assert raw.features is not None and not isinstance(raw.features, np.memmap)
    norms = np.linalg.norm(raw.features.astype(np.float64), axis=1)
    assert np.abs(norms - 1).max() <= UNIT_NORM_TOLERANCE
    # each row keeps its direction
    cosine = np.einsum("ij,ij->i", raw.features, unit) / norms
    assert np.abs(cosine - 1).max() < 1e-6
    np.testing.assert_array_equal(raw.labels, y)
    assert raw.images is None and raw.num_classes == 3 and raw.roles is None


def test_the_map_reads_the_member_at_its_offset(tmp_path: Path) -> None:
    # fortran order, float64, another field stored first: the bytes are where the zip's
    # local header says, whatever else the archive holds
    x, y = _mixture(40)
    x = np.asfortranarray(x.astype(np.float64) / np.linalg.norm(x, axis=1, keepdims=True))
    path = _write(tmp_path / "f.npz", num_classes=np.int64(3), x=x, y=y)
    got = read_features(path).features
    assert isinstance(got, np.memmap) and got.dtype == np.float64
    np.testing.assert_array_equal(np.asarray(got), x)
    with zipfile.ZipFile(path) as archive:  # an independent read of the same member
        np.testing.assert_array_equal(np.load(archive.open("x.npy")), np.asarray(got))


def _resident_kib(path: Path) -> int:
    """Resident KiB of this process's mappings of ``path`` (Linux's /proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5:  # a mapping's first line
            inside = line.endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(head[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's /proc")
def test_released_pages_leave_the_resident_set_and_read_back_the_same(tmp_path: Path) -> None:
    """The harness copies its parts out of the mapping, then releases its pages: they leave
    the process's resident set (a 5*10^4-member file is 1 GB of it) and a later read gives
    the file's values again."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4096, 256))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    path = _write(tmp_path / "big.npz", x=x, y=np.arange(4096) % 4)  # 8 MiB of rows
    mapped = read_features(path).features
    assert isinstance(mapped, np.memmap)
    assert float(np.asarray(mapped).sum()) == pytest.approx(float(x.sum()))  # every page read
    before = _resident_kib(path)
    assert before >= 7 * 1024
    release_pages(mapped)
    assert _resident_kib(path) < before / 8
    np.testing.assert_array_equal(np.asarray(mapped), x)
    release_pages(np.zeros(3))  # not a mapping: nothing to do
    release_pages(None)


#: Row i's role: members, non-members, an attacker's pool of twice the members, public.
_CYCLE = ("member", "non-member", "attacker", "attacker", "public")


def _roles(rows: int) -> np.ndarray:
    return np.array([_CYCLE[i % 5] for i in range(rows)])


def test_roles_fix_the_split(tmp_path: Path) -> None:
    x, y = _mixture(60)
    path = _write(tmp_path / "roles.npz", x=x, y=y, role=_roles(60))
    dataset = load_dataset(f"features:{path}")
    spec = dataset_spec(f"features:{path}")
    assert spec.split == SplitSizes(members=12, nonmembers=12, attacker=24, public=12)
    split = make_split(dataset, sizes=spec.split, seed=4)
    rows = np.arange(60)
    for part, kept in (
        ("members", rows % 5 == 0),
        ("nonmembers", rows % 5 == 1),
        ("attacker", np.isin(rows % 5, (2, 3))),
        ("public", rows % 5 == 4),
    ):
        np.testing.assert_array_equal(getattr(split, part), rows[kept])
    with pytest.raises(DataError, match=r"field 'role' fixes the split.*drop --split"):
        make_split(dataset, sizes=SplitSizes(members=10), seed=0)


def test_without_roles_the_default_proportions(good: Path) -> None:
    spec = dataset_spec(f"features:{good}")
    assert spec.split == default_split(60) == SplitSizes(members=12, nonmembers=12, attacker=24)
    assert spec.ssl is None and spec.head.solver == "newton"
    split = make_split(load_dataset(f"features:{good}"), sizes=spec.split, seed=0)
    assert split.sizes() == {"public": 12, "members": 12, "nonmembers": 12, "attacker": 24}


def _bad_cases(tmp: Path) -> list[tuple[Path, str, str]]:
    x, y = _mixture(60)
    nan = x.copy()
    nan[17, 3] = np.nan
    inf = x.copy()
    inf[5, 0] = np.inf
    zero = x.copy()
    zero[9] = 0
    rare = y.copy()
    rare[rare == 2] = 1
    rare[:2] = 2  # class 2 has 2 rows: too few for four parts
    role = _roles(60)
    no_public = np.where(role == "public", "attacker", role)
    class_role = role.copy()
    class_role[(y == 1) & (role == "public")] = "attacker"
    uneven = np.where((role == "non-member") & (np.arange(60) < 10), "public", role)
    few_attackers = np.where((role == "attacker") & (np.arange(60) < 10), "public", role)
    non_ascii = role.astype("S10")
    non_ascii[7] = b"m\xe9mber"
    cases: list[tuple[str, dict[str, object], str, str]] = [
        ("x-missing", {"y": y}, "x", "is missing"),
        ("x-1d", {"x": x[:, 0], "y": y}, "x", r"has shape \(60,\); expected \(n, d\)"),
        ("x-int", {"x": x.astype(np.int64), "y": y}, "x", "dtype int64; expected float32"),
        ("x-nan", {"x": nan, "y": y}, "x", "row 17, column 3 is nan"),
        ("x-inf", {"x": inf, "y": y}, "x", "row 5, column 0 is inf"),
        ("x-zero", {"x": zero, "y": y}, "x", "row 9 is all zeros"),
        ("y-missing", {"x": x}, "y", "is missing"),
        ("y-length", {"x": x, "y": y[:50]}, "y", r"has shape \(50,\); expected \(60,\)"),
        ("y-float", {"x": x, "y": y.astype(np.float32)}, "y", "dtype float32; expected integer"),
        ("y-negative", {"x": x, "y": y - 1}, "y", "labels from -1 to 1"),
        ("y-range", {"x": x, "y": y, "num_classes": np.int64(2)}, "y", r"expected 0 \.\.\. 1"),
        ("y-empty-class", {"x": x, "y": y, "num_classes": np.int64(5)}, "y", "class 3 has no row"),
        ("y-rare", {"x": x, "y": rare}, "y", "class 2 has 2 rows, too few"),
        ("classes", {"x": x, "y": y, "num_classes": np.float64(3)}, "num_classes", "expected one"),
        ("role-length", {"x": x, "y": y, "role": role[:59]}, "role", r"expected \(60,\)"),
        (
            "role-value",
            {"x": x, "y": y, "role": np.where(role == "public", "pub", role)},
            "role",
            "holds 'pub'; expected one of member",
        ),
        ("role-empty", {"x": x, "y": y, "role": no_public}, "role", "leaves role 'public' empty"),
        (
            "role-class",
            {"x": x, "y": y, "role": class_role},
            "role",
            "no row of class 1 has role 'public'",
        ),
        ("role-int", {"x": x, "y": y, "role": np.arange(60) % 4}, "role", "expected strings"),
        (
            "roles-key",
            {"x": x, "y": y, "roles": role},
            "roles",
            r"not a field of a features file: expected x, y and optionally role, num_classes; "
            r"did you mean 'role'\?",
        ),
        (
            "extra-key",
            {"x": x, "y": y, "notes": np.arange(3)},
            "notes",
            "not a field of a features file",
        ),
        (
            "role-uneven",
            {"x": x, "y": y, "role": uneven},
            "role",
            "has 12 'member' rows but 10 'non-member' rows; expected as many of each",
        ),
        (
            "role-attacker",
            {"x": x, "y": y, "role": few_attackers},
            "role",
            r"has 20 'attacker' rows for 12 'member' rows; expected at least 24 \(twice",
        ),
        (
            "role-bytes",
            {"x": x, "y": y, "role": non_ascii},
            "role",
            r"row 7 holds non-ASCII bytes b'm\\xe9mber'",
        ),
        (
            "num-classes-huge",
            {"x": x, "y": y, "num_classes": np.int64(10**15)},
            "num_classes",
            "is 1000000000000000, more than the 60 rows; expected at most 60 classes",
        ),
        (
            "y-huge",
            {"x": x, "y": y * 10**14},
            "y",
            "labels up to 200000000000000 make 200000000000001 classes, more than the 60 rows",
        ),
    ]
    out = []
    for name, fields, field, message in cases:
        out.append((_write(tmp / f"{name}.npz", **fields), field, message))
    compressed = tmp / "compressed.npz"
    np.savez_compressed(compressed, x=x, y=y)
    out.append((compressed, "x", r"is compressed \(np.savez_compressed\).*np.savez"))
    return out


@pytest.mark.parametrize("case", range(27))
def test_a_bad_file_is_one_line_naming_the_file_and_the_field(tmp_path: Path, case: int) -> None:
    path, field, message = _bad_cases(tmp_path)[case]
    with pytest.raises(DataError) as info:
        dataset = load_dataset(f"features:{path}")  # the file's own checks ...
        spec = dataset_spec(f"features:{path}")
        make_split(dataset, sizes=spec.split, seed=0)  # ... and the split's
    text = str(info.value)
    assert "\n" not in text
    assert f"features:{path}" in text or f"features file {path}" in text
    assert f"field {field!r}" in text
    assert re.search(message, text), text


def _npy(header: dict[str, object], data: bytes = b"") -> bytes:
    """A ``.npy`` member with a hand-written (possibly forged) version 1.0 header."""
    text = repr(header).encode("latin1")
    text += b" " * (-(10 + len(text) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + data


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:  # stored, as np.savez writes
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def _saved(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _forged_cases(tmp: Path) -> list[tuple[Path, str, str]]:
    x, y = _mixture(60, dim=4)
    good = {"y.npy": _saved(y)}
    f4 = {"descr": "<f4", "fortran_order": False}
    cases = [
        (
            "negative",
            {"x.npy": _npy({**f4, "shape": (-1, 4)})},
            "x",
            r"has shape \(-1, 4\) in its header; expected dimensions >= 0",
        ),
        # 2^62 x 2^62 x 8 bytes: int64 arithmetic would wrap to 0
        (
            "overflow",
            {"x.npy": _npy({**f4, "descr": "<f8", "shape": (2**62, 2**62)}, b"0" * 64)},
            "x",
            r"is truncated or forged: .* needs 170141183460469231731687303715884105728 bytes "
            r"of data, the archive holds 64",
        ),
        (
            "more-rows",
            {"x.npy": _npy({**f4, "shape": (600, 4)}, x.tobytes())},
            "x",
            r"needs 9600 bytes of data, the archive holds 960",
        ),
        (
            "empty-elements",
            {"x.npy": _saved(x), "role.npy": _npy({**f4, "descr": "<U0", "shape": (60,)})},
            "role",
            "dtype <U0 of 0-byte elements",
        ),
        (
            "garbled",
            {"x.npy": b"\x93NUMPY\x01\x00" + struct.pack("<H", 20) + b"{'descr': [[[[[["},
            "x",
            r"is not a readable .npy array \(",
        ),
        (
            "descr",
            {"x.npy": _npy({**f4, "descr": "<U99999999999999", "shape": (1,)})},
            "x",
            "is not a readable .npy array .*descr",
        ),
    ]
    out = [
        (_zip(tmp / f"{name}.npz", {**good, **members}), field, message)
        for name, members, field, message in cases
    ]
    twice = _zip(tmp / "twice.npz", {"x.npy": _saved(x), **good})
    with warnings.catch_warnings(), zipfile.ZipFile(twice, "a") as archive:
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name, and writes it
        archive.writestr("y.npy", _saved(y))
    out.append((twice, "y", "is stored twice"))
    return out


@pytest.mark.parametrize("case", range(7))
def test_a_forged_header_is_one_line_before_anything_is_mapped(tmp_path: Path, case: int) -> None:
    path, field, message = _forged_cases(tmp_path)[case]
    with pytest.raises(DataError) as info:
        read_features(path)
    text = str(info.value)
    assert "\n" not in text and f"features file {path}: field {field!r}" in text
    assert re.search(message, text), text


def test_a_central_directory_that_lies_about_sizes_is_refused(tmp_path: Path) -> None:
    # x's header claims 99 rows, the central directory claims the bytes to match: the data
    # would run into y's local header and past the end of the file
    x, y = _mixture(60, dim=4)
    header = {"descr": "<f4", "fortran_order": False, "shape": (99, 4)}
    member = _npy(header, x.tobytes())
    path = _zip(tmp_path / "lying.npz", {"x.npy": member, "y.npy": _saved(y)})
    data = bytearray(path.read_bytes())
    central = data.find(b"PK\x01\x02")  # x's central directory record comes first
    claimed = len(member) + 99 * 4 * 4 - 60 * 4 * 4
    struct.pack_into("<II", data, central + 20, claimed, claimed)  # compressed, uncompressed
    path.write_bytes(bytes(data))
    with zipfile.ZipFile(path) as archive:  # the lie is what zipfile reports
        assert archive.getinfo("x.npy").file_size == claimed
    with pytest.raises(
        DataError,
        match=r"field 'x': is truncated or forged: .*needs 1584 bytes "
        r"of data, the archive holds 960",
    ):
        read_features(path)


def test_not_a_file_or_not_a_zip(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"features file .*nowhere.npz: not found"):
        read_features(tmp_path / "nowhere.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip at all")
    with pytest.raises(DataError, match=r"junk.npz: not a readable .npz"):
        read_features(tmp_path / "junk.npz")
    with pytest.raises(DataError, match=r"expected features:PATH|unknown dataset"):
        dataset_spec("features:")


def test_a_rewritten_file_is_read_again(tmp_path: Path) -> None:
    x, y = _mixture(60)
    path = _write(tmp_path / "again.npz", x=x, y=y)
    assert load_dataset(f"features:{path}").num_classes == 3
    _write(path, x=x, y=y, num_classes=np.int64(3))
    x2, y2 = _mixture(60, classes=4)
    _write(path, x=x2, y=y2)
    assert load_dataset(f"features:{path}").num_classes == 4


def test_harness_uses_the_file_and_refuses_image_methods(good: Path, tmp_path: Path) -> None:
    from alm_opacus.run.config import RunConfig
    from alm_opacus.run.harness import load_plugins, plan_run, prepare

    load_plugins()
    config = RunConfig(dataset=f"features:{good}", out=str(tmp_path / "run"), progress=False)
    data = prepare(plan_run(config))
    assert data.images is None and data.encoder is None
    assert data.features.shape == (60, 6) and data.features.dtype == torch.float32
    assert config.to_dict()["ssl"] is None
    with pytest.raises(ValueError, match=r"method 'dpsgd-full' trains on images.*features only"):
        plan_run(RunConfig(dataset=f"features:{good}", methods=("dpsgd-full",)))
    with pytest.raises(DataError, match="not found"):
        RunConfig(dataset=f"features:{tmp_path / 'missing.npz'}")


def test_cli_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from alm_opacus.run.cli import main

    path, _, _ = _bad_cases(tmp_path)[3]  # a NaN
    with pytest.raises(SystemExit) as info:
        main(["--dataset", f"features:{path}", "--out", str(tmp_path / "run")])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "field 'x'" in err and "nan" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", ["roles-key", "role-attacker", "role-bytes", "num-classes-huge"])
def test_cli_refuses_a_hostile_file_before_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    from alm_opacus.run.cli import main

    cases = {p.stem: (p, field) for p, field, _ in _bad_cases(tmp_path)}
    path, field = cases[name]
    with pytest.raises(SystemExit) as info:
        main(["--dataset", f"features:{path}", "--out", str(tmp_path / "run")])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"field {field!r}" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_cli_refuses_a_forged_header_before_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from alm_opacus.run.cli import main

    path, _, _ = _forged_cases(tmp_path)[1]  # a shape whose byte count overflows int64
    with pytest.raises(SystemExit) as info:
        main(["--dataset", f"features:{path}", "--out", str(tmp_path / "run")])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "field 'x': is truncated or forged" in err
    assert not (tmp_path / "run").exists()
