"""docs/datasets.md as a plugin author reads it: the generated table, the examples (run as
written, and the same in docs/api.md) and the ``alm_opacus.datasets`` entry point group."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from alm_opacus.data import DataError, available_datasets, dataset_spec
from alm_opacus.data import registry as data_registry
from alm_opacus.registry import Registry
from docblocks import find_blocks

ROOT = Path(__file__).resolve().parents[2]
DATASETS, API = ROOT / "docs" / "datasets.md", ROOT / "docs" / "api.md"


def _block(doc: Path, first_line: str) -> str:
    for block in re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S):
        if block.startswith(first_line):
            return block
    raise AssertionError(f"{doc.name} has no example starting {first_line!r}")


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def isolated() -> Iterator[None]:
    """Registrations made by the examples (and plugins loaded) vanish after the test."""
    with Registry.isolated(reload=[data_registry.PLUGIN_GROUP]):
        yield


def test_the_table_is_generated_from_the_specs() -> None:
    (found,) = [b for b in find_blocks(DATASETS) if b.name == "datasets-table"]
    block = found.body
    assert block.strip() == _script("dataset_table").table().strip(), (
        "docs/datasets.md's table is stale: run scripts/dataset_table.py --write"
    )
    assert "0.1, 1, 10, 100, 1000, 10000" in block  # digits' and mnist's grid, not 0.1 ... 10


def test_the_dataset_example_is_the_same_in_both_docs() -> None:
    first = "# my_package/four_digits.py"
    assert _block(DATASETS, first) == _block(API, first)
    for doc in (DATASETS, API):
        assert '[project.entry-points."alm_opacus.datasets"]' in doc.read_text()
        assert 'entry-points."alm_opacus.methods"]\nfour-digits' not in doc.read_text()


@pytest.mark.usefixtures("isolated")
def test_the_encoder_and_augmentation_example_pretrains(tmp_path: Path) -> None:
    import torch

    from alm_opacus.ssl import SSLConfig, create_augmentation, create_encoder, pretrain

    exec(_block(DATASETS, "# my_package/tiny_ssl.py"), {"__name__": "tiny_ssl"})
    encoder = create_encoder("tiny", in_channels=1)
    assert encoder(torch.rand(3, 1, 8, 8)).shape == (3, encoder.out_dim)
    assert create_augmentation("shift")(torch.rand(2, 1, 8, 8)).shape == (2, 1, 8, 8)
    images = np.random.default_rng(0).random((64, 1, 8, 8), dtype=np.float32)
    config = SSLConfig(encoder="tiny", augmentation="shift", epochs=1, batch_size=32)
    trained = pretrain(images, config=config, key="tiny", cache_dir=tmp_path, progress=False)
    assert trained(torch.from_numpy(images[:4])).shape == (4, 16)


@pytest.mark.usefixtures("isolated")
def test_a_plugin_registers_through_its_entry_point_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "my_package"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "four_digits.py").write_text(_block(DATASETS, "# my_package/four_digits.py"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_package", raising=False)
    monkeypatch.delitem(sys.modules, "my_package.four_digits", raising=False)
    entry = importlib.metadata.EntryPoint(
        name="four-digits", value="my_package.four_digits", group=data_registry.PLUGIN_GROUP
    )

    def entry_points(*, group: str) -> list[importlib.metadata.EntryPoint]:
        return [entry] if group == data_registry.PLUGIN_GROUP else []

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    assert "four-digits" in available_datasets()  # the group is loaded on first look-up
    spec = dataset_spec("four-digits")
    assert spec.head.solver == "newton" and spec.loader(root=None).num_classes == 4


@pytest.mark.usefixtures("isolated")
def test_a_broken_plugin_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = importlib.metadata.EntryPoint(
        name="broken", value="no_such_module_at_all", group=data_registry.PLUGIN_GROUP
    )
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda *, group: [entry])
    with pytest.raises(DataError, match=r"dataset plugin 'broken' \(no_such_module_at_all\)"):
        available_datasets()
