"""``features:PATH``: a user's own features, mapped from an uncompressed .npz, and its errors."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from alm_opacus.data import DataError, dataset_spec, load_dataset
from alm_opacus.data.features import UNIT_NORM_TOLERANCE, default_split, read_features
from alm_opacus.data.split import ROLES, SplitSizes, make_split


def _mixture(rows: int, dim: int = 6, classes: int = 3, seed: int = 0):  # type: ignore[no-untyped-def]
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
    # fortran order, float64, a field the harness does not know: the bytes are where the
    # zip's local header says, whatever else the archive holds
    x, y = _mixture(40)
    x = np.asfortranarray(x.astype(np.float64) / np.linalg.norm(x, axis=1, keepdims=True))
    path = _write(tmp_path / "f.npz", notes=np.arange(7), x=x, y=y)
    got = read_features(path).features
    assert isinstance(got, np.memmap) and got.dtype == np.float64
    np.testing.assert_array_equal(np.asarray(got), x)
    with zipfile.ZipFile(path) as archive:  # an independent read of the same member
        np.testing.assert_array_equal(np.load(archive.open("x.npy")), np.asarray(got))


def test_roles_fix_the_split(tmp_path: Path) -> None:
    x, y = _mixture(60)
    role = np.array([ROLES[i % 4] for i in range(60)])
    path = _write(tmp_path / "roles.npz", x=x, y=y, role=role)
    dataset = load_dataset(f"features:{path}")
    spec = dataset_spec(f"features:{path}")
    assert spec.split == SplitSizes(members=15, nonmembers=15, attacker=15, public=15)
    split = make_split(dataset, sizes=spec.split, seed=4)
    for k, part in enumerate(("members", "nonmembers", "attacker", "public")):
        np.testing.assert_array_equal(getattr(split, part), np.arange(k, 60, 4))
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
    role = np.array([ROLES[i % 4] for i in range(60)])
    no_public = np.where(role == "public", "attacker", role)
    class_role = role.copy()
    class_role[(y == 1) & (role == "public")] = "attacker"
    cases = [
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
        ("role-value", {"x": x, "y": y, "role": np.where(role == "public", "pub", role)},
         "role", "holds 'pub'; expected one of member"),
        ("role-empty", {"x": x, "y": y, "role": no_public}, "role", "leaves role 'public' empty"),
        ("role-class", {"x": x, "y": y, "role": class_role}, "role",
         "no row of class 1 has role 'public'"),
        ("role-int", {"x": x, "y": y, "role": np.arange(60) % 4}, "role", "expected strings"),
    ]  # fmt: skip
    out = []
    for name, fields, field, message in cases:
        out.append((_write(tmp / f"{name}.npz", **fields), field, message))
    compressed = tmp / "compressed.npz"
    np.savez_compressed(compressed, x=x, y=y)
    out.append((compressed, "x", r"is compressed \(np.savez_compressed\).*np.savez"))
    return out


@pytest.mark.parametrize("case", range(20))
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
    from alm_opacus.run.harness import load_plugins, prepare

    load_plugins()
    config = RunConfig(dataset=f"features:{good}", out=str(tmp_path / "run"), progress=False)
    data = prepare(config)
    assert data.images is None and data.encoder is None
    assert data.features.shape == (60, 6) and data.features.dtype == torch.float32
    assert config.to_dict()["ssl"] is None
    with pytest.raises(ValueError, match=r"method 'dpsgd-full' trains on images.*features only"):
        RunConfig(dataset=f"features:{good}", methods=("dpsgd-full",))
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
