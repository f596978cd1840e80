"""CIFAR-10/100 and STL-10 readers, on tiny files written in the official on-disk formats.

The file layouts are written here from the format descriptions on the datasets' pages, byte
index by byte index, not by the readers' reshapes, so a layout or orientation slip fails.
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from alm_opacus.data import DataError, available_datasets, load_dataset

CIFAR10_DIR = "cifar-10-batches-py"
CIFAR100_DIR = "cifar-100-python"
STL10_DIR = "stl10_binary"
URLS = {
    "cifar10": "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
    "cifar100": "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
    "stl10": "http://ai.stanford.edu/~acoates/stl10/stl10_binary.tar.gz",
}
FILES = {
    "cifar10": (
        CIFAR10_DIR,
        [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta"],
    ),
    "cifar100": (CIFAR100_DIR, ["train", "test", "meta"]),
    "stl10": (
        STL10_DIR,
        ["train_X.bin", "train_y.bin", "test_X.bin", "test_y.bin", "unlabeled_X.bin"],
    ),
}
CIFAR10_SIZES = {"data_batch_1": 2, "data_batch_2": 3, "data_batch_3": 1}
CIFAR10_SIZES |= {"data_batch_4": 2, "data_batch_5": 2}
STL10_SIZES = {"train": 3, "test": 2, "unlabeled": 4}
Pickler = Callable[[object], bytes]


def py2_pickle(obj: object) -> bytes:
    """Pickle ``obj`` with the opcodes Python 2's cPickle wrote into the official CIFAR files.

    Handles dicts, lists, ints, bytes (Python 2 ``str``) and ``uint8`` arrays, which numpy 1.x
    pickled through ``numpy.core.multiarray._reconstruct``.
    """
    out = bytearray()

    def binstring(data: bytes) -> None:
        out.extend(b"T" + struct.pack("<I", len(data)) + data)

    def emit(x: object) -> None:
        if isinstance(x, dict):
            out.extend(b"(d")
            for k, v in x.items():
                emit(k)
                emit(v)
                out.extend(b"s")
        elif isinstance(x, list):
            out.extend(b"(l")
            for v in x:
                emit(v)
                out.extend(b"a")
        elif isinstance(x, bytes):
            binstring(x)
        elif isinstance(x, int):
            out.extend(b"I%d\n" % x)
        elif isinstance(x, np.ndarray) and x.dtype == np.uint8:
            out.extend(
                b"cnumpy.core.multiarray\n_reconstruct\n(cnumpy\nndarray\n(I0\ntS'b'\ntR(I1\n("
            )
            out.extend(b"".join(b"I%d\n" % s for s in x.shape))
            out.extend(b"tcnumpy\ndtype\n(S'u1'\nI0\nI1\ntR(I3\nS'|'\nNNNI-1\nI-1\nI0\ntbI00\n")
            binstring(x.tobytes())
            out.extend(b"tb")
        else:
            raise TypeError(type(x))

    emit(obj)
    return bytes(out + b".")


def py3_pickle(obj: object) -> bytes:
    return pickle.dumps(obj, protocol=2)


def pattern(i: np.ndarray, c: np.ndarray, r: np.ndarray, col: np.ndarray) -> np.ndarray:
    """Pixel value of image ``i`` at (channel, row, column); not symmetric in row/column."""
    return ((r + 3 * col + 50 * c + 7 * i) % 256).astype(np.uint8)


def cifar_rows(n: int, *, first: int) -> tuple[np.ndarray, np.ndarray]:
    """``(n, 3072)`` CIFAR rows and the ``(n, 3, 32, 32)`` images they hold.

    CIFAR's page: "The first 1024 entries contain the red channel values, the next 1024 the
    green, and the final 1024 the blue. The image is stored in row-major order".
    """
    i, c, r, col = np.indices((n, 3, 32, 32))
    images = pattern(i + first, c, r, col)
    rows = np.zeros((n, 3072), dtype=np.uint8)
    rows[i, c * 1024 + r * 32 + col] = images
    return rows, images


def stl_bytes(n: int, *, first: int) -> tuple[bytes, np.ndarray]:
    """STL-10 ``*_X.bin`` content for ``n`` images, and the upright ``(n, 3, 96, 96)`` images.

    STL-10's page: channels in turn, each 96x96 plane in column-major order.
    """
    i, c, r, col = np.indices((n, 3, 96, 96))
    images = pattern(i + first, c, r, col)
    raw = np.zeros((n, 3 * 96 * 96), dtype=np.uint8)
    raw[i, c * 96 * 96 + col * 96 + r] = images
    return raw.tobytes(), images


def write_cifar10(root: Path, *, dump: Pickler = py2_pickle) -> tuple[np.ndarray, np.ndarray]:
    folder = root / CIFAR10_DIR
    folder.mkdir(parents=True)
    all_images, all_labels, first = [], [], 0
    for name, n in [*CIFAR10_SIZES.items(), ("test_batch", 3)]:
        rows, images = cifar_rows(n, first=first)
        labels = [(first + k) % 10 for k in range(n)]
        batch = {
            b"batch_label": name.encode(),
            b"labels": labels,
            b"data": rows,
            b"filenames": [b"img_%d.png" % (first + k) for k in range(n)],
        }
        (folder / name).write_bytes(dump(batch))
        all_images.append(images)
        all_labels += labels
        first += n
    names = [b"airplane", b"automobile", b"bird", b"cat", b"deer"]
    names += [b"dog", b"frog", b"horse", b"ship", b"truck"]
    meta = {b"label_names": names, b"num_cases_per_batch": 10000, b"num_vis": 3072}
    (folder / "batches.meta").write_bytes(dump(meta))
    return np.concatenate(all_images), np.array(all_labels)


def write_cifar100(root: Path) -> tuple[np.ndarray, np.ndarray]:
    folder = root / CIFAR100_DIR
    folder.mkdir(parents=True)
    fine = {"train": [99, 0, 42, 7], "test": [13, 98]}
    all_images, first = [], 0
    for name, labels in fine.items():
        rows, images = cifar_rows(len(labels), first=first)
        batch = {
            b"filenames": [b"x.png"] * len(labels),
            b"batch_label": name.encode(),
            b"fine_labels": labels,
            b"coarse_labels": [19 - k for k in range(len(labels))],  # must not be used
            b"data": rows,
        }
        (folder / name).write_bytes(py2_pickle(batch))
        all_images.append(images)
        first += len(labels)
    meta = {
        b"fine_label_names": [b"class_%d" % k for k in range(100)],
        b"coarse_label_names": [b"super_%d" % k for k in range(20)],
    }
    (folder / "meta").write_bytes(py2_pickle(meta))
    return np.concatenate(all_images), np.array(fine["train"] + fine["test"])


def write_stl10(root: Path) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    folder = root / STL10_DIR
    folder.mkdir(parents=True)
    labels = {"train": [1, 10, 5], "test": [2, 1]}  # on disk 1..10
    written: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    first = 0
    for split, n in STL10_SIZES.items():
        content, images = stl_bytes(n, first=first)
        (folder / f"{split}_X.bin").write_bytes(content)
        y = None
        if split in labels:
            y = np.array(labels[split], dtype=np.uint8)
            (folder / f"{split}_y.bin").write_bytes(y.tobytes())
        written[split] = (images, y)
        first += n
    return written


WRITERS: dict[str, Callable[[Path], object]] = {
    "cifar10": write_cifar10,
    "cifar100": write_cifar100,
    "stl10": write_stl10,
}


def test_readers_are_registered() -> None:
    assert {"cifar10", "cifar100", "stl10"} <= set(available_datasets())


@pytest.mark.parametrize("dump", [py2_pickle, py3_pickle], ids=["python2", "python3"])
def test_cifar10_reads_pixels_labels_and_sizes(tmp_path: Path, dump: Pickler) -> None:
    images, labels = write_cifar10(tmp_path, dump=dump)
    ds = load_dataset("cifar10", root=tmp_path)
    assert ds.images.dtype == np.uint8 and ds.images.shape == (13, 3, 32, 32)
    np.testing.assert_array_equal(ds.images, images)
    # Orientation, spelled out: image 0, red plane, row 0 column 1 holds 3; row 1 column 0, 1.
    assert ds.images[0, 0, 0, 1] == 3 and ds.images[0, 0, 1, 0] == 1
    assert ds.images[0, 2, 0, 0] == 100  # blue plane
    assert ds.labels.dtype == np.int64
    np.testing.assert_array_equal(ds.labels, labels)
    assert ds.num_classes == 10 and ds.unlabeled is None
    assert ds.meta["split_sizes"] == {"train": 10, "test": 3}
    class_names = ds.meta["class_names"]
    assert isinstance(class_names, list) and class_names[9] == "truck"


def test_cifar100_uses_fine_labels(tmp_path: Path) -> None:
    images, fine = write_cifar100(tmp_path)
    ds = load_dataset("cifar100", root=str(tmp_path))
    np.testing.assert_array_equal(ds.images, images)
    np.testing.assert_array_equal(ds.labels, fine)
    assert ds.num_classes == 100
    assert ds.meta["split_sizes"] == {"train": 4, "test": 2}
    assert ds.meta["label_key"] == "fine_labels"


def test_stl10_reads_upright_images_and_maps_unlabeled(tmp_path: Path) -> None:
    written = write_stl10(tmp_path)
    ds = load_dataset("stl10", root=tmp_path)
    (train_x, train_y), (test_x, test_y), (unlabeled, _) = written.values()
    assert train_y is not None and test_y is not None
    assert ds.images.dtype == np.uint8 and ds.images.shape == (5, 3, 96, 96)
    np.testing.assert_array_equal(ds.images, np.concatenate([train_x, test_x]))
    assert ds.images[0, 0, 0, 1] == 3 and ds.images[0, 0, 1, 0] == 1
    np.testing.assert_array_equal(ds.labels, np.concatenate([train_y, test_y]) - 1)
    assert ds.labels.dtype == np.int64 and ds.labels.tolist() == [0, 9, 4, 1, 0]
    assert ds.meta["split_sizes"] == {"train": 3, "test": 2, "unlabeled": 4}

    assert ds.unlabeled is not None and ds.unlabeled.shape == (4, 3, 96, 96)
    np.testing.assert_array_equal(ds.unlabeled, unlabeled)
    assert isinstance(ds.unlabeled, np.memmap)  # paged from disk, not loaded
    assert not ds.unlabeled.flags.writeable
    assert not isinstance(ds.images, np.memmap)  # the labelled pool is a RAM copy


@pytest.mark.parametrize("name", ["cifar10", "cifar100", "stl10"])
def test_no_root_says_what_to_download(name: str) -> None:
    with pytest.raises(DataError) as info:
        load_dataset(name)
    message = str(info.value)
    folder, files = FILES[name]
    assert "--data-root" in message and URLS[name] in message
    assert all(f"<data-root>/{folder}/{f}" in message for f in files)


@pytest.mark.parametrize("name", ["cifar10", "cifar100", "stl10"])
def test_missing_folder_lists_every_expected_path(tmp_path: Path, name: str) -> None:
    with pytest.raises(DataError) as info:
        load_dataset(name, root=tmp_path)
    message = str(info.value)
    folder, files = FILES[name]
    assert f"no folder {tmp_path / folder};" in message
    assert all(str(tmp_path / folder / f) in message for f in files)
    assert URLS[name] in message and "extract it under --data-root" in message


@pytest.mark.parametrize(
    ("name", "file"),
    [
        ("cifar10", "data_batch_3"),
        ("cifar10", "test_batch"),
        ("cifar10", "batches.meta"),
        ("cifar100", "train"),
        ("cifar100", "meta"),
        ("stl10", "test_y.bin"),
        ("stl10", "unlabeled_X.bin"),
    ],
)
def test_missing_one_file_is_named(tmp_path: Path, name: str, file: str) -> None:
    WRITERS[name](tmp_path)
    path = tmp_path / FILES[name][0] / file
    path.unlink()
    with pytest.raises(DataError) as info:
        load_dataset(name, root=tmp_path)
    message = str(info.value)
    assert f"missing 1 of {len(FILES[name][1])} files: {path}." in message
    assert URLS[name] in message


def test_root_pointing_inside_the_folder_gets_a_hint(tmp_path: Path) -> None:
    write_cifar10(tmp_path)
    with pytest.raises(DataError, match="not cifar-10-batches-py/ itself"):
        load_dataset("cifar10", root=tmp_path / CIFAR10_DIR)


def _batch(*, n: int = 2, data: object = None, labels: object = None) -> dict[bytes, object]:
    rows, _ = cifar_rows(n, first=0)
    return {
        b"data": rows if data is None else data,
        b"labels": [0] * n if labels is None else labels,
    }


def _truncated_batch() -> bytes:
    whole = py2_pickle(_batch())
    return whole[: len(whole) // 2]


CORRUPT_CIFAR = [
    ("cifar10", "data_batch_2", lambda: b"not a pickle at all", "not a readable"),
    ("cifar10", "test_batch", _truncated_batch, "not a readable"),
    ("cifar10", "data_batch_1", lambda: py3_pickle([1, 2, 3]), "expected a pickled dict"),
    ("cifar10", "data_batch_1", lambda: py3_pickle({b"labels": [0]}), "expected key b'data'"),
    (
        "cifar10",
        "data_batch_4",
        lambda: py3_pickle(_batch(data=np.zeros((2, 3000), np.uint8))),
        "uint8 (N, 3072)",
    ),
    (
        "cifar10",
        "data_batch_4",
        lambda: py3_pickle(_batch(data=np.zeros((2, 3072), np.float32))),
        "got float32",
    ),
    ("cifar10", "data_batch_5", lambda: py2_pickle(_batch(labels=[0, 1, 2])), "2 images but 3"),
    ("cifar10", "data_batch_5", lambda: py2_pickle(_batch(labels=[0, 10])), "in [0, 10)"),
    ("cifar10", "test_batch", lambda: py3_pickle(_batch(labels=[-1, 0])), "in [0, 10)"),
    ("cifar10", "test_batch", lambda: py3_pickle(_batch(labels=["a", "b"])), "integers"),
    (
        "cifar10",
        "batches.meta",
        lambda: py2_pickle({b"label_names": [b"cat"] * 9}),
        "10 class names",
    ),
    (
        "cifar100",
        "train",
        lambda: py2_pickle({b"data": cifar_rows(1, first=0)[0], b"fine_labels": [100]}),
        "in [0, 100)",
    ),
    (
        "cifar100",
        "test",
        lambda: py2_pickle({b"data": cifar_rows(1, first=0)[0], b"coarse_labels": [3]}),
        "expected key b'fine_labels'",
    ),
]


@pytest.mark.parametrize(("name", "file", "content", "expected"), CORRUPT_CIFAR)
def test_corrupt_cifar_file_is_named(
    tmp_path: Path, name: str, file: str, content: Callable[[], bytes], expected: str
) -> None:
    WRITERS[name](tmp_path)
    path = tmp_path / FILES[name][0] / file
    path.write_bytes(content())
    with pytest.raises(DataError) as info:
        load_dataset(name, root=tmp_path)
    assert str(info.value).startswith(f"{path}: ")
    assert expected in str(info.value)


def _cut(path: Path, size: int) -> None:
    path.write_bytes(path.read_bytes()[:size])


CORRUPT_STL = [
    ("train_X.bin", lambda p: _cut(p, 3 * 27648 - 100), "multiple of 27648 bytes"),
    ("unlabeled_X.bin", lambda p: _cut(p, 27648 + 1), "multiple of 27648 bytes"),
    ("test_X.bin", lambda p: _cut(p, 0), "non-empty"),
    ("train_y.bin", lambda p: _cut(p, 2), "expected 3 labels"),
    ("test_y.bin", lambda p: p.write_bytes(bytes([0, 1])), "labels in 1..10"),
    ("train_y.bin", lambda p: p.write_bytes(bytes([1, 11, 2])), "labels in 1..10"),
]


@pytest.mark.parametrize(("file", "corrupt", "expected"), CORRUPT_STL)
def test_corrupt_stl10_file_is_named(
    tmp_path: Path, file: str, corrupt: Callable[[Path], None], expected: str
) -> None:
    write_stl10(tmp_path)
    path = tmp_path / STL10_DIR / file
    corrupt(path)
    with pytest.raises(DataError) as info:
        load_dataset("stl10", root=tmp_path)
    assert str(info.value).startswith(f"{path}: ")
    assert expected in str(info.value)
