"""Mironov's floating-point attack (CCS 2012) as tests: the attacker knows the sampler and
computes, for each neighbouring hypothesis, the exact probability of the released floats by
enumerating the sampler's outcomes that reproduce them.

* Exact releases (the default): the released value is γ·m with m an integer, and the outcomes
  that reproduce it are exactly K = m − n_h, so P(release | h) is the cell law's PMF. No
  release may be impossible under the neighbour, and the best test's advantage stays within
  what ε allows (tanh(ε/2) for pure ε-DP) plus sampling error.
* The floating-point path (``exact=False``): the noise is s·g(a) for a 52- or 53-bit integer
  a, and the release is fl(v + fl(s·g(a))); the a's that reproduce a release form intervals
  (the map is monotone), found by binary search. Many releases are impossible under the
  neighbour, and the attack wins far beyond ε: the test that shows the old path fails.
* The baselines' exact releases: dperm (a grid Gaussian whose scale is a χ mixture) and a
  C = 2 lu answer (a softmax of one grid value), attacked the same way.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from alm_opacus.mechanisms import create_mechanism
from alm_opacus.mechanisms.exact import Grid, cell_log_pmf, exact_release, plan_release
from alm_opacus.mechanisms.sampling import SecureGenerator
from alm_opacus.protect import PostTrainingPrivacyEngine, SensitivityInfo

MECHANISMS = ("alm", "laplace", "gaussian")
DTYPES = (torch.float64, torch.float32)
EPSILON, DELTA = 1.0, 1e-6
#: The best test's advantage allowed by (ε, δ)-DP: (e^ε − 1 + 2δ)/(e^ε + 1).
BOUND = (math.exp(EPSILON) - 1 + 2 * DELTA) / (math.exp(EPSILON) + 1)


def _delta(mechanism: str) -> float:
    return DELTA if create_mechanism(mechanism).norm == "l2" else 0.0


def _neighbours(dtype: torch.dtype) -> tuple[nn.Linear, nn.Linear]:
    """nn.Linear(8, 2) and a neighbour differing in all 18 weights by 0.999 in total."""
    torch.manual_seed(0)
    head = nn.Linear(8, 2).to(dtype)
    other = nn.Linear(8, 2).to(dtype)
    with torch.no_grad():
        for p, q in zip(head.parameters(), other.parameters(), strict=True):
            q.copy_(p + 0.999 / 18)
    return head, other


def _flat(module: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()])


# --- the attack on exact releases ------------------------------------------------------------


def _grid_of(gamma: float) -> Grid:
    return Grid(exponent=math.frexp(gamma)[1] - 1, limit=2**53, bound=2**52)


def _exact_log_likelihood(
    released: torch.Tensor, clean: torch.Tensor, *, mechanism: str, scale: float, grid: Grid
) -> np.ndarray:
    """ln P(released | clean), summed over the last axis: the sampler's only outcome that
    reproduces γ·m from n = round(clean/γ) is K = m − n."""
    m = released.double() / grid.gamma
    assert torch.equal(m, torch.round(m))  # every shipped float is on the grid
    n = torch.round(clean.double().clamp(-grid.clamp, grid.clamp) / grid.gamma)
    k = (m - n).to(torch.int64).numpy()
    return np.sum(cell_log_pmf(mechanism, scale=scale, grid=grid, k=k), axis=-1)


def _advantage(llr_h0: np.ndarray, llr_h1: np.ndarray) -> float:
    """TPR − FPR of "say h0 when ln P(·|h0) − ln P(·|h1) > 0"."""
    return float(np.mean(llr_h0 > 0) - np.mean(llr_h1 > 0))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_exact_releases_of_a_head_resist_the_exact_likelihood_attack(
    mechanism: str, dtype: torch.dtype
) -> None:
    head, other = _neighbours(dtype)
    info = SensitivityInfo(value=1.0, norm=create_mechanism(mechanism).norm, source="analytic")
    engine = PostTrainingPrivacyEngine(mechanism=mechanism)
    clean = (_flat(head), _flat(other))
    releases: list[list[torch.Tensor]] = [[], []]
    for h, module in enumerate((head, other)):
        for _ in range(25):  # the released API itself
            out = engine.make_private(
                module, epsilon=EPSILON, delta=_delta(mechanism), sensitivity=info
            )
            releases[h].append(_flat(out.module))
    st = out.statement
    assert st.grid is not None and st.noise_scale is not None
    grid, scale = _grid_of(st.grid), st.noise_scale
    # The same release, drawn 4,000 times at once per hypothesis (exact_release is what
    # make_private calls per parameter), for the advantage.
    for h in range(2):
        many = clean[h].expand(4000, -1).contiguous()
        releases[h].append(
            exact_release(
                many, mechanism=mechanism, scale=scale, grid=grid, generator=SecureGenerator()
            )
        )
    llr = []
    for h in range(2):
        shipped = torch.cat([r.reshape(-1, 18) for r in releases[h]])
        assert shipped.dtype == dtype
        l0 = _exact_log_likelihood(shipped, clean[0], mechanism=mechanism, scale=scale, grid=grid)
        l1 = _exact_log_likelihood(shipped, clean[1], mechanism=mechanism, scale=scale, grid=grid)
        # no release is impossible under either hypothesis
        assert np.all(np.isfinite(l0)) and np.all(np.isfinite(l1))
        llr.append(l0 - l1)
    # 4,025 releases per side: the advantage's standard error is below 0.011; 5 of them
    assert _advantage(*llr) <= BOUND + 0.055
    # and the likelihood ratio of any one release stays within e^ε (pure) where it must
    if create_mechanism(mechanism).pure:
        assert np.max(np.abs(np.concatenate(llr))) <= EPSILON + 1e-9


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_exact_scalar_releases_resist_the_attack(mechanism: str, dtype: torch.dtype) -> None:
    mech = create_mechanism(mechanism)
    plan = plan_release(
        mechanism=mech,
        epsilon=EPSILON,
        delta=_delta(mechanism),
        sensitivity=1.0,
        dim=1,
        dtype=dtype,
    )
    values = (torch.zeros(20_000, 1, dtype=dtype), torch.full((20_000, 1), 0.999, dtype=dtype))
    llr = []
    for v in values:
        shipped = exact_release(
            v, mechanism=mech, scale=plan.scale, grid=plan.grid, generator=SecureGenerator()
        )
        l0 = _exact_log_likelihood(
            shipped, values[0][0], mechanism=mechanism, scale=plan.scale, grid=plan.grid
        )
        l1 = _exact_log_likelihood(
            shipped, values[1][0], mechanism=mechanism, scale=plan.scale, grid=plan.grid
        )
        assert np.all(np.isfinite(l0)) and np.all(np.isfinite(l1))
        llr.append(l0 - l1)
    # 20,000 per side: standard error < 0.005; 5 of them
    assert _advantage(*llr) <= BOUND + 0.025
    if mech.pure:
        assert np.max(np.abs(np.concatenate(llr))) <= EPSILON + 1e-9


# --- the same attack on the floating-point path ----------------------------------------------

_TWO_53 = 2.0**53


def _float_release(
    k: torch.Tensor,
    sign: torch.Tensor,
    clean: torch.Tensor,
    *,
    mechanism: str,
    scale: float,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The float sampler of ``alm_opacus.mechanisms.sampling`` for 52-bit word k (and the
    Laplace sign bit), added as ``make_private(exact=False)`` adds it."""
    a = (2 * k + 1).to(torch.float64)
    if mechanism == "alm":
        z = torch.log(a) - torch.log(_TWO_53 - a)
    elif mechanism == "laplace":
        z = (1.0 - 2.0 * sign) * (53.0 * math.log(2.0) - torch.log(a))
    else:
        lower = torch.minimum(a, _TWO_53 - a)
        z = torch.special.ndtri(lower / _TWO_53)
        z = torch.where(a < 2.0**52, z, -z)
    return clean.to(dtype) + (scale * z).to(dtype)


