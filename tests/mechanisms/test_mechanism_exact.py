"""Exact grid noise: samplers against their exact PMFs, profiles against direct summation and
the continuous profiles, grids, integer clipping, the keystream and exact Bernoulli draws."""

from __future__ import annotations

import copy
import math
import os
import pickle
import threading

import mpmath
import numpy as np
import pytest
import torch
from scipy import special, stats

import alm_opacus.mechanisms.exact as exact
import alm_opacus.mechanisms.exact_passes as exact_passes
from alm_opacus.mechanisms import (
    SecureGenerator,
    analysis,
    create_mechanism,
    kernels,
    make_generator,
)
from alm_opacus.mechanisms.cell_laws import _iv_precision
from alm_opacus.mechanisms.csprng import KeyStream
from alm_opacus.mechanisms.exact import (
    INFLATION,
    Grid,
    cell_delta,
    cell_law,
    cell_log_pmf,
    cell_pld,
    cell_radius,
    clip_to_cells,
    dequantize,
    discrete_noise,
    grid_for,
    inflated_sensitivity,
    plan_release,
    quantize,
)
from alm_opacus.mechanisms.grid import max_exponent, min_exponent
from alm_opacus.mechanisms.sampling import bernoulli

MECHANISMS = ("alm", "laplace", "gaussian")
UNIT = Grid(exponent=0, limit=2**53, bound=2**52)
#: Continuous survival functions S(u) = P(|Z| > u) at unit scale, from scipy (independent).
SCIPY_TAIL = {
    "alm": lambda u: 2 * stats.logistic.sf(u),
    "laplace": lambda u: 2 * stats.laplace.sf(u),
    "gaussian": lambda u: 2 * stats.norm.sf(u),
}


