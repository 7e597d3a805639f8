r"""The draws of a reference posterior by MCMC as a trained method: ``C`` chains of ``D``
kept draws of the model's Bayesian tensors (:func:`~twodg_pyro.methods.mcmc.run_mcmc`),
the sampler's statistics and settings, predicting like an ensemble, by the average of
the draws' class probabilities,

.. math:: p(y \mid x, \mathcal D) \approx \frac1S \sum_{s=1}^{S}
    \mathrm{softmax}(f_{w_s}(x)),

or, for a regression likelihood, by the moments of the mixture of the draws' Normals
:math:`\mathcal N(\mu_s(x), \sigma_s(x)^2)` (the law of total variance, as
:func:`~twodg_pyro.prediction.predict`: the mean, and the standard deviation with and
without the noise).
"""

from __future__ import annotations

import torch
from torch import nn

from ...files.payload import payload_section
from ...io.model_format import state_tensors
from ...io.specs import (
    likelihood_spec,
    prior_spec,
    rebuild_bnn_model,
    rebuild_likelihood,
    rebuild_prior,
)
from ...likelihoods import RegressionLikelihood
from ...prediction import Prediction, _targets, moment_sums, moments_prediction
from ..base import TrainedMethod, header_table, net_section

#: Draws run through the network at once.
_CHUNK = 100


