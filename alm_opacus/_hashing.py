"""Stable hashes for seeds and in-process cache keys (Python's ``hash`` is salted per run)."""

from __future__ import annotations

import hashlib

from torch import Tensor


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any labels, stable across processes."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def tensor_digest(*tensors: Tensor) -> str:
    """SHA-256 of the tensors' shapes, dtypes and bytes: keys for work that depends on them."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(str((tuple(t.shape), t.dtype)).encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()