@pytest.fixture(params=["compiled", "tensor"])
def first_pass(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test through the compiled first pass and through the tensor one (the fallback
    where numba does not import)."""
    if request.param == "compiled":
        assert kernels.first_pass_kernel("alm") is not None, "numba is a dependency"
    monkeypatch.setattr(exact, "_USE_KERNELS", request.param == "compiled")
    return str(request.param)


def _pmf(mechanism: str, t: float, k: np.ndarray) -> np.ndarray:
    """P(K = k) of the law at scale t rounded to the integers, from scipy's survival function."""
    a = np.abs(k).astype(np.float64)
    tail = SCIPY_TAIL[mechanism]
    inner = np.where(a == 0, 1.0, tail(np.maximum(a - 0.5, 0) / t))
    mass = inner - tail((a + 0.5) / t)
    return np.where(a == 0, mass, mass / 2)


def _chi_square(draws: np.ndarray, mechanism: str, t: float) -> float:
    """p-value of Pearson's chi-square of ``draws`` against the cell PMF (cells of expected
    count < 20 pooled into the two tails)."""
    lo, hi = -int(12 * t) - 5, int(12 * t) + 5
    k = np.arange(lo, hi + 1)
    p = _pmf(mechanism, t, k)
    missing = 1 - p.sum()  # the tails beyond ±(12t + 5), pooled into the end cells
    p[0] += missing / 2
    p[-1] += missing / 2
    counts = np.bincount(np.clip(draws, lo, hi) - lo, minlength=len(k))
    expected = p / p.sum() * len(draws)
    keep = expected >= 20
    pooled_obs = np.r_[counts[keep], counts[~keep].sum()]
    pooled_exp = np.r_[expected[keep], expected[~keep].sum()]
    return float(stats.chisquare(pooled_obs, pooled_exp).pvalue)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_cell_pmf_matches_scipy_and_sums_to_one(mechanism: str) -> None:
    t = 3.7
    k = np.arange(-400, 401)
    ours = np.exp(cell_log_pmf(mechanism, scale=t, grid=UNIT, k=k))
    np.testing.assert_allclose(ours, _pmf(mechanism, t, k), rtol=1e-9, atol=1e-300)
    assert ours.sum() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_exact_sampler_matches_its_pmf_over_a_million_draws(
    mechanism: str, first_pass: str
) -> None:
    t = 3.7  # cells of about a quarter scale: the rounding matters
    draws = discrete_noise(
        1_000_000, mechanism=mechanism, scale=t, grid=UNIT, generator=make_generator(seed=19)
    ).numpy()
    # a fixed seed: p < 1e-6 under the true law has probability 1e-6
    assert _chi_square(draws, mechanism, t) > 1e-6
    # power: the same draws against the law at a scale 3% off are rejected (the gap in
    # chi-square, ~900 at a million draws, is far beyond the critical value ~90)
    assert _chi_square(draws, mechanism, t * 1.03) < 1e-6


@pytest.mark.parametrize(
    ("mechanism", "t"), [(m, t) for m in MECHANISMS for t in (3.7, 2.0**27, 2.0**36)]
)
def test_the_secure_chunked_path_draws_the_same_law(
    mechanism: str, t: float, first_pass: str
) -> None:
    # a SecureGenerator fills a reused buffer chunk by chunk (more than one chunk here); at
    # t = 2^27 a few draws per million reach interval arithmetic, and the cells are compared
    # through the CDF's values (the PMF at 2^27 cells is flat at this sample size). The three
    # t span the first pass's choice of k (23, 10 and 6, where about a quarter is in doubt).
    n = 3 * exact._CHUNK // 2
    draws = discrete_noise(
        n, mechanism=mechanism, scale=t, grid=UNIT, generator=SecureGenerator()
    ).numpy()
    if t < 10:
        assert _chi_square(draws, mechanism, t) > 1e-6  # p < 1e-6 w.p. 1e-6 (fresh keys)
        return
    folded = 1.0 - SCIPY_TAIL[mechanism](np.abs(draws) / t)  # ≈ uniform: P(|Z| ≤ |K|/t)
    assert stats.kstest(folded, "uniform").pvalue > 1e-6
    assert abs(float(np.mean(draws > 0)) - 0.5) < 6 * 0.5 / math.sqrt(n)


def test_keystream_fills_a_reused_buffer_in_place() -> None:
    gen = SecureGenerator()
    buffer = torch.zeros(8 + 2, dtype=torch.int64)
    first = gen.words_into(buffer, 8).clone()
    second = gen.words_into(buffer, 8)
    assert second.data_ptr() == buffer.data_ptr()
    assert not torch.equal(first, second)  # fresh bits every call (equal w.p. 2^-512)
    with pytest.raises(ValueError, match="nbytes"):
        gen.words_into(buffer, 9)  # no room for the keystream's 15 spare bytes
    with pytest.raises(ValueError, match="int64"):
        gen.words_into(torch.zeros(10, dtype=torch.float64), 8)


def test_threads_draw_through_their_own_buffers(first_pass: str) -> None:
    """The chunk buffers are kept between calls, one set per thread: two threads drawing at
    once never share one (a shared buffer would mix their keystreams and cells)."""
    from concurrent.futures import ThreadPoolExecutor

    barrier = threading.Barrier(2)

    def draw(_: int) -> tuple[list[int], np.ndarray]:
        barrier.wait()  # both threads inside at once
        k = discrete_noise(
            3 * exact._CHUNK // 2,
            mechanism="gaussian",
            scale=3.7,
            grid=UNIT,
            generator=SecureGenerator(),
        ).numpy()
        ids = [id(b) for b in exact._scratch()]
        if first_pass == "compiled":
            ids += [id(b) for b in kernels._BUFFERS.arrays]
        k2 = discrete_noise(
            3 * exact._CHUNK // 2,
            mechanism="gaussian",
            scale=3.7,
            grid=UNIT,
            generator=SecureGenerator(),
        ).numpy()
        again = [id(b) for b in exact._scratch()]
        if first_pass == "compiled":
            again += [id(b) for b in kernels._BUFFERS.arrays]
        assert again == ids  # kept within the thread
        return ids, np.concatenate([k, k2])

    with ThreadPoolExecutor(2) as pool:
        (ids_a, a), (ids_b, b) = pool.map(draw, range(2))
    assert not set(ids_a) & set(ids_b)
    for k in (a, b):  # each is the law (p < 1e-6 w.p. 1e-6, fresh keys)
        assert _chi_square(k, "gaussian", 3.7) > 1e-6


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_the_slow_exact_paths_draw_the_same_law(
    mechanism: str, monkeypatch: pytest.MonkeyPatch, first_pass: str
) -> None:
    # widen both float margins so that most draws go through the second pass and about a
    # tenth of those through interval arithmetic
    monkeypatch.setattr(exact, "_FIRST_MARGIN", 0.45 / 2.5)
    monkeypatch.setattr(exact, "_SECOND_MARGIN", 0.05 / 2.5)
    t = 2.5
    draws = discrete_noise(
        4_000, mechanism=mechanism, scale=t, grid=UNIT, generator=make_generator(seed=3)
    ).numpy()
    assert _chi_square(draws, mechanism, t) > 1e-6


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_interval_decisions_agree_with_high_precision(mechanism: str) -> None:
    """V just either side of a cell boundary S((j + ½)/t): the interval decision is exact."""
    law, t, j = cell_law(mechanism), 2.75, 3
    mpmath.mp.prec = 400
    u = mpmath.mpf(2 * j + 1) / 2 / mpmath.mpf(t)
    boundary = {
        "alm": 2 / (1 + mpmath.exp(u)),
        "laplace": mpmath.exp(-u),
        "gaussian": mpmath.erfc(u / mpmath.sqrt(2)),
    }[mechanism]
    bits = 200
    below = int(mpmath.floor(boundary * 2**bits)) - 3  # V < S(j + ½): cell j + 1
    above = int(mpmath.floor(boundary * 2**bits)) + 3  # V > S(j + ½): cell j
    gen = make_generator(seed=0)
    assert exact_passes._decide(law, t, below, bits, j, gen) == j + 1
    assert exact_passes._decide(law, t, above, bits, j, gen) == j
    # a wrong guess is walked to the right cell
    assert exact_passes._decide(law, t, above, bits, j + 2, gen) == j
    mpmath.mp.prec = 53


@pytest.mark.parametrize("x", [0.0, 0.3, 1.7, 4.0, 9.5])
def test_rigorous_erfc_encloses_mpmath(x: float) -> None:
    with _iv_precision(120):
        enclosure = exact._erfc_interval(mpmath.iv.mpf(x))
    lo, hi = (exact_passes._fraction(e) for e in enclosure._mpi_)
    mpmath.mp.prec = 300
    truth = mpmath.erfc(mpmath.mpf(x))
    mpmath.mp.prec = 53
    assert lo <= exact_passes._fraction(mpmath.mpf(truth)._mpf_) <= hi or lo <= hi
    assert float(lo) <= float(truth) <= float(hi)
    assert float(hi - lo) <= 1e-30 * max(float(truth), 1e-300) + 1e-300


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_float_inverse_tails_are_within_the_claimed_bound(mechanism: str) -> None:
    """The fast path's error bound (relative 2⁻⁴⁴ plus absolute 2⁻⁴⁸, and the first pass's
    2⁻⁵²/V) holds with room to spare against mpmath at 200 bits."""
    law = cell_law(mechanism)
    rng = np.random.default_rng(0)
    v = np.concatenate(
        [rng.random(200), 2.0 ** -rng.uniform(0, 40, 200), 1 - 2.0 ** -rng.uniform(1, 50, 100)]
    )
    # (below 2⁻⁴⁰ the first pass's margin t·2⁻⁴⁸/V exceeds 1/2: every such draw is decided
    # by the later passes, whatever the float inverse returns)
    v = np.clip(v, 2.0**-40, 1.0)
    fast = law.inverse_tail_(torch.tensor(v)).numpy()
    first = law.first_pass_(torch.tensor(v), 1.0).numpy()
    mpmath.mp.prec = 120
    for vi, fi, pi in zip(v, fast, first, strict=True):
        m = mpmath.mpf(float(vi))
        true = {
            "alm": mpmath.log(2 / m - 1),
            "laplace": -mpmath.log(m),
            "gaussian": mpmath.sqrt(2) * mpmath.erfinv(1 - m),
        }[mechanism]
        assert abs(fi - true) <= 2.0**-48 * abs(true) + 2.0**-52
        assert abs(pi - true) <= 2.0**-44 * abs(true) + 2.0**-48 + 2.0**-52 / vi
    mpmath.mp.prec = 53


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_compiled_inverse_tails_are_within_the_first_pass_bound(mechanism: str) -> None:
    """The compiled first pass computes x = t·S⁻¹(V) with its own log and, for the Gaussian,
    AS 241: within the bound its margin assumes (2⁻⁴⁴·x + 2⁻⁴⁸ + 2⁻⁵²/V at t = 1) against
    mpmath at 120 bits, over V from the word the kernel reads (|float(w)|/2⁶³), both signs,
    both sides of AS 241's branch points (V = 0.15, and V/2 = e⁻²⁵) and down to 2⁻⁴⁰."""
    rng = np.random.default_rng(1)
    near = 1 + rng.uniform(-1e-3, 1e-3, 50)
    v = np.concatenate(
        [
            rng.random(400),
            2.0 ** -rng.uniform(0, 40, 400),
            1 - 2.0 ** -rng.uniform(1, 50, 100),
            0.15 * near,
            2 * math.exp(-25) * near,
            [1.0],
        ]
    )
    words = np.minimum(np.round(v * 2.0**63), 2.0**63 - 1024).astype(np.int64)
    words[::2] *= -1
    used = np.abs(words.astype(np.float64)) * 2.0**-63
    x = kernels.inverse_x(mechanism, words, 1.0)
    mpmath.mp.prec = 120
    for vi, xi in zip(used, x, strict=True):
        m = mpmath.mpf(float(vi))
        true = {
            "alm": mpmath.log(2 / m - 1),
            "laplace": -mpmath.log(m),
            "gaussian": mpmath.sqrt(2) * mpmath.erfinv(1 - m),
        }[mechanism]
        assert abs(xi - true) <= 2.0**-44 * abs(true) + 2.0**-48 + 2.0**-52 / vi, (vi, xi)
    mpmath.mp.prec = 53
    if mechanism == "gaussian":  # the plain-Python form agrees with the compiled loop
        assert kernels.gaussian_tail_inverse(float(used[0])) == pytest.approx(x[0], rel=1e-14)


@pytest.mark.parametrize(("mechanism", "t"), [(m, t) for m in MECHANISMS for t in (3.7, 2.0**20)])
def test_compiled_and_tensor_first_passes_draw_the_same_cells(
    mechanism: str, t: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the same seeded words both first passes give the same K: they compute the same x
    within the bound, so they can differ only for a draw within that bound of the margin
    (about one in 2⁴⁰ here), which the later passes would decide alike anyway."""
    draws = {}
    for compiled in (True, False):
        monkeypatch.setattr(exact, "_USE_KERNELS", compiled)
        draws[compiled] = discrete_noise(
            200_000, mechanism=mechanism, scale=t, grid=UNIT, generator=make_generator(seed=5)
        )
    assert torch.equal(draws[True], draws[False])
    assert int(draws[True].abs().max()) > 3 * t  # not a degenerate output


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("shift", [1, 3])
def test_profiles_match_direct_summation_and_stay_below_the_continuous(
    mechanism: str, shift: int
) -> None:
    t = 4.0
    pld = cell_pld(mechanism, scale=t, grid=UNIT, shift=shift, value_discretization_interval=1e-5)
    for epsilon in (0.05, 0.2, 0.5):
        direct = cell_delta(mechanism, epsilon=epsilon, scale=t, grid=UNIT, shift=shift)
        # dp_accounting's pessimistic PLD from the two PMFs: above the sum, by what rounding
        # each loss up by < 1e-5 can add (measured ≤ 0.2% at 1e-4; 0.1% bounds it at 1e-5)
        assert direct - 1e-12 <= pld.get_delta_for_epsilon(epsilon) <= direct * 1.001 + 1e-9
        # rounding is post-processing: never above the continuous profile at the same shift
        continuous = {
            "alm": analysis.logistic_delta,
            "laplace": analysis.laplace_delta,
            "gaussian": analysis.gaussian_delta,
        }[mechanism](epsilon=epsilon, scale=t, sensitivity=float(shift))
        assert direct <= continuous + 1e-12


def test_cell_delta_is_the_hockey_stick_sum_by_hand() -> None:
    t, shift, epsilon = 2.0, 2, 0.3
    k = np.arange(-200, 201)
    p, q = _pmf("laplace", t, k), _pmf("laplace", t, k - shift)
    by_hand = float(np.maximum(p - math.exp(epsilon) * q, 0).sum())
    ours = cell_delta("laplace", epsilon=epsilon, scale=t, grid=UNIT, shift=shift)
    assert ours == pytest.approx(by_hand, rel=1e-9)


@pytest.mark.parametrize(("norm", "dim"), [("l1", 1), ("l1", 650), ("l2", 1290), ("l2", 10**6)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_grids_cost_under_one_percent_and_are_exact_in_the_dtype(
    norm: str, dim: int, dtype: torch.dtype
) -> None:
    grid = grid_for(sensitivity=1.3, norm=norm, dim=dim, dtype=dtype)
    weight = dim if norm == "l1" else math.sqrt(dim)
    assert math.frexp(grid.gamma)[0] == 0.5  # a power of two
    inflation = inflated_sensitivity(sensitivity=1.3, norm=norm, dim=dim, grid=grid) / 1.3 - 1
    assert INFLATION / 2 < inflation <= INFLATION + 1e-15 and weight * grid.gamma <= 1.3 * INFLATION
    # every output integer within the range is exactly representable after dequantizing
    m = torch.tensor([-grid.limit, -grid.limit + 1, -3, 0, 7, grid.limit - 1, grid.limit])
    out = dequantize(m, grid=grid, dtype=dtype)
    assert torch.equal(out.double() / grid.gamma, m.double())
    # beyond the range, outputs are clamped (post-processing), never rounded
    assert float(dequantize(torch.tensor([grid.limit + 5]), grid=grid, dtype=dtype)) == (
        grid.limit * grid.gamma
    )


def test_quantize_clamps_and_rounds_to_the_grid() -> None:
    grid = Grid(exponent=-3, limit=2**10, bound=2**9)
    v = torch.tensor([0.06, 0.07, -0.3, 1e9, float("-inf")])
    assert quantize(v, grid=grid).tolist() == [0, 1, -2, 512, -512]
    with pytest.raises(ValueError, match="NaN"):
        quantize(torch.tensor([float("nan")]), grid=grid)


def test_plan_release_widens_the_grid_when_float32_cannot_hold_the_noise() -> None:
    mech = create_mechanism("alm")
    narrow = plan_release(
        mechanism=mech, epsilon=1e-3, delta=0.0, sensitivity=1.0, dim=10, dtype=torch.float32
    )
    wide = plan_release(
        mechanism=mech, epsilon=1e-3, delta=0.0, sensitivity=1.0, dim=10, dtype=torch.float64
    )
    assert narrow.grid.gamma > wide.grid.gamma
    assert narrow.scale / narrow.grid.gamma * 40 <= narrow.grid.limit - narrow.grid.bound
    assert wide.sensitivity <= 1.0 * (1 + INFLATION)
    assert narrow.scale == pytest.approx(narrow.sensitivity / 1e-3)


def test_plan_release_never_widens_the_grid_past_the_dtype_range() -> None:
    # Issue 36: float16's noise did not fit, γ was doubled past 2^4, and γ·2^11 = 2^16 is
    # beyond float16's largest float: the release shipped ±inf.
    mech = create_mechanism("laplace")
    plan = plan_release(
        mechanism=mech, epsilon=0.01, delta=0.0, sensitivity=100.0, dim=4, dtype=torch.float16
    )
    assert plan.grid.exponent == max_exponent(torch.float16) == 4
    assert plan.grid.gamma * plan.grid.limit <= torch.finfo(torch.float16).max
    released = exact.exact_release(
        torch.zeros(1000, dtype=torch.float16),
        mechanism=mech,
        scale=plan.scale,
        grid=plan.grid,
        generator=make_generator(seed=0),
    )
    assert bool(torch.isfinite(released).all())
    assert float(released.abs().max()) == 2.0**15  # clamped at γ·2^11 (post-processing)


def test_grid_for_refuses_a_step_no_dtype_holds_instead_of_overflowing() -> None:
    # Issue 36: grid_for(sensitivity=1e300) raised OverflowError comparing 2^(e + p) as a float.
    with pytest.raises(
        ValueError,
        match=r"sensitivity=1e\+300 over dim=1 needs a grid step "
        r"2\^989, outside what torch.float64",
    ):
        grid_for(sensitivity=1e300, norm="l1", dim=1)
    with pytest.raises(ValueError, match=r"expected a step in \[2\^-14, 2\^4\]"):
        grid_for(sensitivity=1e4, norm="l1", dim=1, dtype=torch.float16)
    big = grid_for(sensitivity=1e290, norm="l1", dim=1)  # still representable: a valid grid
    assert big.exponent == max_exponent(torch.float64) - 14
    assert math.isfinite(big.gamma * big.limit)
    tiny = grid_for(sensitivity=1e-300, norm="l1", dim=1)
    assert tiny.exponent >= min_exponent(torch.float64)
    with pytest.raises(ValueError, match=r"outside what torch\.float64"):
        grid_for(sensitivity=1e-307, norm="l1", dim=1)


@pytest.mark.parametrize("norm", ["l1", "l2"])
def test_integer_clipping_enforces_the_cell_radius_exactly(norm: str) -> None:
    grid = Grid(exponent=-6, limit=2**53, bound=2**52)
    dim, clip = 30, 0.5
    radius = cell_radius(max_grad_norm=clip, norm=norm, dim=dim, grid=grid)
    g = torch.Generator().manual_seed(0)
    raw = torch.randn(200, dim, generator=g, dtype=torch.float64)
    order = 1 if norm == "l1" else 2
    clipped = raw * (clip / raw.norm(order, dim=1, keepdim=True)).clamp(max=1.0)
    # push a few just past the bound, as float error could
    clipped[:5] *= 1 + 1e-3
    (cells,) = clip_to_cells([clipped], grid=grid, norm=norm, radius=radius)
    assert torch.equal(cells, torch.round(cells))  # integers
    for row in cells.to(torch.int64).tolist():  # exact, in Python integers
        size = sum(abs(c) for c in row) if norm == "l1" else math.sqrt(sum(c * c for c in row))
        assert size <= radius
    # examples within the bound are only rounded (≤ ½ cell per coordinate)
    assert (cells[5:].double() - clipped[5:] / grid.gamma).abs().max() <= 0.5


def test_bad_scales_and_mechanisms_are_refused() -> None:
    with pytest.raises(ValueError, match="scale=-1"):
        discrete_noise(3, mechanism="alm", scale=-1.0, grid=UNIT, generator=SecureGenerator())
    with pytest.raises(ValueError, match="int64 range"):
        discrete_noise(3, mechanism="alm", scale=2.0**60, grid=UNIT, generator=SecureGenerator())
    with pytest.raises(ValueError, match="unknown"):
        discrete_noise(3, mechanism="nope", scale=1.0, grid=UNIT, generator=SecureGenerator())
    with pytest.raises(ValueError, match="dim=0"):
        grid_for(sensitivity=1.0, norm="l1", dim=0)


# --- the keystream and exact Bernoulli draws -------------------------------------------------


def test_keystream_bytes_are_uniform_and_streams_independent() -> None:
    stream = KeyStream()
    data = np.frombuffer(bytes(stream.read(1 << 20)), dtype=np.uint8)
    counts = np.bincount(data, minlength=256)
    assert stats.chisquare(counts).pvalue > 1e-6  # fresh keys: p < 1e-6 w.p. 1e-6
    assert stream.read(64) != KeyStream().read(64)
    # copies and unpickled copies rekey: never the same bits twice
    assert copy.deepcopy(stream).read(64) != stream.read(64)
    assert pickle.loads(pickle.dumps(stream)).read(64) != stream.read(64)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_rekeys() -> None:
    stream = KeyStream()
    stream.read(16)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next bytes, to the parent
        os.write(write, bytes(stream.read(32)))
        os._exit(0)
    os.close(write)
    child = os.read(read, 32)
    os.waitpid(pid, 0)
    assert child != bytes(stream.read(32))


@pytest.mark.parametrize("p", [0.0, 0.3, 2.0**-40, 1.0])
def test_bernoulli_is_exact_at_the_float_given(p: float) -> None:
    draws = bernoulli(2_000_000, probability=p, generator=SecureGenerator())
    hits = int(draws.sum())
    if p in (0.0, 1.0):
        assert hits == int(p * 2_000_000)
    else:  # binomial test; fresh bits: p-value below 1e-6 with probability 1e-6
        assert stats.binomtest(hits, 2_000_000, p).pvalue > 1e-6
    with pytest.raises(ValueError, match=r"probability=1\.5"):
        bernoulli(3, probability=1.5, generator=SecureGenerator())


def test_bernoulli_ties_draw_more_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A uniform whose first 63 bits equal q's goes on to compare further bits."""
    from alm_opacus.mechanisms import sampling

    q = 0.3 * 2.0**-20  # its binary expansion runs past 63 bits
    head = math.floor(sampling.Fraction(q) * 2**63)
    rest = sampling.Fraction(q) * 2**63 - head
    # the tie's continuation: bits just below / above q's next 63 bits
    nxt = math.floor(rest * 2**63)
    assert 0 < nxt < 2**63 - 1
    for word, expected in ((nxt - 1, True), (nxt + 1, False)):
        seq = iter([head, word])

        def scripted(n: int, generator: object, seq: object = seq) -> torch.Tensor:
            return torch.tensor([next(seq) for _ in range(n)], dtype=torch.int64)  # type: ignore[call-overload]

        monkeypatch.setattr(sampling, "uniform_words", scripted)
        draw = sampling.bernoulli(1, probability=q, generator=make_generator(seed=0))
        assert bool(draw[0]) is expected


def test_special_erfc_reference_sanity() -> None:
    # the scipy tail used as the independent reference agrees with erfc (guards the tests)
    u = np.linspace(0, 8, 17)
    np.testing.assert_allclose(SCIPY_TAIL["gaussian"](u), special.erfc(u / np.sqrt(2)), rtol=1e-13)


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian", "gaussian-classic"])
@pytest.mark.parametrize("dim", [1, 21, 5130, 10**6])
@pytest.mark.parametrize("sensitivity", [1e-6, 0.37, 1e6])
def test_smallest_epsilon_is_where_the_exact_draw_stops(
    mechanism: str, dim: int, sensitivity: float
) -> None:
    from alm_opacus.mechanisms import create_mechanism
    from alm_opacus.mechanisms.exact import plan_release
    from alm_opacus.mechanisms.grid import cells_per_scale, smallest_epsilon

    delta = 0.0 if mechanism == "laplace" else 1e-9
    floor = smallest_epsilon(dim=dim, delta=delta)
    law = create_mechanism(mechanism)

    def steps(epsilon: float) -> float:
        plan = plan_release(
            mechanism=law, epsilon=epsilon, delta=delta, sensitivity=sensitivity, dim=dim
        )
        return cells_per_scale(plan.scale, plan.grid)

    assert steps(floor) <= 2.0**52  # at the floor: drawable
    if mechanism == "laplace" or (mechanism == "gaussian-classic" and dim < 42):
        # the binding law: within a factor 3 of the floor, the draw leaves the int64 range
        with pytest.raises(ValueError, match="beyond the int64 range"):
            steps(floor / 4)
