"""``features:PATH``: the features a user's own encoder made, memory-mapped from one file.

The file is an **uncompressed** ``.npz`` (what ``np.savez`` writes; not ``np.savez_compressed``)
holding:

* ``x``: ``(n, d)`` float32 or float64, finite, no all-zero row;
* ``y``: ``(n,)`` integer labels in ``[0, num_classes)``, every class present;
* ``role`` (optional): ``(n,)`` ASCII strings, each ``member``, ``non-member``, ``attacker`` or
  ``public`` (:data:`~alm_opacus.data.split.ROLES`): the split, row by row. Without it the
  split is drawn, class-stratified, in the proportions of :func:`default_split`. With it,
  as many non-members as members and an attacker's pool of at least twice the members;
* ``num_classes`` (optional): a scalar integer, at most ``n`` (default ``max(y) + 1``).

No other field (:data:`FIELDS`): a misspelt ``role`` would leave the split to chance. Each
``.npy`` header is checked against the bytes the file holds before anything is mapped.

An uncompressed ``.npz`` is a zip archive whose members are ``.npy`` files stored byte for
byte, so ``x`` is mapped in place (``np.memmap`` at the member's offset): a 50,000 x 2,048
float32 file is read from the page cache that every process opening it shares, never loaded
whole or copied per worker. (``np.load(path, mmap_mode=...)`` cannot map inside a zip; it reads
the member into memory.) Rows are scaled to unit L2 norm, as the SimCLR features of the image
datasets are, which the methods' clip radii assume; a file whose rows have unit norm already
(within :data:`UNIT_NORM_TOLERANCE`) is used as mapped, without a copy.

A bad file is a one-line :class:`~alm_opacus.data.registry.DataError` naming the file and the
field. See docs/own_features.md.
"""

from __future__ import annotations

import difflib
import functools
import math
import mmap
import struct
import zipfile
from pathlib import Path

import numpy as np

from alm_opacus.data.registry import DataError, Dataset, register_dataset_family
from alm_opacus.data.spec import DatasetSpec, DPSGDSchedule, register_dataset_spec
from alm_opacus.data.split import ROLES, SplitSizes, role_sizes
from alm_opacus.heads import HeadConfig

__all__ = [
    "FAMILY",
    "FEATURES_EPSILONS",
    "FEATURES_HEAD",
    "FIELDS",
    "UNIT_NORM_TOLERANCE",
    "default_split",
    "features_spec",
    "read_features",
    "release_pages",
]

#: The dataset family: ``--dataset features:PATH``.
FAMILY = "features"
#: Rows whose L2 norms all lie within this of 1 are taken as unit-norm (float32 rounding of a
#: normalised row is ~1e-7) and used without a copy; any other file is normalised in memory.
UNIT_NORM_TOLERANCE = 1e-5
#: The grid of the embedded datasets: from strong privacy to where post-training noise stops
#: costing utility (docs/recipes.md).
FEATURES_EPSILONS: tuple[float, ...] = (0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0)
#: The default head: mnist's measured recipe (docs/recipes.md), a converged L2-regularised
#: linear head; choose your own with ``--l2`` / ``--head`` (or scripts/choose_recipe.py).
FEATURES_HEAD = HeadConfig(l2=3e-4, solver="newton")
_ROWS_PER_CHUNK = 8192  # rows checked at a time: bounded memory on a mapped file
_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")  # a zip local file header (APPNOTE 4.3.7)
_LOCAL_SIGNATURE = 0x04034B50
#: The fields a features file may hold (module docstring); any other member is refused.
FIELDS = ("x", "y", "role", "num_classes")


def default_split(rows: int) -> SplitSizes:
    """The split of a file without ``role``: mnist's proportions, 1 : 1 : 2 : 1 (members,
    non-members, an attacker's pool twice the members so each shadow half matches the victim's
    size, and the public rest)."""
    fifth = rows // 5
    return SplitSizes(members=fifth, nonmembers=fifth, attacker=2 * fifth, public=None)


