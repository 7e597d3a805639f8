"""The settings of the MCMC reference posterior, stated once: the run's ``[mcmc]`` table
and the one argument of :func:`~twodg_pyro.methods.mcmc.run_mcmc`, checked by the
library's settings rules when built (:mod:`twodg_pyro.settings`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Annotated, ClassVar, Literal

from ...settings import BOOLEAN, Section, at_least, in_range, positive, require

#: The largest number of Bayesian scalars accepted unless told more (``max_params``):
#: full-batch NUTS on a CPU needs minutes per thousand dimensions.
DEFAULT_MAX_PARAMS = 5000


@dataclass
class MCMCConfig(Section):
    r"""Pyro's ``nuts`` (or ``hmc`` with ``num_steps`` leapfrog steps) on the run's network,
    prior and likelihood, on the whole training set at once (method ``mcmc``).

    ``num_chains`` chains (chain ``c`` seeded ``seed + c``, run one after the other) of
    ``warmup_steps`` adaptation iterations (step size by dual averaging to
    ``target_accept_prob`` from ``step_size``, a diagonal mass matrix) and
    ``num_samples`` kept ones, every ``thin``-th stored; NUTS's trees at most
    ``max_tree_depth`` deep; the likelihood tempered by ``temperature`` :math:`T`
    (1: the Bayes posterior); ``jit_compile``: PyTorch's tracer on the potential.  Chains
    start at prior draws times ``init_scale`` (``init = "prior"``: dispersed, as R-hat
    needs) or at the network plus that much noise (``"network"``).  A network of more
    than ``max_params`` Bayesian scalars is refused.

    Example::

        settings = MCMCConfig(num_samples=200, warmup_steps=200, num_chains=2)
        post = run_mcmc(model, (X, y), settings, seed=0)
        MCMCConfig(thin=0)   # ConfigError: mcmc.thin = 0: must be an integer >= 1
    """

    section: ClassVar[str] = "mcmc"
    kernel: Literal["nuts", "hmc"] = "nuts"
    num_samples: Annotated[int, at_least(1)] = 500
    warmup_steps: Annotated[int, at_least(0)] = 500
    num_chains: Annotated[int, at_least(1)] = 4
    thin: Annotated[int, at_least(1)] = 1
    init: Literal["prior", "network"] = "prior"
    init_scale: Annotated[float, positive()] = 0.1
    target_accept_prob: Annotated[float, in_range(0, 1, (False, False))] = 0.8
    max_tree_depth: Annotated[int, at_least(1)] = 10
    step_size: Annotated[float, positive()] = 1e-2
    num_steps: Annotated[int, at_least(1)] = 32
    temperature: Annotated[float, positive()] = 1.0
    jit_compile: Annotated[bool, BOOLEAN] = False
    max_params: Annotated[int, at_least(1)] = DEFAULT_MAX_PARAMS

    def _check(self) -> None:
        require(
            self.thin <= self.num_samples,
            "mcmc.thin",
            self.thin,
            f"keeps no draw of mcmc.num_samples = {self.num_samples}",
        )

    def to_dict(self) -> dict:
        """The settings as a plain dict (the sampler's record of them)."""
        return asdict(self)
