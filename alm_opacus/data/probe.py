"""Measure a dataset's SimCLR recipe: its cost, a linear probe, and a loss attack on the head.

``python -m alm_opacus.data.probe --dataset mnist`` pre-trains the dataset's encoder on the
public part of its default split (nothing private), trains the default head
(``HeadConfig()``) on the members' features, and prints:

- the pre-training wall and CPU seconds, and the peak RSS of the process;
- the probe's accuracy on the members and on the non-members (the test accuracy);
- the loss attack's AUC on the unprotected head, members against non-members, with its
  standard error (Hanley & McNeil 1982, Eq. 2), so "measurably vulnerable" has a number.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import resource
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from alm_opacus.data import DataError, dataset_spec, load_dataset
from alm_opacus.data.split import make_split
from alm_opacus.heads import HeadConfig, train_head
from alm_opacus.ssl.pretrain import extract_features, pretrain


@dataclass(frozen=True)
class ProbeResult:
    """What :func:`probe` measured (seconds are wall-clock and process CPU time)."""

    dataset: str
    pretrain_seconds: float
    pretrain_cpu_seconds: float
    features_seconds: float
    feature_dim: int
    train_accuracy: float
    test_accuracy: float
    loss_auc: float
    loss_auc_stderr: float
    peak_rss_mib: float


def auc_stderr(auc: float, *, positives: int, negatives: int) -> float:
    """Standard error of an AUC (Hanley & McNeil 1982, Radiology 143:29, Eq. 2)."""
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    var = auc * (1 - auc) + (positives - 1) * (q1 - auc * auc) + (negatives - 1) * (q2 - auc * auc)
    return math.sqrt(var / (positives * negatives))


def probe(
    *, dataset: str, seed: int = 0, epochs: int | None = None, cache_dir: Path | None = None
) -> ProbeResult:
    """Pre-train ``dataset``'s recipe (optionally with ``epochs``) and measure it.

    Args:
        dataset: a name with a registered DatasetSpec (embedded datasets need no root).
        seed: seeds the split, pre-training and the head.
        epochs: overrides the recipe's SimCLR epochs.
        cache_dir: encoder/feature cache (default: a fresh temporary folder).

    Returns:
        The measurements.

    Raises:
        DataError: for an unknown dataset.
    """
    from sklearn.metrics import roc_auc_score

    spec = dataset_spec(dataset)
    data = load_dataset(dataset)
    if spec.ssl is None or data.images is None:
        raise DataError(f"dataset {dataset!r} holds features: there is no encoder to probe")
    ssl = spec.ssl if epochs is None else dataclasses.replace(spec.ssl, epochs=epochs)
    split = make_split(data, sizes=spec.split, seed=seed)
    cache = Path(cache_dir) if cache_dir is not None else Path(tempfile.mkdtemp())
    key = f"probe-{dataset}-{seed}-{ssl.epochs}"
    wall, cpu = time.perf_counter(), time.process_time()
    encoder = pretrain(
        data.images[split.public], config=ssl, key=key, cache_dir=cache, seed=seed, progress=False
    )
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    start = time.perf_counter()
    features = extract_features(encoder, data.images, key=key, cache_dir=cache, progress=False)
    features_seconds = time.perf_counter() - start
    x, y = features.double(), torch.from_numpy(np.asarray(data.labels))
    m, n = split.members, split.nonmembers
    head = train_head(x[m], y[m], num_classes=data.num_classes, config=HeadConfig(), seed=seed)
    p_m, p_n = head.predict_proba(x[m]), head.predict_proba(x[n])
    loss_m = -torch.log(p_m[torch.arange(len(m)), y[m]].clamp_min(1e-300)).numpy()
    loss_n = -torch.log(p_n[torch.arange(len(n)), y[n]].clamp_min(1e-300)).numpy()
    is_member = np.r_[np.ones(len(m)), np.zeros(len(n))]
    auc = float(roc_auc_score(is_member, -np.r_[loss_m, loss_n]))  # lower loss: member
    return ProbeResult(
        dataset=dataset,
        pretrain_seconds=wall,
        pretrain_cpu_seconds=cpu,
        features_seconds=features_seconds,
        feature_dim=int(x.shape[1]),
        train_accuracy=float((p_m.argmax(1) == y[m]).double().mean()),
        test_accuracy=float((p_n.argmax(1) == y[n]).double().mean()),
        loss_auc=auc,
        loss_auc_stderr=auc_stderr(auc, positives=len(m), negatives=len(n)),
        peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    )


def main(argv: list[str] | None = None) -> None:
    """Command-line entry: ``python -m alm_opacus.data.probe --dataset mnist``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=None, help="override the SimCLR epochs")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    result = probe(dataset=args.dataset, seed=args.seed, epochs=args.epochs)
    for name, value in dataclasses.asdict(result).items():
        print(f"{name}: {value:.4f}" if isinstance(value, float) else f"{name}: {value}")


if __name__ == "__main__":
    main()
