from __future__ import annotations

import importlib
import math
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from alm_opacus._hashing import code_digest
from alm_opacus.io import StaleCacheWarning, atomic_torch_save, write_cache
from alm_opacus.ssl import (
    SSLConfig,
    available_augmentations,
    create_augmentation,
    create_encoder,
    extract_features,
    nt_xent,
    pretrain,
)

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
    [
        ("small-cnn", (2, 1, 8, 8), 128),
        ("mnist-cnn", (2, 1, 28, 28), 576),
        ("resnet18", (2, 3, 32, 32), 512),
        ("resnet18", (2, 3, 96, 96), 512),
    ],
)
def test_encoders_give_fixed_width_features(name: str, shape: tuple, out_dim: int) -> None:
    enc = create_encoder(name, in_channels=shape[1]).eval()
    with torch.no_grad():
        assert enc(torch.rand(*shape)).shape == (shape[0], out_dim)


def test_unknown_encoder_lists_registered() -> None:
    with pytest.raises(ValueError, match="small-cnn"):
        create_encoder("nosuch", in_channels=1)


@pytest.mark.parametrize(
    "name,shape",
    [
        ("digits", (4, 1, 8, 8)),
        ("mnist", (4, 1, 28, 28)),
        ("cifar", (4, 3, 32, 32)),
        ("stl10", (2, 3, 96, 96)),
    ],
)
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
    # A checkpoint written for another config, or garbage, is never used: it is retrained.
    (tmp_path / "encoder-k2.pt").write_bytes(path.read_bytes())
    with pytest.warns(StaleCacheWarning, match="encoder-k2.pt: is a cache for other inputs"):
        pretrain(images, config=cfg, key="k2", cache_dir=tmp_path, progress=False)
    assert torch.load(tmp_path / "encoder-k2.pt", weights_only=True)["key"] == "k2"
    (tmp_path / "encoder-k3.pt").write_bytes(b"not a checkpoint")
    with pytest.warns(StaleCacheWarning, match="encoder-k3.pt: not a readable cache file"):
        pretrain(images, config=cfg, key="k3", cache_dir=tmp_path, progress=False)
    # An encoder altered after it was written (its digest kept) is retrained too.
    record = torch.load(path, weights_only=True)
    first = next(iter(record["payload"]["state_dict"]))
    record["payload"]["state_dict"][first] += 1
    atomic_torch_save(record, path)
    with pytest.warns(StaleCacheWarning, match="does not match its content digest"):
        enc3 = pretrain(images, config=cfg, key="k1", cache_dir=tmp_path, progress=False)
    for a, b in zip(enc1.state_dict().values(), enc3.state_dict().values(), strict=True):
        assert torch.allclose(a.float(), b.float(), atol=1e-6)