def _fail(path: Path, field: str, problem: str) -> DataError:
    return DataError(f"features file {path}: field {field!r}: {problem}")


def _fields(path: Path, archive: zipfile.ZipFile) -> None:
    """Refuse members that are not fields of a features file, by name.

    A misspelt ``role`` (``roles``) would otherwise leave the split to chance, which can put
    the rows that built the features among the members.

    Raises:
        DataError: naming the unknown member (with the likely field it misspells) and the
            expected ones, or a member stored twice.
    """
    names = archive.namelist()
    expected = {f"{f}.npy" for f in FIELDS}
    for name in names:
        if names.count(name) > 1:
            raise _fail(
                path,
                name.removesuffix(".npy"),
                "is stored twice in the archive; expected each field once (write the file with "
                "np.savez)",
            )
        if name in expected:
            continue
        field = name.removesuffix(".npy")
        close = difflib.get_close_matches(field, FIELDS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise _fail(
            path,
            field,
            f"is not a field of a features file: expected x, y and optionally role, "
            f"num_classes{hint}",
        )


def _member_data(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> tuple[int, int]:
    """``(header_offset, end)``: where the member's local header starts, and the offset its
    data may not pass, read from the file itself.

    The central directory's sizes are not trusted: a member's data ends at the next member's
    local header (or the central directory), and never beyond the end of the file.
    """
    size = path.stat().st_size
    stored = getattr(archive, "start_dir", size)  # where the central directory starts
    later = [i.header_offset for i in archive.infolist() if i.header_offset > info.header_offset]
    end = min([size, stored, *later])
    if info.header_offset < 0 or info.header_offset + _LOCAL_HEADER.size > end:
        raise _fail(
            path,
            info.filename.removesuffix(".npy"),
            "has a corrupt zip header; write the file with np.savez",
        )
    return info.header_offset, end


def _member(path: Path, archive: zipfile.ZipFile, field: str) -> np.ndarray | None:
    """The ``.npy`` member ``field`` of the archive, memory-mapped in place (``None`` if absent).

    The ``.npy`` header is read and checked before anything is mapped or allocated: its shape
    (non-negative), its dtype (no objects, no empty elements) and its byte count (exact
    integers, so a forged shape cannot overflow), against the bytes the file really holds.

    Raises:
        DataError: for a compressed member, a corrupt or forged header, an object array or a
            truncated one.
    """
    try:
        info = archive.getinfo(f"{field}.npy")
    except KeyError:
        return None
    if info.compress_type != zipfile.ZIP_STORED:
        raise _fail(
            path,
            field,
            "is compressed (np.savez_compressed), so it cannot be "
            "memory-mapped; write the file with np.savez",
        )
    header_offset, end = _member_data(path, archive, info)
    with path.open("rb") as handle:
        handle.seek(header_offset)
        header = handle.read(_LOCAL_HEADER.size)
        if len(header) != _LOCAL_HEADER.size or _LOCAL_HEADER.unpack(header)[0] != _LOCAL_SIGNATURE:
            raise _fail(path, field, "has a corrupt zip header; write the file with np.savez")
        name_length, extra_length = _LOCAL_HEADER.unpack(header)[-2:]
        start = header_offset + _LOCAL_HEADER.size + name_length + extra_length
        end = min(end, start + max(info.file_size, 0))  # neither the directory nor the file
        handle.seek(start)
        try:
            version = np.lib.format.read_magic(handle)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle)
            else:
                raise ValueError(f"npy format version {version} (expected 1.0 or 2.0)")
        except Exception as exc:  # numpy's parser of a hostile header raises many types
            reason = " ".join(str(exc).split())[:200]  # numpy's text may span lines
            raise _fail(path, field, f"is not a readable .npy array ({reason})") from exc
        offset = handle.tell()
    if any(d < 0 for d in shape):
        raise _fail(path, field, f"has shape {shape} in its header; expected dimensions >= 0")
    if dtype.hasobject:
        raise _fail(path, field, "holds Python objects; expected numbers or strings")
    if dtype.itemsize == 0:
        raise _fail(
            path, field, f"has dtype {dtype} of 0-byte elements; expected numbers or strings"
        )
    nbytes = math.prod(shape) * dtype.itemsize  # exact: Python integers do not overflow
    if offset + nbytes > end:
        raise _fail(
            path,
            field,
            f"is truncated or forged: its header (shape {shape}, dtype {dtype}) needs {nbytes} "
            f"bytes of data, the archive holds {max(end - offset, 0)}",
        )
    if nbytes == 0:
        return np.zeros(shape, dtype=dtype)
    # copy-on-write: writable for torch.from_numpy, pages shared until (never) written
    return np.memmap(
        path, dtype=dtype, mode="c", offset=offset, shape=shape, order="F" if fortran else "C"
    )


def release_pages(x: np.ndarray | None) -> None:
    """Let the kernel take back the resident pages of a file mapped by :func:`read_features`.

    The harness copies each split part out of the mapping once, then reads only the copies;
    the pages it touched would otherwise stay in the process's resident set (a 5*10^4-member
    file of d = 512 is 1 GB of float64) while every cell runs. They are clean copies of the
    file (nothing writes to the mapping), so the next access reads them again from the page
    cache. Arrays that are not such a mapping are left alone.
    """
    mapping = getattr(x, "_mmap", None) if isinstance(x, np.memmap) else None
    if isinstance(mapping, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
        mapping.madvise(mmap.MADV_DONTNEED)


def _check_x(path: Path, x: np.ndarray | None) -> np.ndarray:
    """``x`` with unit-norm rows: the mapped array itself when its rows have unit norm."""
    if x is None:
        raise _fail(path, "x", "is missing; expected an (n, d) float array")
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise _fail(path, "x", f"has shape {x.shape}; expected (n, d) with n, d >= 1")
    if x.dtype not in (np.float32, np.float64):
        raise _fail(path, "x", f"has dtype {x.dtype}; expected float32 or float64")
    norms = np.empty(x.shape[0])
    for start in range(0, x.shape[0], _ROWS_PER_CHUNK):
        chunk = np.asarray(x[start : start + _ROWS_PER_CHUNK], dtype=np.float64)
        bad = ~np.isfinite(chunk)
        if bad.any():
            row, col = (int(v[0]) for v in np.nonzero(bad))
            raise _fail(
                path,
                "x",
                f"row {start + row}, column {col} is {chunk[row, col]}; expected finite numbers",
            )
        norms[start : start + len(chunk)] = np.sqrt(np.einsum("ij,ij->i", chunk, chunk))
    if (norms == 0).any():
        raise _fail(
            path,
            "x",
            f"row {int(np.flatnonzero(norms == 0)[0])} is all zeros; every "
            "row needs a direction (rows are scaled to unit norm)",
        )
    if np.abs(norms - 1.0).max() <= UNIT_NORM_TOLERANCE:
        return x
    return (x / norms[:, None].astype(x.dtype)).astype(x.dtype, copy=False)


def _check_y(path: Path, y: np.ndarray | None, n: int, num_classes: int | None) -> np.ndarray:
    if y is None:
        raise _fail(path, "y", f"is missing; expected ({n},) integer labels")
    if y.shape != (n,):
        raise _fail(path, "y", f"has shape {y.shape}; expected ({n},), one label per row of x")
    if not np.issubdtype(y.dtype, np.integer):
        raise _fail(path, "y", f"has dtype {y.dtype}; expected integer labels")
    labels = np.asarray(y, dtype=np.int64)
    if y.dtype == np.uint64 and (np.asarray(y) > np.iinfo(np.int64).max).any():
        raise _fail(path, "y", "holds labels above 2^63 - 1; expected 0 ... num_classes - 1")
    high = int(labels.max()) + 1 if num_classes is None else num_classes
    if labels.min() >= 0 and high > n:  # bincount would allocate `high` counts
        field, where = (
            ("y", f"labels up to {high - 1} make {high} classes,")
            if num_classes is None
            else ("num_classes", f"is {high},")
        )
        raise _fail(
            path,
            field,
            f"{where} more than the {n} rows; expected at most {n} "
            "classes (every class needs a row)",
        )
    if labels.min() < 0 or labels.max() >= high:
        raise _fail(
            path,
            "y",
            f"holds labels from {labels.min()} to {labels.max()}; expected "
            f"0 ... {high - 1} (num_classes={high})",
        )
    counts = np.bincount(labels, minlength=high)
    if (counts == 0).any():
        raise _fail(
            path,
            "y",
            f"class {int(np.flatnonzero(counts == 0)[0])} has no row; "
            f"expected every class of 0 ... {high - 1}",
        )
    if high < 2:
        raise _fail(path, "y", "holds one class; expected at least 2")
    return labels


def _check_role(path: Path, role: np.ndarray | None, n: int) -> np.ndarray | None:
    if role is None:
        return None
    if role.shape != (n,):
        raise _fail(path, "role", f"has shape {role.shape}; expected ({n},), one per row of x")
    if role.dtype.kind not in "US":
        raise _fail(
            path, "role", f"has dtype {role.dtype}; expected strings, one of {', '.join(ROLES)}"
        )
    if role.dtype.kind == "S":
        raw = np.asarray(role).view(np.uint8).reshape(n, role.dtype.itemsize)
        high = np.flatnonzero((raw >= 0x80).any(axis=1))
        if len(high):  # np.char.decode would raise, naming neither the row nor the file
            raise _fail(
                path,
                "role",
                f"row {int(high[0])} holds non-ASCII bytes "
                f"{bytes(raw[high[0]]).rstrip(bytes(1))!r}; expected one of "
                f"{', '.join(ROLES)}",
            )
    text = np.char.decode(role, "ascii") if role.dtype.kind == "S" else np.asarray(role)
    values, codes = np.unique(text, return_inverse=True)
    unknown = [str(v) for v in values if v not in ROLES]
    if unknown:
        raise _fail(path, "role", f"holds {unknown[0]!r}; expected one of {', '.join(ROLES)}")
    index = np.array([ROLES.index(str(v)) for v in values], dtype=np.int8)[codes]
    for k, name in enumerate(ROLES):
        if not (index == k).any():
            raise _fail(path, "role", f"leaves role {name!r} empty; every role needs a row")
    _check_role_counts(path, role_sizes(index))
    return index


def _check_role_counts(path: Path, sizes: SplitSizes) -> None:
    """The proportions the harness needs, which a role column fixes (no ``--split``).

    Members and non-members are the balanced evaluation set the attacks score; the attacker's
    pool is split into halves that each train a shadow head on the members' count
    (docs/own_features.md), so it needs at least twice the members.

    Raises:
        DataError: naming both counts.
    """
    members, nonmembers, attacker = sizes.members, sizes.nonmembers, sizes.attacker
    if nonmembers != members:
        raise _fail(
            path,
            "role",
            f"has {members} 'member' rows but {nonmembers} 'non-member' "
            "rows; expected as many of each (the attacks score a balanced "
            "evaluation set)",
        )
    if attacker < 2 * members:
        raise _fail(
            path,
            "role",
            f"has {attacker} 'attacker' rows for {members} 'member' "
            f"rows; expected at least {2 * members} (twice the members: each half of "
            "the pool trains a shadow head on as many rows as the victim)",
        )


def _check_num_classes(path: Path, value: np.ndarray | None) -> int | None:
    if value is None:
        return None
    if value.shape != () or not np.issubdtype(value.dtype, np.integer) or int(value) < 2:
        raise _fail(path, "num_classes", f"is {np.asarray(value)!r}; expected one integer >= 2")
    return int(value)


@functools.lru_cache(maxsize=8)
def _read(path: Path, mtime_ns: int, size: int) -> Dataset:
    """Read and check the file (memoised on its path, modification time and size)."""
    del mtime_ns, size  # the cache key: a rewritten file is read again
    try:
        with zipfile.ZipFile(path) as archive:
            _fields(path, archive)
            fields = {f: _member(path, archive, f) for f in FIELDS}
    except (zipfile.BadZipFile, OSError) as exc:
        raise DataError(
            f"features file {path}: not a readable .npz ({exc}); expected "
            "np.savez(path, x=..., y=...)"
        ) from exc
    x = _check_x(path, fields["x"])
    num_classes = _check_num_classes(path, fields["num_classes"])
    labels = _check_y(path, fields["y"], x.shape[0], num_classes)
    roles = _check_role(path, fields["role"], x.shape[0])
    return Dataset(
        name=f"{FAMILY}:{path}",
        images=None,
        features=x,
        labels=labels,
        num_classes=int(labels.max()) + 1 if num_classes is None else num_classes,
        roles=roles,
        meta={
            "source": str(path),
            "rows": x.shape[0],
            "dim": x.shape[1],
            "mapped": isinstance(x, np.memmap),
        },
    )


def read_features(path: str | Path) -> Dataset:
    """Read and check a features file (module docstring).

    Args:
        path: the ``.npz`` file.

    Returns:
        A :class:`~alm_opacus.data.registry.Dataset` with ``features`` (mapped when its rows
        have unit norm), ``labels``, ``num_classes`` and ``roles`` (``None`` without a role
        column); ``images`` is ``None``.

    Raises:
        DataError: naming the file and the field: a missing file, a compressed or corrupt
            archive, a forged ``.npy`` header, an unknown field, a missing field, wrong shapes
            or dtypes, non-finite or all-zero rows, labels out of range, a class without rows,
            more classes than rows, an unknown role, an empty one or role counts the harness
            cannot use.
    """
    file = Path(path)
    if not file.is_file():
        raise DataError(
            f"features file {file}: not found; expected an .npz written by "
            "np.savez(path, x=..., y=...)"
        )
    stat = file.stat()
    return _read(file, stat.st_mtime_ns, stat.st_size)


def features_spec(name: str) -> DatasetSpec:
    """The spec of ``features:PATH``: the file's split (its roles, or :func:`default_split`),
    no SimCLR recipe, :data:`FEATURES_HEAD`, :data:`FEATURES_EPSILONS`, and DP-SGD for 20
    epochs at an expected batch of a quarter of the members, at most 256 (mnist's 250 of
    1,000; CIFAR's 256).

    Raises:
        DataError: for a bad file (:func:`read_features`), or one too small to split.
    """
    prefix, sep, argument = name.partition(":")
    if prefix != FAMILY or not sep or not argument:
        raise DataError(f"dataset {name!r}: expected {FAMILY}:PATH")
    path = Path(argument)
    dataset = read_features(path)
    rows = len(dataset.labels)
    if dataset.roles is not None:
        split = role_sizes(dataset.roles)
    elif rows < 5:
        raise _fail(path, "x", f"has {rows} rows; the default split needs at least 5")
    else:
        split = default_split(rows)
    return DatasetSpec(
        name=name,
        loader=lambda *, root=None: read_features(path),
        split=split,
        ssl=None,
        dpsgd=DPSGDSchedule(epochs=20, batch_size=min(256, max(1, split.members // 4))),
        epsilons=FEATURES_EPSILONS,
        needs_root=False,
        head=FEATURES_HEAD,
        description=f"{rows} rows of {dataset.meta['dim']}-d features from {path}",
    )


@register_dataset_family(FAMILY)
def _resolve(name: str) -> None:
    register_dataset_spec(features_spec(name), force=True)
