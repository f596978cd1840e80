"""SimCLR pre-training on the public split, and cached feature extraction.

Every artefact is cached under ``cache_dir`` by a hash of everything that determines it,
written atomically, and checked on load (:func:`alm_opacus.io.read_cache`): a re-run reuses
it, and an interrupted pre-training resumes from its last epoch checkpoint.

Loading never runs code: every cache file is read with ``torch.load(weights_only=True)``,
which admits only tensors and plain types, and holds configs as plain dicts. A corrupt,
foreign, malicious, altered or stale file (written by other code: :data:`CODE`) is never
used: a :class:`~alm_opacus.io.StaleCacheWarning` names it, and it is recomputed.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from alm_opacus._hashing import code_digest
from alm_opacus.io import MISSING, StaleCacheWarning, read_cache, write_cache
from alm_opacus.ssl.augment import create_augmentation
from alm_opacus.ssl.config import SSLConfig
from alm_opacus.ssl.encoders import create_encoder
from alm_opacus.ssl.images import to_float
from alm_opacus.ssl.losses import nt_xent

CHECKPOINT_KIND = "alm_opacus.simclr-encoder"
PARTIAL_KIND = "alm_opacus.simclr-partial"
FEATURES_KIND = "alm_opacus.features"
#: The modules whose code produces the encoder and the features: a cache records their
#: digest (:func:`~alm_opacus._hashing.code_digest`) and is recomputed when it differs.
CODE = ("alm_opacus.ssl", "alm_opacus.data.registry")

__all__ = [
    "CHECKPOINT_KIND",
    "CODE",
    "FEATURES_KIND",
    "PARTIAL_KIND",
    "SSLConfig",
    "SimCLRModel",
    "array_digest",
    "config_hash",
    "extract_features",
    "load_checkpoint",
    "pretrain",
]


def config_hash(obj: Any) -> str:
    """A short stable hash of a JSON-able object (the cache key)."""
    blob = json.dumps(obj, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def array_digest(array: np.ndarray) -> str:
    """Hash of an array's bytes (so a cache key pins the exact examples or indices), read in
    chunks of about 64 MiB so that a memmapped data set is never copied whole."""
    h = hashlib.sha256()
    if array.ndim == 0:
        h.update(np.ascontiguousarray(array).tobytes())
    rows = max(1, (64 << 20) // max(1, array[:1].nbytes))
    for lo in range(0, len(array) if array.ndim else 0, rows):
        h.update(np.ascontiguousarray(array[lo : lo + rows]).tobytes())
    return h.hexdigest()[:16]


class SimCLRModel(nn.Module):
    """Encoder plus the 2-layer projection head of SimCLR (discarded after pre-training)."""

    def __init__(self, encoder: nn.Module, projection_dim: int) -> None:
        super().__init__()
        self.encoder = encoder
        dim = int(encoder.out_dim)  # type: ignore[arg-type]
        self.projector = nn.Sequential(
            nn.Linear(dim, dim), nn.ReLU(inplace=True), nn.Linear(dim, projection_dim)
        )

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.projector(self.encoder(x))
        return out


def _batch(images: np.ndarray, idx: np.ndarray, device: torch.device) -> Tensor:
    # Sorted reads keep memmapped data (STL-10 unlabeled) sequential on disk.
    order = np.sort(idx)
    return torch.from_numpy(to_float(np.asarray(images[order]))).to(device)


def pretrain(
    images: np.ndarray,
    *,
    config: SSLConfig,
    key: str,
    cache_dir: Path,
    device: str | torch.device = "cpu",
    seed: int = 0,
    progress: bool = True,
    checkpoint_every: int = 10,
) -> nn.Module:
    """Pre-train (or load from cache) a SimCLR encoder on public ``images`` only.

    Args:
        images: (N, C, H, W) public images (uint8 or float in [0, 1]).
        config: the SimCLR recipe.
        key: the cache key; it must pin the data, ``config`` and ``seed``.
        cache_dir: where checkpoints live.
        device: ``"cpu"`` or ``"cuda"``.
        seed: seeds initialisation, batching and augmentation.
        progress: show a tqdm bar.
        checkpoint_every: epochs between resumable checkpoints.

    Returns:
        The encoder in eval mode on ``device``.

    A cached encoder or partial checkpoint that fails its checks is retrained, never used.
    """
    device = torch.device(device)
    final = Path(cache_dir) / f"encoder-{key}.pt"
    partial = Path(cache_dir) / f"encoder-{key}.partial.pt"
    in_channels = int(images.shape[1])
    # Seed before building the model: initialisation and kornia's augmentation parameters
    # both draw from the global RNG.
    torch.manual_seed(seed)
    model = SimCLRModel(
        create_encoder(config.encoder, in_channels=in_channels), config.projection_dim
    ).to(device)
    code = code_digest(*CODE)
    state = read_cache(final, kind=CHECKPOINT_KIND, key=key, code=code)
    if state is not MISSING and _load_encoder(model.encoder, state, path=final):
        return model.encoder.eval()

    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=config.epochs)
    augment = create_augmentation(config.augmentation).to(device)
    rng = np.random.default_rng(seed)
    start = 0
    state = read_cache(partial, kind=PARTIAL_KIND, key=key, code=code)
    if state is not MISSING:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        rng.bit_generator.state = state["numpy_rng"]
        torch.set_rng_state(state["torch_rng"])
        start = int(state["epoch"])

    n = len(images)
    batch = min(config.batch_size, n)
    model.train()
    bar = tqdm(
        range(start, config.epochs),
        desc="SimCLR pre-training",
        disable=not progress,
        initial=start,
        total=config.epochs,
        unit="epoch",
    )
    for epoch in bar:
        perm = rng.permutation(n)
        losses = []
        for lo in range(0, n - batch + 1, batch):  # drop the ragged batch: NT-Xent wants N >= 2
            x = _batch(images, perm[lo : lo + batch], device)
            loss = nt_xent(model(augment(x)), model(augment(x)), temperature=config.temperature)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
        scheduler.step()
        bar.set_postfix(loss=f"{np.mean(losses):.3f}")
        if (epoch + 1) % checkpoint_every == 0 and epoch + 1 < config.epochs:
            write_cache(
                partial,
                kind=PARTIAL_KIND,
                key=key,
                code=code,
                payload={
                    "epoch": epoch + 1,
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "numpy_rng": rng.bit_generator.state,
                    "torch_rng": torch.get_rng_state(),
                },
            )
    write_cache(
        final,
        kind=CHECKPOINT_KIND,
        key=key,
        code=code,
        payload={
            "config": config.to_dict(),
            "in_channels": in_channels,
            "state_dict": model.encoder.state_dict(),
        },
    )
    partial.unlink(missing_ok=True)
    return model.encoder.eval()


def _load_encoder(encoder: nn.Module, state: Any, *, path: Path) -> bool:
    """Load a checked cache record's weights into ``encoder``; False (with a warning) if
    they do not fit its architecture."""
    try:
        encoder.load_state_dict(state["state_dict"])
    except (RuntimeError, KeyError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        warnings.warn(
            f"{path}: encoder weights do not fit the architecture ({first}); retraining",
            StaleCacheWarning,
            stacklevel=3,
        )
        return False
    return True


def load_checkpoint(encoder: nn.Module, path: Path, *, key: str) -> None:
    """Load a cached encoder, checking its kind, key, code digest, content digest and
    architecture.

    Raises:
        ValueError: naming ``path``, if it is missing or fails a check.
    """
    state = read_cache(Path(path), kind=CHECKPOINT_KIND, key=key, code=code_digest(*CODE))
    if state is MISSING or not _load_encoder(encoder, state, path=Path(path)):
        raise ValueError(f"{path}: not a usable encoder checkpoint for key {key!r}")


@torch.no_grad()
def extract_features(
    encoder: nn.Module,
    images: np.ndarray,
    *,
    key: str,
    cache_dir: Path,
    device: str | torch.device = "cpu",
    batch_size: int = 1024,
    progress: bool = True,
) -> Tensor:
    """Encode ``images`` (cached by ``key``), L2-normalised, as a float32 CPU tensor (N, D).

    Unit-norm features make the feature radius ``R = 1`` exact for the analytic
    sensitivity, and need no statistics of the private data. A cache that fails its checks
    (:func:`alm_opacus.io.read_cache`, or a shape other than ``(len(images), D)``) is
    recomputed, never used.
    """
    path = Path(cache_dir) / f"features-{key}.pt"
    code = code_digest(*CODE)
    found = read_cache(path, kind=FEATURES_KIND, key=key, code=code)
    if found is not MISSING and _features_fit(found, path=path, rows=len(images)):
        return found["x"]
    device = torch.device(device)
    encoder = encoder.to(device).eval()
    chunks = []
    for lo in tqdm(range(0, len(images), batch_size), desc="features", disable=not progress):
        x = torch.from_numpy(to_float(np.asarray(images[lo : lo + batch_size]))).to(device)
        chunks.append(torch.nn.functional.normalize(encoder(x), dim=1).float().cpu())
    feats = torch.cat(chunks)
    write_cache(path, kind=FEATURES_KIND, key=key, code=code, payload={"x": feats})
    return feats


def _features_fit(found: Any, *, path: Path, rows: int) -> bool:
    x = found.get("x") if isinstance(found, dict) else None
    if isinstance(x, Tensor) and x.ndim == 2 and len(x) == rows and x.dtype == torch.float32:
        return True
    got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
    warnings.warn(
        f"{path}: expected float32 features of shape ({rows}, D), got {got}; recomputing them",
        StaleCacheWarning,
        stacklevel=3,
    )
    return False
