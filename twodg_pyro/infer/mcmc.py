r"""A reference posterior by Hamiltonian Monte Carlo: Pyro's NUTS (or HMC) on a
:class:`~twodg_pyro.bnn.BNNModel`, full batch.

The target is the model's own unnormalised posterior over the flat vector :math:`w \in
\mathbb R^{n_w}` of its Bayesian tensors, with the model's prior and likelihood objects
(:meth:`~twodg_pyro.bnn.SiteTensors.prior_distribution`,
:meth:`~twodg_pyro.likelihoods.Likelihood.distribution`):

.. math::
    U(w) = -\log p(w) - \frac1T \sum_{n=1}^{N} \log p(y_n \mid f_w(x_n)),
    \qquad \pi(w) \propto e^{-U(w)},

on all ``N`` training examples at once (no minibatch: HMC needs the exact gradient),
:math:`T = 1` unless tempered (Wenzel et al. 2020).  :func:`run_mcmc` runs ``num_chains``
chains of ``warmup_steps`` adaptation steps (step size by dual averaging, a diagonal mass
matrix) and ``num_samples`` kept steps each, keeps every ``thin``-th draw, and returns an
:class:`MCMCPosterior`: the thinned draws of every chain, the sampler's statistics
(divergences, tree depth, step size, energy, log density) and the settings.  The
posterior predicts like the ensemble does, by the average of its draws' class
probabilities,

.. math:: p(y \mid x, \mathcal D) \approx \frac1S \sum_{s=1}^{S}
    \mathrm{softmax}(f_{w_s}(x)),

so that :func:`~twodg_pyro.baselines.draw_probs`, the uncertainty report, ``twodg-pyro
evaluate`` and the model files (:func:`~twodg_pyro.io.save_baseline`) take it.

The potential is one function of the flat vector
(:func:`torch.func.functional_call` through
:meth:`~twodg_pyro.bnn.BNNModel.network_forward`), which Pyro's kernels take as
``potential_fn`` (optionally JIT-compiled): on the digits MLP it is several times faster
than tracing the Pyro program at every leapfrog step.  Chains run one after the other,
each seeded with ``seed + chain`` (on two shared CPU cores, parallel chains do not pay).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Literal

import pyro
import torch
from pyro.infer.mcmc import HMC, MCMC, NUTS
from torch import nn

from ..baselines.draws import DrawBaseline
from .mcmc_potential import FlatPotential, chain_forward, flat_potential, linear_chain

__all__ = [
    "DEFAULT_MAX_PARAMS",
    "FlatPotential",
    "MCMCPosterior",
    "TooLargeForMCMCError",
    "chain_forward",
    "flat_potential",
    "linear_chain",
    "run_mcmc",
]

McmcKernel = Literal["nuts", "hmc"]
#: The largest number of Bayesian scalars :func:`run_mcmc` accepts unless told more
#: (``max_params``): full-batch NUTS on a CPU needs minutes per thousand dimensions.
DEFAULT_MAX_PARAMS = 5000
#: The sampler statistics kept per draw (ArviZ's ``sample_stats`` names).
#: Draws run through the network at once.
_CHUNK = 100
STAT_NAMES = ("diverging", "tree_depth", "n_steps", "step_size", "energy", "lp", "accept_prob")


class TooLargeForMCMCError(ValueError):
    """The network has more Bayesian scalars than :func:`run_mcmc` was allowed."""


class _Recording:
    """Mixin of Pyro's HMC / NUTS kernels that keeps, for every iteration, the statistics
    ArviZ's ``sample_stats`` names (Pyro keeps only the divergences' indices)."""

    def _reset_stats(self) -> None:
        self.stats: dict[str, list[float]] = {k: [] for k in STAT_NAMES}

    def _sample_r(self, name):
        r, r_unscaled = super()._sample_r(name)
        _, pe, _ = self._fetch_from_cache()
        if pe is not None:
            self._energy = float(self._kinetic_energy(r_unscaled) + pe)
        return r, r_unscaled

    def _build_basetree(self, *args, **kwargs):
        self._leapfrogs += 1
        tree = super()._build_basetree(*args, **kwargs)
        self._diverged = self._diverged or bool(tree.diverging)
        return tree

    def _build_tree(self, z, r, z_grads, log_slice, direction, tree_depth, energy_current):
        self._depth = max(self._depth, int(tree_depth) + 1)
        return super()._build_tree(z, r, z_grads, log_slice, direction, tree_depth, energy_current)

    def sample(self, params):
        if not hasattr(self, "stats"):
            self._reset_stats()
        self._leapfrogs, self._depth, self._diverged = 0, 0, False
        self._energy = math.nan
        n_div = len(self._divergences)
        step_size = float(self.step_size)  # the step this iteration integrates with
        hmc_steps = None if isinstance(self, NUTS) else int(self.num_steps)
        out = super().sample(params)
        _, pe, _ = self._fetch_from_cache()
        if not isinstance(self, NUTS):  # HMC: a fixed trajectory, its divergence noted by Pyro
            self._leapfrogs = hmc_steps
            self._diverged = self._diverged or len(self._divergences) > n_div
        s = self.stats
        s["diverging"].append(float(self._diverged))
        s["tree_depth"].append(float(self._depth))
        s["n_steps"].append(float(self._leapfrogs))
        s["step_size"].append(step_size)
        s["energy"].append(self._energy)
        s["lp"].append(-float(pe) if pe is not None else math.nan)
        s["accept_prob"].append(float(self._mean_accept_prob))
        return out


class RecordingNUTS(_Recording, NUTS):
    """Pyro's :class:`~pyro.infer.mcmc.NUTS` keeping the per-iteration statistics."""

    def _build_basetree(self, *args, **kwargs):
        return _Recording._build_basetree(self, *args, **kwargs)