def _float_log_likelihood(
    released: torch.Tensor, clean: torch.Tensor, *, mechanism: str, scale: float
) -> np.ndarray:
    """ln P(released | clean) per release: the words that reproduce each coordinate form an
    interval of k on each monotone branch; two binary searches count them."""
    dtype = released.dtype
    rel = released.reshape(-1)
    base = clean.expand_as(released).reshape(-1)
    total = torch.zeros_like(rel, dtype=torch.float64)
    branches = (0.0, 1.0) if mechanism == "laplace" else (0.0,)
    for sign in branches:
        s = torch.full_like(rel, sign, dtype=torch.float64)
        # for Laplace's + branch the release decreases in k: search on −k instead
        decreasing = mechanism == "laplace" and sign == 0.0

        def f(k: torch.Tensor, s: torch.Tensor = s, decreasing: bool = decreasing) -> torch.Tensor:
            out = _float_release(k, s, base, mechanism=mechanism, scale=scale, dtype=dtype)
            return -out if decreasing else out

        target = -rel if decreasing else rel

        def first(pred: object) -> torch.Tensor:
            lo = torch.zeros_like(rel, dtype=torch.int64)
            hi = torch.full_like(rel, 2**52, dtype=torch.int64)
            for _ in range(53):  # smallest k in [0, 2^52] with pred(k) (monotone)
                mid = (lo + hi) // 2
                ok = pred(mid)  # type: ignore[operator]
                hi = torch.where(ok, mid, hi)
                lo = torch.where(ok, lo, mid + 1)
            return lo

        start = first(lambda k, target=target: f(k) >= target)
        stop = first(lambda k, target=target: f(k) > target)
        total += (stop - start).to(torch.float64)
    words = 2.0**53 if mechanism == "laplace" else 2.0**52
    with np.errstate(divide="ignore"):
        per = np.log(total.numpy()) - math.log(words)
    return per.reshape(released.shape).sum(axis=-1)


