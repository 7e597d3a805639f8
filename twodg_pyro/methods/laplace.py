r"""Post-hoc Laplace approximation of a trained network, fitted with laplace-torch
(Daxberger et al. 2021; the optional dependency ``pip install laplace-torch``, imported
only when a Laplace approximation is fitted).

:func:`~twodg_pyro.methods.laplace_fit.fit_laplace` fits
:math:`q(\theta) = \mathcal N(\theta_\text{MAP}, P^{-1})` around a trained network: by
default over the **last layer** with a **Kronecker-factored** generalised Gauss-Newton
(``subset_of_weights="last_layer", hessian_structure="kron"``), or over all layers with
a diagonal one (``subset="all", hessian="diag"``; the other two combinations work too:
Kronecker factors over all layers cover every ``Linear`` and ``Conv2d`` layer, and the
parameters of other layers, BatchNorm's affine ones, stay at their trained values),
its prior precision :math:`\delta` fitted by maximising the Laplace marginal likelihood
(``optimize_prior_precision(method="marglik")``, one scalar, or one per parameter tensor
with ``subset="all"``). The posterior precision is, per parameter tensor,
:math:`P = H + \delta I` with :math:`H = A \otimes G` (kron) or :math:`\mathrm{diag}(h)`.

The result is a :class:`LaplacePosterior`: the network plus the fitted precision
**factors as plain tensors** (the raw Kronecker factors or the diagonal, and the prior
precision). It predicts without laplace-torch, so a saved one
(:meth:`~twodg_pyro.methods.TrainedMethod.save`) loads with safe loading only and predicts exactly
as before.

**The predictive is Monte Carlo**, not laplace-torch's probit approximation: ``S`` joint
draws :math:`\theta_s \sim q` from a ``torch.Generator`` seeded with ``seed`` (the same
draws as laplace-torch's ``la.sample(S, generator)``, arithmetic for arithmetic), each
giving per-draw class probabilities, averaged for the prediction:

* ``pred_type="glm"`` (default): the linearised network of the GGN,
  :math:`f_s(x) = f(x; \theta_\text{MAP}) + J(x)(\theta_s - \theta_\text{MAP})` (a
  forward-mode Jacobian-vector product per draw), as laplace-torch's
  ``pred_type="glm", link_approx="mc"``; for the last layer it is exact: the logits are
  affine in the last layer's weights, so ``"glm"`` and ``"nn"`` coincide;
* ``pred_type="nn"``: the network run with the drawn weights.

A **last-layer** approximation's draws change the last layer only, so one pass of the
network gives the last layer's input :math:`\phi(x)` and :math:`f(x; \theta_\text{MAP})`,
and each draw's logits are the last layer's on :math:`\phi(x)` (its linearisation for
``"glm"``, its drawn weights for ``"nn"``: the same numbers as the network run once per
draw): a prediction costs one forward pass and ``S`` small products, not ``S`` passes
(``forwards_per_prediction`` is 1).  The network's output must be its last layer's, as
laplace-torch's last-layer fit assumes; otherwise ``predict`` says so.

:meth:`LaplacePosterior.sample_probs` returns the per-draw probabilities ``(S, N, C)``.
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import nn
from torch.func import functional_call, jvp, vmap

from ..bnn import match_input
from ..io.model_format import pack_upper, state_tensors, unpack_upper
from .base import TrainedMethod, header_table, net_section
from .feature_residual import FeatureResidual, last_layer_module
from .laplace_settings import LaplaceConfig

_DRAW_CHUNK = 10
#: a residual's scalars in a model file, in FeatureResidual's argument order
_RESIDUAL = dict.fromkeys(("lengthscale", "prior_precision", "nugget"), (int, float))


def _symeig(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """laplace-torch's ``symeig``: eigenvalues clamped at 0, jitter if it fails."""
    try:
        eigval, vec = torch.linalg.eigh(m, UPLO="U")
    except RuntimeError:  # did not converge
        eye = torch.eye(m.shape[0], device=m.device, dtype=m.dtype)
        eigval, vec = torch.linalg.eigh(m + eye, UPLO="U")
        eigval = eigval - 1.0
    return torch.nan_to_num(eigval.clamp(min=0.0)), torch.nan_to_num(vec)


