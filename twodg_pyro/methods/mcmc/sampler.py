r"""A reference posterior by Hamiltonian Monte Carlo: Pyro's NUTS (or HMC) on a
:class:`~twodg_pyro.bnn.BNNModel`, full batch.

The target is the model's own unnormalised posterior over the flat vector :math:`w \in
\mathbb R^{n_w}` of its Bayesian tensors (:mod:`.potential`),

.. math::
    U(w) = -\log p(w) - \frac1T \sum_{n=1}^{N} \log p(y_n \mid f_w(x_n)),
    \qquad \pi(w) \propto e^{-U(w)},

on all ``N`` training examples at once (no minibatch: HMC needs the exact gradient),
:math:`T = 1` unless tempered (Wenzel et al. 2020).  :func:`run_mcmc` passes its one
settings object (:class:`~twodg_pyro.methods.mcmc.MCMCConfig`) to Pyro's ``MCMC`` and
``NUTS``/``HMC``: ``num_chains`` chains of ``warmup_steps`` adaptation steps and
``num_samples`` kept steps, every ``thin``-th draw kept, and returns an
:class:`~twodg_pyro.methods.mcmc.MCMCPosterior`.  Chains run one after the other, each
seeded with ``seed + chain`` (on two shared CPU cores, parallel chains do not pay).

**The per-iteration statistics** ArviZ's ``sample_stats`` names (divergence, tree depth,
leapfrog steps, step size, energy, log density, acceptance) are not all public in Pyro:
its ``MCMC(hook_fn=...)`` sees the draws only, and ``kernel.logging()`` a rounded step size
and acceptance.  :class:`RecordingNUTS` / :class:`RecordingHMC` therefore override Pyro's
private ``_sample_r``, ``_build_basetree`` and ``_build_tree`` and read
``_fetch_from_cache``, ``_divergences`` and ``_mean_accept_prob``, whose signatures are
those of **pyro-ppl 1.9** (the version ``pyproject.toml`` pins, ``>=1.9,<1.10``;
``tests/test_mcmc.py`` checks them, so that a newer Pyro fails there, not in a run).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import replace

import pyro
import torch
from pyro.infer.mcmc import HMC, MCMC, NUTS

from ...bnn import require_model
from .posterior import MCMCPosterior
from .potential import flat_potential
from .settings import MCMCConfig

#: The sampler statistics kept per draw (ArviZ's ``sample_stats`` names).
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
        self._leapfrogs, self._depth, self._diverged, self._energy = 0, 0, False, math.nan
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


class RecordingHMC(_Recording, HMC):
    """Pyro's :class:`~pyro.infer.mcmc.HMC` keeping the per-iteration statistics."""


def _check_model(model, max_params: int) -> None:
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
    settings: MCMCConfig | None = None,
    *,
    seed: int = 0,
    progress: bool = False,
    **fields,
) -> MCMCPosterior:
    r"""Sample ``model``'s posterior on all of ``data`` with Pyro's NUTS (or HMC).

    Args:
        model: a :class:`~twodg_pyro.bnn.BNNModel` whose likelihood is scaled for all of
            ``data`` (``dataset_size = N``).
        data: the training data, ``(X, y)``, a data set or batches (one full batch).
        settings: the sampler's :class:`~twodg_pyro.methods.mcmc.MCMCConfig` (default:
            its defaults); ``fields`` replace some of them (``num_chains=2``), checked by
            the same rules.
        seed: chain ``c`` is seeded with ``seed + c`` (its initial point and its sampler).
        progress: Pyro's progress bar.

    Returns:
        an :class:`~twodg_pyro.methods.mcmc.MCMCPosterior` (``settings`` records the
        settings, the seed, the seconds of each chain and the post-warm-up divergences).

    Raises:
        ConfigError: a setting out of range (named).
        TooLargeForMCMCError: :math:`n_w` > ``max_params`` (naming both and the way to
            raise the limit).
        ValueError: unlabelled data, a likelihood scaled for another number of examples,
            point-estimated network parameters.
    """
    cfg = replace(settings or MCMCConfig(), **fields)
    _check_model(model, cfg.max_params)
    model.eval()
    potential = flat_potential(model, data, cfg.temperature)
    like = model.site_parameter(0)
    start = potential.flatten(model.initial_values()).to(like)
    jit = cfg.jit_compile and potential.traceable

    chains, stats, seconds, divergences, leapfrogs = [], {k: [] for k in STAT_NAMES}, [], [], []
    for c in range(cfg.num_chains):
        pyro.set_rng_seed(int(seed) + c)
        if cfg.init == "prior":
            w0 = torch.cat([p.sample().reshape(-1) for p in potential.priors]).to(like)
            w0 = w0 * cfg.init_scale
        else:
            w0 = start + cfg.init_scale * torch.randn_like(start)
        common = {
            "potential_fn": potential,
            "step_size": float(cfg.step_size),
            "adapt_step_size": True,
            "adapt_mass_matrix": True,
            "full_mass": False,
            "jit_compile": jit,
            "ignore_jit_warnings": True,
            "target_accept_prob": float(cfg.target_accept_prob),
        }
        if cfg.kernel == "nuts":
            k = RecordingNUTS(max_tree_depth=cfg.max_tree_depth, **common)
        else:
            k = RecordingHMC(num_steps=cfg.num_steps, **common)
        k._reset_stats()
        mc = MCMC(
            k,
            num_samples=cfg.num_samples,
            warmup_steps=cfg.warmup_steps,
            initial_params={"w": w0},
            num_chains=1,
            disable_progbar=not progress,
        )
        t0 = time.perf_counter()
        mc.run()
        seconds.append(time.perf_counter() - t0)
        kept = slice(cfg.warmup_steps, None, cfg.thin)
        chains.append(mc.get_samples()["w"][:: cfg.thin].detach())
        for name in STAT_NAMES:
            stats[name].append(torch.tensor(k.stats[name][kept]))
        divergences.append(len(k._divergences))
        leapfrogs.append(int(sum(k.stats["n_steps"])))
    record = {
        **cfg.to_dict(),
        "seed": int(seed),
        "jit_compile": jit,
        "n_train": len(potential.y),
        "num_weights": potential.dim,
        "chain_seconds": seconds,
        "seconds": float(sum(seconds)),
        "divergences": divergences,
        "leapfrog_steps": leapfrogs,
    }
    sample_stats = {k: torch.stack(v) for k, v in stats.items()}
    return MCMCPosterior(model, torch.stack(chains), sample_stats, record)