#: Releases per hypothesis: enough that the weakest case's advantage sits ~6 sd above the bar.
RELEASES = 400


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_the_floating_point_path_fails_the_same_attack(mechanism: str, dtype: torch.dtype) -> None:
    head, other = _neighbours(dtype)
    info = SensitivityInfo(value=1.0, norm=create_mechanism(mechanism).norm, source="analytic")
    engine = PostTrainingPrivacyEngine(mechanism=mechanism)
    clean = (_flat(head), _flat(other))
    llr, impossible = [], 0
    for h, module in enumerate((head, other)):
        shipped = []
        for _ in range(RELEASES):
            out = engine.make_private(
                module, epsilon=EPSILON, delta=_delta(mechanism), sensitivity=info, exact=False
            )
            shipped.append(_flat(out.module))
        st = out.statement
        assert st.guarantee.value == "none" and "floating-point" in str(st)
        assert st.noise_scale is not None
        rel = torch.stack(shipped)
        own = _float_log_likelihood(rel, clean[h], mechanism=mechanism, scale=st.noise_scale)
        alt = _float_log_likelihood(rel, clean[1 - h], mechanism=mechanism, scale=st.noise_scale)
        assert np.all(np.isfinite(own))  # the enumeration finds the true outcome
        impossible += int(np.sum(~np.isfinite(alt)))
        llr.append(own - alt if h == 0 else alt - own)
    # Releases the neighbour cannot produce identify the head with certainty (issue 19
    # measured 64-100% of releases); the attack wins far beyond what epsilon = 1 allows.
    # The weakest case, Gaussian in float32, has advantage ~0.79 and ~64% impossible
    # releases. Over 2 × 80 releases the advantage's sd was ~0.045 and CI once drew 0.64
    # (3.5 sd low); over 2 × 400 it is ~0.02, so BOUND + 0.2 (0.66) lies ~6 sd below it,
    # and 400 impossible releases lie ~8 binomial sd below the expected ~510.
    assert impossible >= RELEASES
    with np.errstate(invalid="ignore"):
        assert (
            _advantage(
                np.nan_to_num(llr[0], posinf=1e300, neginf=-1e300),
                np.nan_to_num(llr[1], posinf=1e300, neginf=-1e300),
            )
            > BOUND + 0.2
        )


# --- the same attack on the baselines' exact releases (dperm, lu) ----------------------------