def test_pretrain_resumes_after_interrupt_to_the_same_weights(digits, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    images = digits.images[:128]
    cfg = _tiny(images)
    clean = pretrain(
        images, config=cfg, key="a", cache_dir=tmp_path / "a", progress=False, checkpoint_every=1
    )
    calls = {"n": 0}
    real = pretrain_module.nt_xent

    def flaky(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 5:  # two batches per epoch: dies inside epoch 3
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(pretrain_module, "nt_xent", flaky)
    with pytest.raises(KeyboardInterrupt):
        pretrain(
            images,
            config=cfg,
            key="a",
            cache_dir=tmp_path / "b",
            progress=False,
            checkpoint_every=1,
        )
    assert (tmp_path / "b" / "encoder-a.partial.pt").exists()
    assert not (tmp_path / "b" / "encoder-a.pt").exists()
    monkeypatch.setattr(pretrain_module, "nt_xent", real)
    resumed = pretrain(
        images, config=cfg, key="a", cache_dir=tmp_path / "b", progress=False, checkpoint_every=1
    )
    assert not (tmp_path / "b" / "encoder-a.partial.pt").exists()
    for a, b in zip(clean.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.allclose(a.float(), b.float(), atol=1e-6)


class WriteMarker:
    """Unpickling this calls ``exec``, which writes ``path``: a stand-in for any payload."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:
        return (exec, (f"open({str(self.path)!r}, 'w').write('pwned')",))


def _plant(kind: str, tmp_path: Path, marker: Path) -> Path:
    evil = WriteMarker(marker)
    if kind == "features":
        path, payload = tmp_path / "features-k.pt", {"key": "k", "x": evil}
    else:
        name = "encoder-k.pt" if kind == "encoder" else "encoder-k.partial.pt"
        payload = {"kind": pretrain_module.CHECKPOINT_KIND, "key": "k", "config": evil}
        path = tmp_path / name
    atomic_torch_save(payload, path)
    return path


@pytest.mark.parametrize("kind", ["encoder", "encoder-partial", "features"])
def test_malicious_cache_file_is_refused_and_never_runs(digits, tmp_path: Path, kind: str) -> None:  # type: ignore[no-untyped-def]
    marker = tmp_path / "marker"
    pickle.loads(pickle.dumps(WriteMarker(marker)))  # the payload is live under plain pickle
    assert marker.read_text() == "pwned"
    marker.unlink()
    path = _plant(kind, tmp_path, marker)
    images = digits.images[:64]
    with pytest.warns(StaleCacheWarning) as seen:
        if kind == "features":
            encoder = create_encoder("small-cnn", in_channels=1)
            extract_features(encoder, images, key="k", cache_dir=tmp_path, progress=False)
        else:
            pretrain(images, config=_tiny(images), key="k", cache_dir=tmp_path, progress=False)
    message = str(seen[0].message)
    assert message.startswith(f"{path}: not a readable ") and "recomputing" in message
    assert "\n" not in message
    assert not marker.exists()


def _encoder() -> torch.nn.Module:
    torch.manual_seed(0)
    return create_encoder("small-cnn", in_channels=1)


def _valid_features(x: torch.Tensor) -> dict[str, object]:
    """A well-formed record (this code, a matching digest) holding ``x``."""
    return {
        "write": {
            "kind": pretrain_module.FEATURES_KIND,
            "key": "k",
            "code": code_digest(*pretrain_module.CODE),
            "payload": {"x": x},
        }
    }


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"garbage, not a torch file", "not a readable cache file"),
        (
            {"kind": "alm_opacus.simclr-encoder", "key": "k", "x": torch.zeros(8, 4)},
            "holds 'alm_opacus.simclr-encoder', expected a 'alm_opacus.features' cache",
        ),
        (
            {"kind": "alm_opacus.features", "key": "other", "x": torch.zeros(8, 4)},
            "a cache for other inputs",
        ),
        (
            _valid_features(torch.zeros(7, 4)),
            r"expected float32 features of shape \(8, D\), got torch.float32 \(7, 4\)",
        ),
        (_valid_features(torch.zeros(8, 4, dtype=torch.float64)), "got torch.float64"),
        ({"kind": "alm_opacus.features", "key": "k", "x": torch.zeros(8, 4)}, "older format"),
        ({"key": "k", "x": torch.zeros(8, 4)}, "holds None"),  # before the kind field existed
        ([1, 2], "holds 'list'"),
    ],
)
def test_corrupt_foreign_or_stale_features_cache_is_recomputed(
    digits, tmp_path: Path, content: object, expected: str
) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "features-k.pt"
    fresh = extract_features(
        _encoder(), digits.images[:8], key="k", cache_dir=tmp_path / "ok", progress=False
    )
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, dict) and "write" in content:
        write_cache(path, **content["write"])  # type: ignore[arg-type]
    else:
        atomic_torch_save(content, path)
    with pytest.warns(StaleCacheWarning, match=expected) as seen:
        again = extract_features(
            _encoder(), digits.images[:8], key="k", cache_dir=tmp_path, progress=False
        )
    message = str(seen[0].message)
    assert message.startswith(f"{path}: ") and "\n" not in message
    assert torch.equal(again, fresh)  # recomputed, never the file's content


def test_features_cache_round_trips(digits, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    images = digits.images[:16]
    first = extract_features(_encoder(), images, key="k", cache_dir=tmp_path, progress=False)
    assert torch.allclose(first.norm(dim=1), torch.ones(16), atol=1e-6)  # unit-norm rows
    stored = torch.load(tmp_path / "features-k.pt", weights_only=True)
    assert stored["kind"] == "alm_opacus.features" and stored["key"] == "k"
    assert torch.equal(stored["payload"]["x"], first)
    again = extract_features(_encoder(), images, key="k", cache_dir=tmp_path, progress=False)
    assert torch.equal(again, first)


def test_mnist_encoder_reads_28x28_and_keeps_the_spatial_map() -> None:
    enc = create_encoder("mnist-cnn", in_channels=1).eval()
    x = torch.zeros(1, 1, 28, 28)
    x[0, 0, 2:6, 2:6] = 1.0  # ink in the top-left corner only
    y = torch.zeros(1, 1, 28, 28)
    y[0, 0, 22:26, 22:26] = 1.0  # the same stroke in the bottom-right corner
    with torch.no_grad():
        fx, fy = enc(x), enc(y)
    assert fx.shape == (1, 576)
    # Flattened 64 x 3 x 3 map: the feature layout depends on where the stroke is.
    assert not torch.allclose(fx, fy)


def test_augmentations_include_mnist() -> None:
    assert {"digits", "mnist", "cifar", "stl10"} <= set(available_augmentations())


@pytest.mark.parametrize(
    ("changes", "name"),
    [
        ({"epochs": 0}, "epochs"),
        ({"batch_size": 1}, "batch_size"),
        ({"lr": 0.0}, "lr"),
        ({"temperature": float("nan")}, "temperature"),
        ({"weight_decay": -1.0}, "weight_decay"),
        ({"encoder": ""}, "encoder"),
        ({"projection_dim": True}, "projection_dim"),
    ],
)
def test_sslconfig_checks_its_values(changes: dict, name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name}=.* is invalid"):
        SSLConfig(**changes)


def test_sslconfig_round_trips_as_plain_data() -> None:
    config = SSLConfig(encoder="mnist-cnn", augmentation="mnist", epochs=3)
    assert SSLConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match=r"unknown SSLConfig keys \['bogus'\]"):
        SSLConfig.from_dict({**config.to_dict(), "bogus": 1})
