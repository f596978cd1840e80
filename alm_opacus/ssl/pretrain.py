"""SimCLR pre-training on the public split, and cached feature extraction.

Every artefact is cached under ``cache_dir`` by a hash of everything that determines it,
written atomically, and checked on load: a re-run reuses it, and an interrupted
pre-training resumes from its last epoch checkpoint.

Loading never runs code: every cache file is read with ``torch.load(weights_only=True)``,
which admits only tensors and plain types, and holds configs as plain dicts. A corrupt,
foreign or malicious file is refused with a one-line ``ValueError`` naming it and saying
to delete it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from alm_opacus.data.registry import to_float
from alm_opacus.io import atomic_torch_save
from alm_opacus.ssl.augment import create_augmentation
from alm_opacus.ssl.config import SSLConfig
from alm_opacus.ssl.encoders import create_encoder
from alm_opacus.ssl.losses import nt_xent

CHECKPOINT_KIND = "alm_opacus.simclr-encoder"
FEATURES_KIND = "alm_opacus.features"

__all__ = [
    "CHECKPOINT_KIND",
    "FEATURES_KIND",
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
    """Hash of an index array (so a cache key pins the exact public examples)."""
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()[:16]


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

    Raises:
        ValueError: if a cached checkpoint's kind or key does not match.
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
    if final.exists():
        load_checkpoint(model.encoder, final, key=key)
        return model.encoder.eval()

    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=config.epochs)
    augment = create_augmentation(config.augmentation).to(device)
    rng = np.random.default_rng(seed)
    start = 0
    if partial.exists():
        state = _read_checkpoint(partial, key=key)
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
            atomic_torch_save(
                {
                    "kind": CHECKPOINT_KIND,
                    "key": key,
                    "epoch": epoch + 1,
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "numpy_rng": rng.bit_generator.state,
                    "torch_rng": torch.get_rng_state(),
                },
                partial,
            )
    atomic_torch_save(
        {
            "kind": CHECKPOINT_KIND,
            "key": key,
            "config": config.to_dict(),
            "in_channels": in_channels,
            "state_dict": model.encoder.state_dict(),
        },
        final,
    )
    partial.unlink(missing_ok=True)
    return model.encoder.eval()


def _first_line(exc: BaseException) -> str:
    # torch's refusal messages run to a dozen lines; the first says what was refused.
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def read_cache_file(path: Path, *, what: str) -> Any:
    """``torch.load(path, weights_only=True)``: tensors and plain types only, never code.

    Raises:
        ValueError: one line naming ``path``, for a truncated, foreign or malicious file.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated files, foreign pickles and refused globals alike
        raise ValueError(
            f"{path}: not a readable {what} ({_first_line(exc)}); delete it to rebuild it"
        ) from exc


def _read_checkpoint(path: Path, *, key: str) -> dict[str, Any]:
    state = read_cache_file(path, what="checkpoint")
    if not isinstance(state, dict) or state.get("kind") != CHECKPOINT_KIND:
        raise ValueError(
            f"{path}: expected a checkpoint of kind {CHECKPOINT_KIND!r}; delete it to retrain"
        )
    if state.get("key") != key:
        raise ValueError(
            f"{path}: checkpoint is for config {state.get('key')!r}, expected {key!r}; "
            "delete it to retrain"
        )
    return state


def load_checkpoint(encoder: nn.Module, path: Path, *, key: str) -> None:
    """Load a cached encoder, checking its kind, its key and its architecture.

    Raises:
        ValueError: on a foreign file, another config's key, or mismatched weights.
    """
    state = _read_checkpoint(path, key=key)
    try:
        encoder.load_state_dict(state["state_dict"])
    except RuntimeError as exc:
        raise ValueError(f"{path}: encoder weights do not match the architecture: {exc}") from exc


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
    sensitivity, and need no statistics of the private data.
    """
    path = Path(cache_dir) / f"features-{key}.pt"
    if path.exists():
        return _read_features(path, key=key, rows=len(images))
    device = torch.device(device)
    encoder = encoder.to(device).eval()
    chunks = []
    for lo in tqdm(range(0, len(images), batch_size), desc="features", disable=not progress):
        x = torch.from_numpy(to_float(np.asarray(images[lo : lo + batch_size]))).to(device)
        chunks.append(torch.nn.functional.normalize(encoder(x), dim=1).float().cpu())
    feats = torch.cat(chunks)
    atomic_torch_save({"kind": FEATURES_KIND, "key": key, "x": feats}, path)
    return feats


def _read_features(path: Path, *, key: str, rows: int) -> Tensor:
    cached = read_cache_file(path, what="features cache")
    # Caches written before FEATURES_KIND existed hold only "key" and "x".
    if not isinstance(cached, dict) or cached.get("kind", FEATURES_KIND) != FEATURES_KIND:
        raise ValueError(f"{path}: expected a {FEATURES_KIND!r} cache; delete it")
    x = cached.get("x")
    if cached.get("key") != key or not isinstance(x, Tensor):
        raise ValueError(f"{path}: expected features for key {key!r}; delete it")
    if x.ndim != 2 or len(x) != rows or x.dtype != torch.float32:
        raise ValueError(
            f"{path}: expected float32 features of shape ({rows}, D), "
            f"got {x.dtype} {tuple(x.shape)}; delete it"
        )
    return x