class MCMCPosterior(TrainedMethod):
    r"""The draws of :func:`run_mcmc`: ``C`` chains of ``D`` thinned draws of the model's
    Bayesian tensors, predicting by the average of their class probabilities (a regression
    model: by the moments of their Normals, :meth:`predict`).

    Args:
        model: the :class:`~twodg_pyro.bnn.BNNModel` (its network runs the draws).
        draws: ``(C, D, n_w)`` flat draws (the sites in the model's order).
        sample_stats: ``{name: (C, D)}`` sampler statistics of the kept draws
            (:data:`STAT_NAMES`).
        settings: how they were drawn (kernel, steps, seed, seconds, ...), JSON-able.

    Raises:
        ValueError: draws of another length than the model's ``n_w``, or not 3-D.

    Example::

        post = run_mcmc(model, (X, y), MCMCConfig(num_chains=2), seed=0)
        pred = post.predict((X_test, y_test))      # every kept draw: C D forward passes
        post.site_draws()["0.weight"].shape         # (C, D, *site.shape)
        post.save("model_mcmc.pt")
    """

    name = "mcmc"
    file_tag = "mcmc"
    seeded = False

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
        self._settings = dict(settings)

    @property
    def settings(self) -> dict:
        """How the draws were made (the sampler's settings, seed, seconds, divergences)."""
        return self._settings

    @property
    def likelihood(self):
        return self.model.likelihood

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

    def num_draws(self, num_samples: int | None = None) -> int:
        """All its kept draws over the chains, ``C D``, as the run's table predicts it
        (:meth:`sample_probs` takes ``num_samples`` of them)."""
        return int(self.draws.shape[0] * self.draws.shape[1])

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
        total = self.num_draws()
        if num_samples is None or int(num_samples) >= total:
            return torch.arange(total)
        if int(num_samples) < 1:
            raise ValueError(f"num_samples must be at least 1, got {num_samples!r}")
        return torch.linspace(0, total - 1, int(num_samples)).round().long()

    def chain_probs(self, x, batch_size: int = 512) -> torch.Tensor:
        r"""Class probabilities of every kept draw, ``(C, D, N, K)`` on the CPU (for the
        chains' diagnostics); a regression model's: each draw's predictive mean
        :math:`\mu_s(x)`, ``(C, D, N, ...)``."""
        probs = self.sample_probs(x, num_samples=None, batch_size=batch_size)
        return probs.reshape(*self.draws.shape[:2], *probs.shape[1:])

    @property
    def regression(self) -> bool:
        """Its likelihood is a regression one (predictions are Normals, not classes)."""
        return isinstance(self.model.likelihood, RegressionLikelihood)

    def _outputs(self, parts, num_samples):
        """The network's outputs ``(S, B, ...)`` of the picked draws (:meth:`pick`), one
        tensor per batch of ``parts``, ``_CHUNK`` draws at a time."""
        index = self.pick(num_samples)
        weights = {k: v.flatten(0, 1)[index] for k, v in self.site_draws().items()}
        for xb, _ in parts:
            chunks = []
            for a in range(0, len(index), _CHUNK):
                w = {k: v[a : a + _CHUNK] for k, v in weights.items()}
                n = len(next(iter(w.values())))
                chunks.append(self.model.particle_forward(w, xb, (n,)))
            yield torch.cat(chunks)

    def _draws(self, parts, num_samples, seed) -> torch.Tensor:
        """``(S, N, C)`` class probabilities, or a regression model's ``(S, N, ...)``
        per-draw means, on the CPU."""
        return torch.cat([self.per_draw(o).cpu() for o in self._outputs(parts, num_samples)], 1)

    def per_draw(self, outputs: torch.Tensor) -> torch.Tensor:
        """The network ``outputs`` of draws as predicted: class probabilities, or a
        regression model's means."""
        lik = self.model.likelihood
        return lik.loc_scale(outputs, 1)[0] if self.regression else outputs.softmax(-1)

    def _predict(self, parts, n: int, seed: int, keep_samples: bool) -> Prediction:
        """The prediction of every kept draw (:meth:`num_draws`): the average of the class
        probabilities, or for a regression likelihood the predictive mean with its standard
        deviation, epistemic and aleatoric (``samples``: the per-draw means when
        ``keep_samples``), the moments :func:`~twodg_pyro.prediction.predict` computes."""
        if not self.regression:
            return super()._predict(parts, n, seed, keep_samples)
        lik = self.model.likelihood
        sums, means, dtype = [], [], self.draws.dtype
        for o in self._outputs(parts, n):
            sums.append(moment_sums(lik, o).cpu())
            if keep_samples:
                means.append(self.per_draw(o).cpu())
            dtype = o.dtype
        samples = torch.cat(means, 1) if keep_samples else None
        return moments_prediction(torch.cat(sums, 1), n, dtype, _targets(parts), samples)

    def file_content(self) -> tuple[dict, dict]:
        prior, prior_tensors = prior_spec(self.model.prior, self.model)
        fields = {
            "mcmc": {
                "site_names": self.model.site_names,
                "prior": prior,
                "likelihood": likelihood_spec(self.model.likelihood),
                "settings": self.settings,
                "stats": sorted(self.sample_stats),
            }
        }
        return fields, {
            **state_tensors(self.net, "net/"),
            "mcmc/draws": self.draws.detach().cpu().clone(),
            **{f"mcmc/stats/{k}": v.detach().cpu().clone() for k, v in self.sample_stats.items()},
            **{f"prior/{k}": v for k, v in prior_tensors.items()},
        }

    @classmethod
    def from_file(cls, header, payload, network, where):
        what = "the chains' sites, settings and statistics"
        mc = header_table(
            header, "mcmc", where, what, site_names=list, settings=dict, stats=list, likelihood=dict
        )
        net = net_section(payload, network)
        prior = rebuild_prior(mc["prior"], net, where, payload_section(payload, "prior/"))
        lik = rebuild_likelihood(mc["likelihood"])
        model = rebuild_bnn_model(net, prior, lik, mc["site_names"], where)
        try:
            stats = {name: payload[f"mcmc/stats/{name}"] for name in mc["stats"]}
            return cls(model, payload["mcmc/draws"], stats, mc["settings"])
        except (KeyError, ValueError) as e:
            raise ValueError(
                f"{where!r}: its MCMC draws do not fit the saved network: {type(e).__name__}: {e}"
            ) from e