class RecordingHMC(_Recording, HMC):
    """Pyro's :class:`~pyro.infer.mcmc.HMC` keeping the per-iteration statistics."""

    def _build_basetree(self, *args, **kwargs):  # HMC has no trees
        raise NotImplementedError

    def _build_tree(self, *args, **kwargs):
        raise NotImplementedError


class MCMCPosterior(DrawBaseline):
    r"""The draws of :func:`run_mcmc`: ``C`` chains of ``D`` thinned draws of the model's
    Bayesian tensors, predicting by the average of their class probabilities.

    Args:
        model: the :class:`~twodg_pyro.bnn.BNNModel` (its network runs the draws).
        draws: ``(C, D, n_w)`` flat draws (the sites in the model's order).
        sample_stats: ``{name: (C, D)}`` sampler statistics of the kept draws
            (:data:`STAT_NAMES`).
        settings: how they were drawn (kernel, steps, seed, seconds, ...), JSON-able.

    Raises:
        ValueError: draws of another length than the model's ``n_w``, or not 3-D.
    """

    def __init__(self, model, draws: torch.Tensor, sample_stats: dict, settings: dict):
        super().__init__()
        if draws.dim() != 3 or draws.shape[-1] != model.num_weights:
            raise ValueError(
                f"MCMC draws must be (chains, draws, {model.num_weights}) for this model, got "
                f"{tuple(draws.shape)}"
            )
        self.model = model
        self.register_buffer("draws", draws.detach().clone())
        self.sample_stats = {
            k: torch.as_tensor(v).detach().clone() for k, v in sample_stats.items()
        }
        self.settings = dict(settings)

    @property
    def net(self) -> nn.Module:
        """The network the draws run through."""
        return self.model.net

    @property
    def dtype(self) -> torch.dtype:
        return self.draws.dtype

    @property
    def num_chains(self) -> int:
        return int(self.draws.shape[0])

    @property
    def num_draws(self) -> int:
        """All kept draws, over the chains: ``C D``."""
        return int(self.draws.shape[0] * self.draws.shape[1])

    def draws_per_prediction(self, num_samples: int) -> int:
        """All its kept draws ``C D``, as the run's table predicts it."""
        return self.num_draws

    def num_params(self) -> int:
        """Floating-point numbers stored: the ``C D`` draws of ``n_w`` scalars."""
        return int(self.draws.numel())

    def site_draws(self) -> dict[str, torch.Tensor]:
        """``{site: (C, D, *site.shape)}``: the draws per Bayesian tensor."""
        out, a = {}, 0
        for s in self.model.sites:
            out[s.name] = self.draws[..., a : a + s.numel].reshape(*self.draws.shape[:2], *s.shape)
            a += s.numel
        return out

    def pick(self, num_samples: int | None) -> torch.Tensor:
        """Indices into the pooled ``C D`` draws: all of them when ``num_samples`` is
        ``None`` or at least ``C D``, else ``num_samples`` evenly spaced ones (so that
        every chain contributes; nothing is random)."""
        total = self.num_draws
        if num_samples is None or int(num_samples) >= total:
            return torch.arange(total)
        if int(num_samples) < 1:
            raise ValueError(f"num_samples must be at least 1, got {num_samples!r}")
        return torch.linspace(0, total - 1, int(num_samples)).round().long()

    def chain_probs(self, x, batch_size: int = 512) -> torch.Tensor:
        """Class probabilities of every kept draw, ``(C, D, N, K)`` on the CPU (for the
        chains' diagnostics)."""
        probs = self.sample_probs(x, num_samples=None, batch_size=batch_size)
        return probs.reshape(*self.draws.shape[:2], *probs.shape[1:])

    def _draws(self, parts, num_samples, seed) -> torch.Tensor:
        index = self.pick(num_samples)
        weights = {k: v.flatten(0, 1)[index] for k, v in self.site_draws().items()}
        out = []
        for xb, _ in parts:
            chunks = []
            for a in range(0, len(index), _CHUNK):
                w = {k: v[a : a + _CHUNK] for k, v in weights.items()}
                n = len(next(iter(w.values())))
                chunks.append(self.model.particle_forward(w, xb, (n,)).softmax(-1).cpu())
            out.append(torch.cat(chunks))
        return torch.cat(out, 1)