def test_exact_dperm_releases_resist_the_exact_likelihood_attack() -> None:
    # dperm's release is γ·(n + K), K the exact grid Gaussian at σ = max(s√V, σ_min),
    # V ~ χ²_{P+1}: P(release | h) = E_V[Π PMF_σ(m − n_h)], taken here by quadrature over V's
    # quantiles. Every K has positive mass under every σ, so no release is impossible under
    # the neighbour, and the release is (ε, 2⁻⁴⁰)-DP: the best test stays within that bound.
    from scipy import special, stats

    from baselines.dperm import FLOOR_DELTA, exact_plan, perturb_exact

    head, _ = _neighbours(torch.float64)
    clean = (_flat(head), _flat(head) + 0.999 / math.sqrt(18))  # L2 distance 0.999 < Δ = 1
    plan = exact_plan(epsilon=EPSILON, sensitivity=1.0, dim=18)
    grid = plan.release.grid
    quantiles = stats.chi2(19).ppf((np.arange(64) + 0.5) / 64)
    sigmas = np.maximum(plan.release.scale * np.sqrt(quantiles), plan.floor)
    llr = []
    for h in range(2):
        params = {"w": clean[h].expand(3000, -1).contiguous()}
        shipped = perturb_exact(params, plan=plan, generator=SecureGenerator())["w"]
        per_hypothesis = []
        for c in clean:
            # ln P(release | c): log-mean-exp over the quadrature's σ of the product of PMFs
            terms = np.stack(
                [
                    _exact_log_likelihood(
                        shipped, c, mechanism="gaussian", scale=float(s), grid=grid
                    )
                    for s in sigmas
                ]
            )
            assert np.all(np.isfinite(terms))  # no release is impossible under c, for any σ
            per_hypothesis.append(special.logsumexp(terms, axis=0) - math.log(len(sigmas)))
        llr.append(per_hypothesis[0] - per_hypothesis[1])
    bound = (math.exp(EPSILON) - 1 + 2 * FLOOR_DELTA) / (math.exp(EPSILON) + 1)
    # 3,000 per side: standard error < 0.013; 5 of them
    assert _advantage(*llr) <= bound + 0.065


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_exact_binary_lu_answers_resist_the_exact_likelihood_attack(
    noise: str, dtype: torch.dtype
) -> None:
    # A C = 2 lu answer is softmax((γM, 0)), M = s_T·(round(clamp(z_T − z_other)/γ) + K):
    # the attacker enumerates the M that reproduce the released probabilities and sums their
    # PMFs under each hypothesis on d = z_1 − z_2 (0 and 0.999, sensitivity S = 1), whatever
    # logit was selected.
    from baselines.lu.net import answer_grid, exact_logits

    mech = create_mechanism(noise)
    scale = mech.calibrate(epsilon=EPSILON, delta=_delta(noise), sensitivity=1.0)
    grid = answer_grid(scale=scale, noise=noise)
    window = torch.arange(-64, 65, dtype=torch.float64)
    llr = []
    for d in (0.0, 0.999):
        z = torch.tensor([d, 0.0], dtype=torch.float64).expand(1, 20_000, 2)
        t = torch.randint(0, 2, (1, 20_000, 1), generator=torch.Generator().manual_seed(5))
        logits = exact_logits(
            z, t, noise=noise, scale=scale, grid=grid, generator=SecureGenerator()
        )
        shipped = torch.softmax(logits, dim=-1)[0].to(dtype)
        guess = torch.round(torch.log(shipped[:, 0].double() / shipped[:, 1].double()) / grid.gamma)
        m = guess[:, None] + window  # candidate outcomes near the log-odds
        candidates = torch.softmax(torch.stack([m * grid.gamma, torch.zeros_like(m)], -1), -1)
        match = (candidates.to(dtype) == shipped[:, None, :]).all(-1).numpy()
        assert match[:, 64].all()  # the log-odds' own cell reproduces every answer
        per_hypothesis = []
        for clean in (0.0, 0.999):
            n = round(clean / grid.gamma)
            log_pmf = cell_log_pmf(
                noise, scale=scale, grid=grid, k=(m.numpy() - n).astype(np.int64)
            )
            with np.errstate(divide="ignore"):
                total = np.log(np.sum(np.where(match, np.exp(log_pmf), 0.0), axis=1))
            assert np.all(np.isfinite(total))  # no answer is impossible under either d
            per_hypothesis.append(total)
        llr.append(per_hypothesis[0] - per_hypothesis[1])
    # S' = S + γ: the ε these answers are proven at (within 2⁻⁷ of EPSILON)
    epsilon = mech.epsilon(delta=_delta(noise), scale=scale, sensitivity=1.0 + grid.gamma, dim=1)
    bound = (math.exp(epsilon) - 1 + 2 * _delta(noise)) / (math.exp(epsilon) + 1)
    assert _advantage(*llr) <= bound + 0.025
    if mech.pure:
        assert np.max(np.abs(np.concatenate(llr))) <= epsilon + 1e-9