class LaplacePosterior(TrainedMethod):
    r"""A Laplace approximation :math:`\mathcal N(\theta_\text{MAP}, P^{-1})` over some of a
    network's parameters, as plain tensors.

    Args:
        net: the trained network (its current values are :math:`\theta_\text{MAP}`).
        subset, hessian: see the module docstring (recorded; ``param_names`` says which
            tensors are covered, in the order of the posterior's vector).
        param_names: the names (in ``net.named_parameters()``) of the covered tensors.
        factors: ``hessian = "kron"``: per covered tensor a list of one or two Kronecker
            factors (laplace-torch's ``H_facs.kfacs``); ``"diag"``: the diagonal ``(P,)``.
        prior_precision: ``(1,)`` or one per covered tensor.
        h_factor: the factor of the likelihood's curvature (1 / temperature).
        pred_type: the Monte Carlo predictive (``"glm"`` or ``"nn"``).
        residual: a distance-aware residual on the last layer's input features
            (:class:`~twodg_pyro.methods.feature_residual.FeatureResidual`; last layer
            only): each draw's logits gain :math:`g(x)\sqrt{v(x)}\,\varepsilon_{s}`,
            one standard normal per draw and class drawn after the weights from the same
            generator (a draw is one function of :math:`x`; its marginal at :math:`x` is the
            residual's).

    Raises:
        ValueError: unknown settings, names the network lacks, or factors whose sizes do
            not fit the covered tensors.

    Example::

        post = fit_laplace(net, loader, subset="last_layer", hessian="kron")
        pred = post.predict((X, y), num_samples=30, seed=0)   # seeded joint draws
        post.sample_probs(X, 10, seed=0).shape                # (10, N, C)
        post.save("model_laplace.pt")                         # no laplace-torch needed to load
    """

    name = "laplace"
    file_tag = "laplace"

    def __init__(
        self,
        net: nn.Module,
        *,
        subset: str,
        hessian: str,
        param_names: list[str],
        factors,
        prior_precision: torch.Tensor,
        h_factor: float = 1.0,
        pred_type: str = "glm",
        residual: FeatureResidual | None = None,
    ):
        super().__init__()
        LaplaceConfig(subset=subset, hessian=hessian, pred_type=pred_type)  # refuses others
        if residual is not None and subset != "last_layer":
            raise ValueError(f"a feature residual needs subset = 'last_layer', not {subset!r}")
        self.residual = residual
        self.net = net
        self.subset, self.hessian, self.pred_type = subset, hessian, pred_type
        self.param_names = list(param_names)
        self.h_factor = float(h_factor)
        params = dict(net.named_parameters())
        missing = [n for n in self.param_names if n not in params]
        if missing or not self.param_names:
            raise ValueError(f"the network has no parameter(s) {missing or '(none given)'}")
        self.shapes = shapes = [tuple(params[n].shape) for n in self.param_names]
        self.n_params = sum(math.prod(s) for s in shapes)
        prior = torch.as_tensor(prior_precision).detach().reshape(-1).clone()
        if prior.numel() not in (1, len(shapes)):
            raise ValueError(
                f"prior_precision has {prior.numel()} values; 1 or one per covered tensor "
                f"({len(shapes)}) expected"
            )
        self.register_buffer("prior_precision", prior)
        self.block_sizes = []
        if hessian == "diag":
            diag = torch.as_tensor(factors).detach().reshape(-1).clone()
            if diag.numel() != self.n_params:
                raise ValueError(
                    f"the diagonal has {diag.numel()} values, {self.n_params} expected"
                )
            self.register_buffer("diag_h", diag)
        else:
            if len(factors) != len(shapes):
                raise ValueError(
                    f"{len(factors)} Kronecker blocks for {len(shapes)} covered tensors"
                )
            for i, (block, shape) in enumerate(zip(factors, shapes, strict=True)):
                sizes = [int(f.shape[0]) for f in block]
                square = all(f.dim() == 2 and f.shape[0] == f.shape[1] for f in block)
                if len(block) not in (1, 2) or not square or math.prod(sizes) != math.prod(shape):
                    raise ValueError(
                        f"Kronecker block {i} of sizes {sizes} does not fit the tensor "
                        f"{self.param_names[i]!r} of shape {shape}"
                    )
                self.block_sizes.append(sizes)
                for j, f in enumerate(block):
                    self.register_buffer(f"kfac_{i}_{j}", f.detach().clone())

    def rebuilt(self, **changes) -> LaplacePosterior:
        """A new approximation with the constructor's arguments of this one, some replaced
        (``net``, ``param_names``, ``residual``, ...): the network and residual shared,
        the factors copied (as the constructor copies them)."""
        args = dict(
            net=self.net,
            subset=self.subset,
            hessian=self.hessian,
            param_names=self.param_names,
            factors=self.factors,
            prior_precision=self.prior_precision,
            h_factor=self.h_factor,
            pred_type=self.pred_type,
            residual=self.residual,
        )
        args.update(changes)
        return type(self)(args.pop("net"), **args)

    @property
    def factors(self):
        """The precision factors as given to the constructor (on this module's device)."""
        if self.hessian == "diag":
            return self.diag_h
        return [
            [getattr(self, f"kfac_{i}_{j}") for j in range(len(sizes))]
            for i, sizes in enumerate(self.block_sizes)
        ]

    def num_factor_values(self) -> int:
        """Floating-point numbers of the posterior beyond the network: the precision
        factors, the prior precision and a residual's training features."""
        factors = [self.diag_h] if self.hessian == "diag" else [f for b in self.factors for f in b]
        if self.residual is not None:
            factors.append(self.residual.inducing)
        return self.prior_precision.numel() + sum(f.numel() for f in factors)

    def forwards_per_prediction(self, num_samples: int) -> int:
        """One network evaluation per draw; a last-layer approximation's draws change the
        last layer only, so one pass serves them all (and a residual's features)."""
        return 1 if self.subset == "last_layer" else super().forwards_per_prediction(num_samples)

    @property
    def settings(self) -> dict:
        out = {"subset": self.subset, "hessian": self.hessian, "pred_type": self.pred_type}
        return out if self.residual is None else {**out, "residual": self.residual.settings()}

    def file_content(self) -> tuple[dict, dict]:
        fields = {
            "laplace": {
                **self.settings,  # with its residual's scalars, if any
                "param_names": self.param_names,
                "block_sizes": self.block_sizes,
                "h_factor": self.h_factor,
            }
        }
        tensors = state_tensors(self.net, "net/")
        tensors["laplace/prior_precision"] = self.prior_precision.detach().cpu().clone()
        if self.hessian == "diag":
            tensors["laplace/diag"] = self.diag_h.detach().cpu().clone()
        if self.residual is not None:
            tensors["laplace/residual/inducing"] = self.residual.inducing.detach().cpu().clone()
        for i, block in enumerate(self.factors if self.hessian == "kron" else []):
            for j, f in enumerate(block):
                tensors[f"laplace/kfac/{i}/{j}"] = pack_upper(f.detach().cpu())
        return fields, tensors

    @classmethod
    def from_file(cls, header, payload, network, where):
        types = dict.fromkeys(("subset", "hessian", "pred_type"), str)
        types.update(param_names=list, block_sizes=list, h_factor=(int, float))
        la = header_table(header, "laplace", where, "the approximation's settings", **types)
        net = net_section(payload, network)
        try:
            if la["hessian"] == "diag":
                factors = payload["laplace/diag"]
            else:
                factors = [
                    [unpack_upper(payload[f"laplace/kfac/{i}/{j}"], p) for j, p in enumerate(sizes)]
                    for i, sizes in enumerate(la["block_sizes"])
                ]
            residual = None
            if la.get("residual") is not None:
                r = header_table(la, "residual", where, "residual settings", **_RESIDUAL)
                inducing = payload["laplace/residual/inducing"]
                floor = r.get("floor", 0.0)  # files before the floor have none
                if not isinstance(floor, int | float):
                    raise ValueError(f"the residual's floor {floor!r:.40} is not a number")
                residual = FeatureResidual(
                    inducing, *(float(r[k]) for k in _RESIDUAL), floor=float(floor)
                )
            return cls(
                net,
                factors=factors,
                prior_precision=payload["laplace/prior_precision"],
                h_factor=float(la["h_factor"]),
                residual=residual,
                **{k: la[k] for k in ("subset", "hessian", "param_names", "pred_type")},
            )
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise ValueError(
                f"{where!r}: its Laplace approximation does not fit the saved network: "
                f"{type(e).__name__}: {e}"
            ) from e

    def mean(self) -> torch.Tensor:
        r""":math:`\theta_\text{MAP}`: the covered tensors of the network, flattened."""
        params = dict(self.net.named_parameters())
        return torch.cat([params[n].detach().reshape(-1) for n in self.param_names])

    def _delta(self, i: int) -> torch.Tensor:
        prior = self.prior_precision
        return prior[0] if prior.numel() == 1 else prior[i]

    def posterior_precision_diag(self) -> torch.Tensor:
        """The diagonal of the posterior precision ``(P,)``."""
        if self.hessian == "diag":
            prior = self.prior_precision
            if prior.numel() > 1:
                sizes = torch.tensor([math.prod(s) for s in self.shapes], device=prior.device)
                prior = prior.repeat_interleave(sizes)
            return self.h_factor * self.diag_h + prior
        out = []
        for i, block in enumerate(self.factors):
            diag = [f.diagonal() * self.h_factor ** (1 / len(block)) for f in block]
            d = diag[0] if len(diag) == 1 else torch.outer(diag[0], diag[1]).reshape(-1)
            out.append(d + self._delta(i))
        return torch.cat(out)

    def covariance(self) -> torch.Tensor:
        """The dense posterior covariance ``(P, P)`` (for checks on small layers)."""
        if self.hessian == "diag":
            return torch.diag(1 / self.posterior_precision_diag())
        eye = torch.eye(self.n_params, dtype=self.dtype, device=self.prior_precision.device)
        cols = self._scale(eye, exponent=-0.5)  # P^(-1/2) is symmetric
        return cols @ cols.T

    def _scale(self, z: torch.Tensor, exponent: float = -0.5) -> torch.Tensor:
        """``(P^exponent z^T)^T`` for ``z`` of shape ``(S, P)``, laplace-torch's
        ``KronDecomposed.bmm`` / ``DiagLaplace.sample`` arithmetic."""
        if self.hessian == "diag":
            prec = self.posterior_precision_diag()
            scale = 1 / prec.sqrt() if exponent == -0.5 else torch.pow(prec, exponent)
            return z * scale.reshape(1, -1)
        out, cur, n = [], 0, z.shape[0]
        for i, block in enumerate(self.factors):
            delta = self._delta(i)
            eig = [_symeig(f) for f in block]
            scale = self.h_factor ** (1 / len(block))
            if len(block) == 1:
                (eigval, q), p = eig[0], block[0].shape[0]
                ldelta = torch.pow(eigval * scale + delta, exponent).reshape(-1, 1)
                w = z[:, cur : cur + p].T
                out.append((q @ (ldelta * (q.T @ w))).T)
            else:
                (l1, q1), (l2, q2) = eig
                p_in, p_out = len(l1), len(l2)
                p = p_in * p_out
                ldelta = torch.pow(torch.outer(l1 * scale, l2 * scale) + delta, exponent)
                w = z[:, cur : cur + p].reshape(n, p_in, p_out)
                w = (q1.T @ w @ q2) * ldelta.unsqueeze(0)
                out.append((q1 @ w @ q2.T).reshape(n, p))
            cur += p
        return torch.cat(out, dim=1)

    def sample_params(self, num_samples: int, seed: int = 0) -> torch.Tensor:
        r"""``(S, P)`` draws :math:`\theta_s \sim q` from a generator seeded with ``seed``
        on the posterior's device."""
        return self._sample(num_samples, seed)[0]

    def _sample(self, num_samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`sample_params` and, with a residual, its ``(S, C)`` standard normals
        drawn next from the same generator."""
        if int(num_samples) < 1:
            raise ValueError(f"num_samples must be at least 1, got {num_samples!r}")
        mean = self.mean()
        gen = torch.Generator(device=mean.device)
        gen.manual_seed(int(seed))
        n, like = int(num_samples), {"device": mean.device, "dtype": mean.dtype}
        z = torch.randn(n, self.n_params, **like, generator=gen)
        draws = mean.reshape(1, -1) + self._scale(z, -0.5)
        if self.residual is None:
            return draws, None
        classes = self.shapes[0][0]  # the last layer's weight: (C, D)
        return draws, torch.randn(n, classes, **like, generator=gen)

    def _unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        out, cur = {}, 0
        for name, shape in zip(self.param_names, self.shapes, strict=True):
            n = math.prod(shape)
            out[name] = flat[..., cur : cur + n].reshape(*flat.shape[:-1], *shape)
            cur += n
        return out

    @torch.no_grad()
    def _logits(self, draws: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``(s, B, C)`` logits of the draws ``(s, P)`` on a batch (``pred_type``)."""
        net = self.net
        base = {k: v.detach() for k, v in net.named_parameters()}
        base.update(net.named_buffers())

        def f(sub):
            return functional_call(net, {**base, **sub}, (x,))

        return self._predictive(f, self._unflatten, draws)

    def _predictive(self, f, params, draws: torch.Tensor, f_mu=None) -> torch.Tensor:
        """``(s, B, C)``: ``f`` of the draws (``params`` maps a flat vector to its
        arguments): run at each draw (``"nn"``) or linearised at the mean (``"glm"``;
        ``f_mu``: ``f`` at the mean, if known)."""
        if self.pred_type == "nn":
            return vmap(lambda flat: f(params(flat)), randomness="different")(draws)
        primal = params(self.mean())
        f_mu = f(primal) if f_mu is None else f_mu
        tangents = params(draws - self.mean().reshape(1, -1))
        jv = vmap(lambda t: jvp(f, (primal,), (t,))[1], randomness="different")(tangents)
        return f_mu.unsqueeze(0) + jv

    @torch.no_grad()
    def _head(self, x: torch.Tensor) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
        r"""``(last, phi, f_mu)``: the last layer, its input and the network's output at
        :math:`\theta_\text{MAP}`, from one pass of the network.

        Raises:
            ValueError: the network's output is not its last layer's (laplace-torch's
                last-layer approximation, which fitted the factors, assumes it is).
        """
        last = last_layer_module(self.net, self.param_names)
        seen: list = []
        hook = last.register_forward_hook(lambda m, i, o: seen.append((i[0], o)))
        try:
            f_mu = self.net(x)
        finally:
            hook.remove()
        if len(seen) != 1 or seen[0][1] is not f_mu:
            raise ValueError(
                f"the network's output is not the output of its last layer {self.param_names} "
                f"(it ran {len(seen)} time(s)): a last-layer Laplace approximation needs it"
            )
        return last, seen[0][0], f_mu

    @torch.no_grad()
    def _head_logits(self, last, phi, f_mu, draws: torch.Tensor) -> torch.Tensor:
        """``(s, B, C)`` logits of the draws ``(s, P)`` of the last layer, on its input
        ``phi``: the ``pred_type`` of :meth:`_logits` on the last layer alone (the
        layers below it do not depend on the draws)."""
        local = len(self.param_names[0].rsplit(".", 1)[0]) + 1

        def params(flat):
            return {k[local:]: v for k, v in self._unflatten(flat).items()}

        return self._predictive(lambda p: functional_call(last, p, (phi,)), params, draws, f_mu)

    def _draws(self, parts, num_samples: int, seed: int) -> torch.Tensor:
        draws, eps = self._sample(num_samples, seed)
        rows = []
        with warnings.catch_warnings():  # torch's forward AD, at its first use
            warnings.filterwarnings("ignore", ".*torch.jit.script.*", FutureWarning)
            for xb, _ in parts:
                xb = match_input(xb, draws)
                if self.subset == "last_layer":  # one pass: the draws change its last layer
                    last, phi, f_mu = self._head(xb)
                    chunks = [
                        self._head_logits(last, phi, f_mu, d) for d in draws.split(_DRAW_CHUNK)
                    ]
                else:
                    chunks = [self._logits(d, xb) for d in draws.split(_DRAW_CHUNK)]
                logits = torch.cat(chunks, 0)
                if self.residual is not None:
                    sd = self.residual.logit_std(phi.flatten(1))
                    logits = logits + sd.reshape(1, -1, 1) * eps.unsqueeze(1)
                rows.append(logits.softmax(-1).cpu())
        return torch.cat(rows, 1)
