from __future__ import annotations

import importlib
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from alm_opacus.ssl import SSLConfig, create_augmentation, create_encoder, nt_xent, pretrain

pretrain_module = importlib.import_module("alm_opacus.ssl.pretrain")


def nt_xent_loop(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> float:
    """Direct transcription of SimCLR (Chen et al. 2020) Eq. 1, averaged over all 2N anchors."""
    z = [F.normalize(v, dim=0) for v in torch.cat([z1, z2])]
    n2 = len(z)
    half = n2 // 2
    total = 0.0
    for i in range(n2):
        j = (i + half) % n2
        num = math.exp(float(z[i] @ z[j]) / temperature)
        den = sum(math.exp(float(z[i] @ z[k]) / temperature) for k in range(n2) if k != i)
        total += -math.log(num / den)
    return total / n2


@pytest.mark.parametrize("n,d,temperature", [(2, 3, 0.5), (5, 8, 0.1), (16, 4, 1.0)])
def test_nt_xent_matches_loop_reference(n: int, d: int, temperature: float) -> None:
    g = torch.Generator().manual_seed(n * 100 + d)
    z1 = torch.randn(n, d, generator=g, dtype=torch.float64)
    z2 = torch.randn(n, d, generator=g, dtype=torch.float64)
    got = float(nt_xent(z1, z2, temperature=temperature))
    assert got == pytest.approx(nt_xent_loop(z1, z2, temperature), rel=1e-10)


def test_nt_xent_is_scale_invariant_and_low_for_identical_views() -> None:
    g = torch.Generator().manual_seed(0)
    z = torch.randn(32, 16, generator=g)
    # Identical views: the positive is the most similar, so the loss is far below log(2N - 1).
    assert float(nt_xent(z, z, temperature=0.1)) < 0.5 * math.log(63)
    assert float(nt_xent(3 * z, z, temperature=0.5)) == pytest.approx(
        float(nt_xent(z, z, temperature=0.5)), rel=1e-5
    )


@pytest.mark.parametrize(
    "bad",
    [
        dict(z1=torch.zeros(1, 3), z2=torch.zeros(1, 3), temperature=0.5),
        dict(z1=torch.zeros(4, 3), z2=torch.zeros(4, 2), temperature=0.5),
        dict(z1=torch.zeros(4, 3), z2=torch.zeros(4, 3), temperature=0.0),
    ],
)
def test_nt_xent_rejects_bad_input(bad: dict) -> None:
    with pytest.raises(ValueError):
        nt_xent(bad["z1"], bad["z2"], temperature=bad["temperature"])


@pytest.mark.parametrize(
    "name,shape,out_dim",
    [("small-cnn", (2, 1, 8, 8), 128), ("resnet18", (2, 3, 32, 32), 512),
     ("resnet18", (2, 3, 96, 96), 512)],
)  # fmt: skip
def test_encoders_give_fixed_width_features(name: str, shape: tuple, out_dim: int) -> None:
    enc = create_encoder(name, in_channels=shape[1]).eval()
    with torch.no_grad():
        assert enc(torch.rand(*shape)).shape == (shape[0], out_dim)


def test_unknown_encoder_lists_registered() -> None:
    with pytest.raises(ValueError, match="small-cnn"):
        create_encoder("nosuch", in_channels=1)


@pytest.mark.parametrize("name,shape", [("digits", (4, 1, 8, 8)), ("cifar", (4, 3, 32, 32)),
                                        ("stl10", (2, 3, 96, 96))])  # fmt: skip
def test_augmentations_keep_shape_and_change_views(name: str, shape: tuple) -> None:
    torch.manual_seed(0)
    x = torch.rand(*shape)
    aug = create_augmentation(name)
    a, b = aug(x), aug(x)
    assert a.shape == x.shape
    assert not torch.allclose(a, b)


def _tiny(images: np.ndarray) -> SSLConfig:
    return SSLConfig(epochs=3, batch_size=64)


def test_pretrain_caches_and_checks_key(digits, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    images = digits.images[:128]
    cfg = _tiny(images)
    enc1 = pretrain(images, config=cfg, key="k1", cache_dir=tmp_path, progress=False)
    path = tmp_path / "encoder-k1.pt"
    assert path.exists()
    stamp = path.stat().st_mtime_ns
    enc2 = pretrain(images, config=cfg, key="k1", cache_dir=tmp_path, progress=False)
    assert path.stat().st_mtime_ns == stamp  # reused, not retrained
    for a, b in zip(enc1.state_dict().values(), enc2.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    # A checkpoint written for another config is refused with a message naming both keys.
    (tmp_path / "encoder-k2.pt").write_bytes(path.read_bytes())
    with pytest.raises(ValueError, match=r"'k1'.*'k2'"):
        pretrain(images, config=cfg, key="k2", cache_dir=tmp_path, progress=False)
    (tmp_path / "encoder-k3.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        pretrain(images, config=cfg, key="k3", cache_dir=tmp_path, progress=False)


def test_pretrain_resumes_after_interrupt_to_the_same_weights(digits, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    images = digits.images[:128]
    cfg = _tiny(images)
    clean = pretrain(images, config=cfg, key="a", cache_dir=tmp_path / "a", progress=False,
                     checkpoint_every=1)  # fmt: skip
    calls = {"n": 0}
    real = pretrain_module.nt_xent

    def flaky(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 5:  # two batches per epoch: dies inside epoch 3
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(pretrain_module, "nt_xent", flaky)
    with pytest.raises(KeyboardInterrupt):
        pretrain(images, config=cfg, key="a", cache_dir=tmp_path / "b", progress=False,
                 checkpoint_every=1)  # fmt: skip
    assert (tmp_path / "b" / "encoder-a.partial.pt").exists()
    assert not (tmp_path / "b" / "encoder-a.pt").exists()
    monkeypatch.setattr(pretrain_module, "nt_xent", real)
    resumed = pretrain(images, config=cfg, key="a", cache_dir=tmp_path / "b", progress=False,
                       checkpoint_every=1)  # fmt: skip
    assert not (tmp_path / "b" / "encoder-a.partial.pt").exists()
    for a, b in zip(clean.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.allclose(a.float(), b.float(), atol=1e-6)