def _check_model(model, max_params: int) -> None:
    from ..bnn import require_model

    require_model(model, "run_mcmc", ("sites", "network_forward", "prior_distribution"))
    if model.output_components != 1:
        raise TypeError(f"run_mcmc takes a BNNModel, got a {type(model).__name__}")
    n = model.num_weights
    if n > int(max_params):
        raise TooLargeForMCMCError(
            f"the network has n_w = {n:,} Bayesian scalars, more than the {int(max_params):,} "
            f"run_mcmc accepts (full-batch NUTS costs minutes per thousand dimensions on a "
            f"CPU and mixes badly in many): use a smaller network, or raise the limit with "
            f"run_mcmc(..., max_params={n}) (settings: mcmc.max_params = {n})"
        )
    fixed = [name for name, _ in model.pyro_parameters()]
    if fixed:
        raise ValueError(
            f"run_mcmc samples every parameter; the network has point-estimated ones "
            f"{fixed[:3]} (make them Bayesian sites or remove them)"
        )


def run_mcmc(
    model,
    data: Iterable | tuple,
    *,
    kernel: McmcKernel = "nuts",
    num_samples: int = 500,
    warmup_steps: int = 500,
    num_chains: int = 4,
    thin: int = 1,
    seed: int = 0,
    init: Literal["network", "prior"] = "prior",
    init_scale: float = 0.1,
    target_accept_prob: float = 0.8,
    max_tree_depth: int = 10,
    step_size: float = 1e-2,
    num_steps: int = 32,
    temperature: float = 1.0,
    jit_compile: bool = False,
    max_params: int = DEFAULT_MAX_PARAMS,
    progress: bool = False,
) -> MCMCPosterior:
    r"""Sample ``model``'s posterior on all of ``data`` with Pyro's NUTS (or HMC).

    Args:
        model: a :class:`~twodg_pyro.bnn.BNNModel` whose likelihood is scaled for all of
            ``data`` (``dataset_size = N``).
        data: the training data, ``(X, y)``, a data set or batches (one full batch).
        kernel: ``"nuts"`` (the No-U-Turn sampler, adapting its trajectory length) or
            ``"hmc"`` (``num_steps`` leapfrog steps per iteration).
        num_samples: iterations kept per chain after warm-up (before thinning).
        warmup_steps: adaptation iterations per chain (step size by dual averaging to
            ``target_accept_prob``, a diagonal mass matrix), discarded.
        num_chains: independent chains (at least 2 for R-hat), run one after the other.
        thin: keep every ``thin``-th iteration: ``num_samples // thin`` draws per chain.
        seed: chain ``c`` is seeded with ``seed + c`` (its initial point and its sampler).
        init: where chains start: ``"prior"`` (the prior draws times ``init_scale``,
            per chain: dispersed starts, as R-hat needs) or ``"network"`` (the network's
            current values plus ``init_scale`` times a standard Normal).
        init_scale: see ``init``.
        target_accept_prob, max_tree_depth: NUTS's adaptation target and tree limit.
        step_size: the initial step size (adapted during warm-up).
        num_steps: HMC's leapfrog steps per iteration.
        temperature: :math:`T` of the likelihood (1: the Bayes posterior).
        jit_compile: JIT-compile the potential and its gradient (PyTorch's tracer).
        max_params: the largest :math:`n_w` accepted.
        progress: Pyro's progress bar.

    Returns:
        an :class:`MCMCPosterior` (``settings`` records the arguments, the seconds of
        each chain and the post-warm-up divergences).

    Raises:
        TooLargeForMCMCError: :math:`n_w` > ``max_params`` (naming both and the way to
            raise the limit).
        ValueError: a setting out of range (named), unlabelled data, a likelihood scaled
            for another number of examples, point-estimated network parameters.
    """
    for name, value, low in (
        ("num_samples", num_samples, 1),
        ("warmup_steps", warmup_steps, 0),
        ("num_chains", num_chains, 1),
        ("thin", thin, 1),
        ("max_tree_depth", max_tree_depth, 1),
        ("num_steps", num_steps, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if kernel not in ("nuts", "hmc"):
        raise ValueError(f"kernel must be 'nuts' or 'hmc', got {kernel!r}")
    if init not in ("prior", "network"):
        raise ValueError(f"init must be 'prior' or 'network', got {init!r}")
    if num_samples < thin:
        raise ValueError(f"thin = {thin} keeps no draw of num_samples = {num_samples}")
    for name, value in (
        ("init_scale", init_scale),
        ("step_size", step_size),
        ("temperature", temperature),
    ):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive number, got {value!r}")
    if not 0 < target_accept_prob < 1:
        raise ValueError(f"target_accept_prob must be in (0, 1), got {target_accept_prob!r}")
    _check_model(model, max_params)
    model.eval()
    potential = flat_potential(model, data, temperature)
    like = model.site_parameter(0)
    start = potential.flatten(model.initial_values()).to(like)

    chains, stats, seconds, divergences, leapfrogs = [], {k: [] for k in STAT_NAMES}, [], [], []
    for c in range(num_chains):
        pyro.set_rng_seed(int(seed) + c)
        if init == "prior":
            w0 = torch.cat([p.sample().reshape(-1) for p in potential.priors]).to(like)
            w0 = w0 * init_scale
        else:
            w0 = start + init_scale * torch.randn_like(start)
        common = {
            "potential_fn": potential,
            "step_size": float(step_size),
            "adapt_step_size": True,
            "adapt_mass_matrix": True,
            "full_mass": False,
            "jit_compile": bool(jit_compile) and potential.traceable,
            "ignore_jit_warnings": True,
            "target_accept_prob": float(target_accept_prob),
        }
        if kernel == "nuts":
            k = RecordingNUTS(max_tree_depth=int(max_tree_depth), **common)
        else:
            k = RecordingHMC(num_steps=int(num_steps), **common)
        k._reset_stats()
        mc = MCMC(
            k,
            num_samples=int(num_samples),
            warmup_steps=int(warmup_steps),
            initial_params={"w": w0},
            num_chains=1,
            disable_progbar=not progress,
        )
        t0 = time.perf_counter()
        mc.run()
        seconds.append(time.perf_counter() - t0)
        kept = slice(int(warmup_steps), None, int(thin))
        chains.append(mc.get_samples()["w"][:: int(thin)].detach())
        for name in STAT_NAMES:
            stats[name].append(torch.tensor(k.stats[name][kept]))
        divergences.append(len(k._divergences))
        leapfrogs.append(int(sum(k.stats["n_steps"])))
    draws = torch.stack(chains)
    sample_stats = {k: torch.stack(v) for k, v in stats.items()}
    settings = {
        "kernel": kernel,
        "num_samples": int(num_samples),
        "warmup_steps": int(warmup_steps),
        "num_chains": int(num_chains),
        "thin": int(thin),
        "seed": int(seed),
        "init": init,
        "init_scale": float(init_scale),
        "target_accept_prob": float(target_accept_prob),
        "max_tree_depth": int(max_tree_depth),
        "num_steps": int(num_steps),
        "temperature": float(temperature),
        "jit_compile": bool(jit_compile) and potential.traceable,
        "n_train": len(potential.y),
        "num_weights": potential.dim,
        "chain_seconds": seconds,
        "seconds": float(sum(seconds)),
        "divergences": divergences,
        "leapfrog_steps": leapfrogs,
    }
    return MCMCPosterior(model, draws, sample_stats, settings)
