"""``lu`` as a registered method: tuning lambda on public data, the release and its statement.

What the statement claims (``docs/baselines.md``, "Gaps"):

* ``C >= 3``: ``guarantee="none"``. Each answer carries ``C - 1`` noiseless logits, so the
  ratios ``p_i / p_j = exp(z_i - z_j)`` for ``i, j != T`` are released exactly: no finite
  epsilon holds, whatever the chain. The noise was calibrated to the paper's per-query
  epsilon, stated as ``nominal_epsilon``; the paper's numbers are in the notes.
* ``C = 2``: ``per-query``, at the epsilon we can prove (on the grid, by default). An
  answer is a bijection of ``z_1 - z_2 + s_T eta`` with symmetric noise ``eta``, so its law
  does not depend on the selected ``T``; and ``|z_1 - z_2| <= sqrt(2H) B`` for every
  network in the weight ball the training projects onto
  (:func:`~baselines.lu.chain.output_range`). The noise's own privacy loss at sensitivity
  ``2 sqrt(2H) B`` is therefore a proven per-query epsilon, whichever data sets are
  compared. The paper's nominal epsilon is in the notes.

  The shipped answer is exact (:func:`~baselines.lu.net.exact_logits`): the noisy logit
  difference is ``gamma (round(clamp(z_T - z_other)/gamma) + K)`` with ``K`` the exact
  grid-rounded noise, so the epsilon holds for the released floats at the rounded
  sensitivity ``2 sqrt(2H) B + gamma``. ``exact=False`` adds floating-point noise instead
  (opt-in): its statement is ``none`` (Mironov 2012), the proven epsilon kept as nominal.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import Tensor

from alm_opacus.mechanisms import create_mechanism, make_generator
from alm_opacus.mechanisms.exact import inflated_sensitivity
from alm_opacus.methods import (
    MethodContext,
    MethodOptions,
    Predict,
    Release,
    ReleaseRequest,
    ShadowTrainer,
    cli_option,
    register_method,
)
from alm_opacus.plugin import FLOAT_NOTE, SHADOW_DTYPE, Params
from alm_opacus.protect import Guarantee, PrivacyStatement
from baselines._common import (
    PreparedData,
    PublicSplit,
    TunedMethod,
    TuningSpace,
    derive_seed,
    tensor_digest,
)
from baselines.lu.chain import (
    NOISES,
    LuBudget,
    LuSensitivity,
    NoiseName,
    _check_count,
    output_range,
)
from baselines.lu.net import LuConfig, LuMechanism, train_lu_net, train_lu_nets

__all__ = ["TUNING_GRID", "LuMethod", "LuOptions", "lu_statement"]

#: lambda values tuned at each epsilon on public data (their MNIST value first: the default).
TUNING_GRID: tuple[dict[str, float], ...] = (
    {"l2": 0.0005},
    {"l2": 0.005},
    {"l2": 0.05},
    {"l2": 0.5},
)


@dataclass(frozen=True)
class LuOptions(MethodOptions):
    """Options of ``lu``.

    Attributes:
        noise: the noise on the selected logit, ``"laplace"`` or ``"gaussian"``.
        queries: k, the queries the total epsilon in the notes covers.
        l2: fixes lambda (skipping tuning); ``None`` tunes it over :data:`TUNING_GRID`.
        alpha: the tilt of the convexified loss.
        hidden: hidden width.
        steps: full-batch Adam steps.
        lr: Adam learning rate.
        clip_radius: features are clipped to this L2 norm.
        tune: tune lambda on public data (false: the first grid value).
        exact: release the noisy logit on a grid with exact noise (default); False adds
            floating-point noise, and the statement is ``none`` (Mironov 2012).
    """

    noise: NoiseName = "laplace"
    queries: int = cli_option(
        1, help="queries answered by a per-query method: its total epsilon covers this many"
    )
    l2: float | None = None
    alpha: float = 1.0
    hidden: int = 128
    steps: int = 200
    lr: float = 0.01
    clip_radius: float = 1.0
    tune: bool = True
    exact: bool = True

    def __post_init__(self) -> None:
        if self.noise not in NOISES:
            raise ValueError(f"noise={self.noise!r} is invalid: expected one of {NOISES}")
        _check_count(self.queries, "queries")
        self.config()  # validates the network's fields

    def config(self, l2: float | None = None) -> LuConfig:
        """The network recipe, at ``l2`` (default: the fixed ``l2``, else the grid's first)."""
        chosen = l2 if l2 is not None else self.l2 if self.l2 is not None else TUNING_GRID[0]["l2"]
        return LuConfig(
            hidden=self.hidden,
            l2=chosen,
            alpha=self.alpha,
            steps=self.steps,
            lr=self.lr,
            clip_radius=self.clip_radius,
        )


@dataclass
class _Prepared(PreparedData):
    nets: dict[float, Params] = field(default_factory=dict)
    public_nets: dict[float, Params] = field(default_factory=dict)


def _describe(config: LuConfig) -> dict[str, Any]:
    return {
        "l2": config.l2,
        "hidden": config.hidden,
        "alpha": config.alpha,
        "steps": config.steps,
        "lr": config.lr,
    }


def _gaps(chain: LuSensitivity, num_classes: int) -> tuple[str, ...]:
    return (
        "the paper's per-query claim (Lu et al. 2022) is not proven here; gaps: (1) their "
        "Eq. 18 divides the L2 bound 2 rho/(n lambda) by sqrt(|W|), which does not bound each "
        f"weight (understated by up to sqrt(|W|) = {math.sqrt(chain.num_weights):.4g} here)",
        f"(2) with C = {num_classes} >= 3 the C - 1 noiseless logits are released, so ratios "
        "p_i/p_j = exp(z_i - z_j) of outputs other than T are exact: no finite epsilon holds"
        if num_classes >= 3
        else "(2) with C = 2 the only released ratio involves the noisy logit",
        "(3) 2 rho/(n lambda) needs the exact minimiser of a strongly convex average loss; a "
        "hidden-layer network under the tilted (convexified) loss is neither, and training "
        "stops early",
        "(4) Delta_z_T treats the hidden activations as fixed, but the first layer moves too",
        f"rho={chain.rho:.4g} is ours (proven on the weight ball); the paper's Eq. 21 rho is "
        "not a Lipschitz bound (docs/baselines.md)",
    )


def _paper_budget_note(budget: LuBudget, *, queries: int, noise: str) -> str:
    total = queries * budget.per_query
    note = (
        f"noise calibrated to the paper's per query epsilon={budget.per_query:.4g} (selection "
        f"{budget.selection:.4g} + logit {budget.logit:.4g}, basic composition), "
        f"delta={budget.delta:g}; over k={queries} queries: epsilon={total:.4g}, "
        f"delta={queries * budget.delta:g}"
    )
    if noise == "gaussian":
        note += (
            "; the paper's Gaussian split claims epsilon per query by adding squares; basic "
            "composition, stated here, gives the larger value"
        )
    return note


def lu_statement(
    *, mechanism: LuMechanism, config: LuConfig, queries: int, num_classes: int, source: str
) -> PrivacyStatement:
    """What a ``lu`` release may claim (see the module docstring).

    Args:
        mechanism: the chain, budget and noise the answers are drawn with.
        config: the network recipe (its weight ball gives the proven bound for C = 2).
        queries: k, for the totals in the notes.
        num_classes: ``C``.
        source: ``"secure"`` or ``"seeded"``.

    Returns:
        ``none`` (C >= 3, or floating-point noise) or ``per-query`` at the proven epsilon
        (C = 2, exact).
    """
    budget, noise, scale = mechanism.budget, mechanism.noise, mechanism.scale
    notes = [
        _paper_budget_note(budget, queries=queries, noise=noise),
        *_gaps(mechanism.chain, num_classes),
        "every query spends the per-query epsilon; k queries spend k times it",
    ]

    grid = mechanism.grid
    exact: dict[str, Any] = {} if grid is None else {"grid": grid.gamma, "clamp": grid.clamp}

    def statement(**fields: Any) -> PrivacyStatement:
        return PrivacyStatement(
            delta=budget.delta,
            mechanism=f"lu-{noise}",
            noise_scale=scale,
            noise=source,
            **exact,
            **fields,
        )

    if num_classes >= 3:
        return statement(
            epsilon=math.inf,
            guarantee=Guarantee.NONE,
            notes=tuple(notes if grid is not None else [*notes, FLOAT_NOTE]),
            neighbouring="",
            nominal_epsilon=budget.per_query,
        )
    sensitivity = 2.0 * output_range(hidden=config.hidden, weight_radius=config.radius(2))
    mech = create_mechanism(noise)
    rounded = sensitivity
    if grid is not None:  # both neighbours' differences are rounded: S + γ
        rounded = inflated_sensitivity(sensitivity=sensitivity, norm=mech.norm, dim=1, grid=grid)
        exact["grid_sensitivity"] = rounded
    epsilon = mech.epsilon(delta=budget.delta, scale=scale, sensitivity=rounded, dim=1)
    proven = (
        f"proven per query (C = 2): the answer is a bijection of z_1 - z_2 + noise whatever "
        f"logit is selected, and |z_1 - z_2| <= sqrt(2H) B on the weight ball, so the noise "
        f"(scale {scale:.4g}) at sensitivity {rounded:.4g} gives epsilon={epsilon:.4g} for "
        f"any two data sets; over k={queries} queries: epsilon={queries * epsilon:.4g}, "
        f"delta={queries * budget.delta:g}"
    )
    if grid is None:
        return statement(
            epsilon=math.inf,
            guarantee=Guarantee.NONE,
            notes=(proven, *notes, FLOAT_NOTE),
            neighbouring="",
            nominal_epsilon=epsilon,
        )
    proven += (
        f"; exact on the released floats: z_T - z_other is rounded to the grid 2^"
        f"{grid.exponent} with exact noise, and {rounded:.4g} includes the rounding"
    )
    return statement(
        epsilon=epsilon,
        guarantee=Guarantee.PER_QUERY,
        notes=(proven, *notes),
        neighbouring="replace-one",
    )


@register_method("lu")
class LuMethod(TunedMethod[LuOptions, _Prepared, LuConfig]):
    """Lu et al. (2022): convexified-loss network, one noisy logit per query."""

    name: ClassVar[str] = "lu"
    Options = LuOptions
    tuning_grid: ClassVar[tuple[dict[str, Any], ...]] = TUNING_GRID
    post_training: ClassVar[bool] = True

    @property
    def needs_delta(self) -> bool:
        return self.options.noise == "gaussian"

    def prepare(
        self, *, features: Tensor, labels: Tensor, seed: int, context: MethodContext
    ) -> _Prepared:
        return _Prepared.build(features=features, labels=labels, seed=seed, context=context)

    def _net_at(
        self,
        store: dict[float, Params],
        features: Tensor,
        labels: Tensor,
        *,
        config: LuConfig,
        seed: int,
        context: MethodContext,
    ) -> Params:
        """The network of ``config`` on these rows, trained once into ``store``."""
        if config.l2 not in store:
            store[config.l2] = train_lu_net(
                features.to(context.device),
                labels,
                num_classes=context.num_classes,
                config=config,
                seed=seed,
            )
        return store[config.l2]

    def tuning_space(self, prepared: _Prepared, request: ReleaseRequest) -> TuningSpace[LuConfig]:
        """lambda over :data:`TUNING_GRID`, once per (epsilon, delta, noise)."""
        opts = self.options
        return TuningSpace(
            key=(float(request.epsilon), float(request.delta), opts.noise),
            candidates=[opts.config(c["l2"]) for c in TUNING_GRID],
            default=opts.config(),
            describe=_describe,
            fixed="l2" if opts.l2 is not None else None,
            tune=opts.tune,
        )

    def tuning_answers(
        self,
        prepared: _Prepared,
        candidate: LuConfig,
        *,
        split: PublicSplit,
        request: ReleaseRequest,
    ) -> Callable[[int], Tensor]:
        """The public network of ``candidate``; the draws are successive answers from one
        seeded generator."""
        config, epsilon, context = candidate, request.epsilon, request.context
        params = self._net_at(
            prepared.public_nets,
            split.train_features,
            split.train_labels,
            config=config,
            seed=derive_seed("lu-tune-init", prepared.seed),
            context=context,
        )
        mech = LuMechanism.build(
            config,
            n=len(split.train_labels),
            d=int(split.train_features.shape[1]),
            num_classes=context.num_classes,
            epsilon=epsilon,
            delta=request.delta,
            noise=self.options.noise,
            exact=self.options.exact,
        )
        g = make_generator(
            seed=derive_seed("lu-tune", prepared.seed, epsilon, config.l2), device=context.device
        )
        queries = split.validation_features.to(context.device)
        return lambda draw: mech.answer(params, queries, generator=g)[0]

    def release(self, prepared: _Prepared, request: ReleaseRequest) -> Release:
        opts = self.options
        epsilon, context = request.epsilon, request.context
        config, tuning = self.choose(prepared, request)
        params = self._net_at(
            prepared.nets,
            prepared.features,
            prepared.labels,
            config=config,
            seed=prepared.seed,
            context=context,
        )
        mech = LuMechanism.build(
            config,
            n=prepared.n,
            d=int(request.features.shape[1]),
            num_classes=context.num_classes,
            epsilon=epsilon,
            delta=request.delta,
            noise=opts.noise,
            exact=opts.exact,
        )
        generator = request.noise_generator(self.name, device=context.device)

        def predict(x: Tensor) -> Tensor:
            return mech.answer(params, x.to(context.device), generator=generator)[0].float().cpu()

        statement = lu_statement(
            mechanism=mech,
            config=config,
            queries=opts.queries,
            num_classes=context.num_classes,
            source=context.noise.source,
        )
        return Release(
            method=self.name,
            statement=statement,
            predict_proba=predict,
            chosen_config=_describe(config),
            attacker=lambda: self._attacker(
                config=config, mechanism=mech, epsilon=epsilon, context=context
            ),
            attacker_note="adaptive: shadow networks trained with the same recipe, answered "
            "with the released selection temperature and noise scale",
            noise_std=create_mechanism(opts.noise).std(mech.scale),
            info={
                "tuning": tuning.to_info(),
                "chain": mech.chain.to_dict(),
                "budget": mech.budget.to_dict(),
                "noise": opts.noise,
                "queries": opts.queries,
                "epsilon_total": opts.queries * mech.budget.per_query,
                "delta_total": opts.queries * mech.budget.delta,
            },
        )

    def _attacker(
        self,
        *,
        config: LuConfig,
        mechanism: LuMechanism,
        epsilon: float,
        context: MethodContext,
    ) -> ShadowTrainer:
        """The adaptive attacker: the same networks and the same per-query mechanism (the
        networks do not depend on epsilon, so the run's memo shares them across cells)."""
        num_classes = context.num_classes

        def trainer(features: Tensor, labels: Tensor, masks: Tensor, seed: int) -> Predict:
            key = (
                "lu-shadow-nets",
                tensor_digest(features, labels, masks),
                seed,
                config,
                num_classes,
            )
            params = context.memo.get(
                key,
                lambda: train_lu_nets(
                    features,
                    labels,
                    masks=masks,
                    num_classes=num_classes,
                    config=config,
                    seed=seed,
                    dtype=SHADOW_DTYPE,  # 2.4x faster; the released net stays float64
                ),
            )
            g = make_generator(
                seed=derive_seed("lu-shadow", seed, float(epsilon)), device=features.device
            )

            def predict(x: Tensor) -> Tensor:
                return mechanism.answer(params, x.to(features.device), generator=g).float()

            return predict

        return trainer
