r"""A distance-aware residual for a last-layer Laplace approximation: a Gaussian process on
the last layer's input features, conditioned on the training features, whose posterior
variance is added to every logit of every draw.

A last-layer Laplace draw gives the logits :math:`w_c^\top \phi(x) + b_c`. Far from the
training images their spread grows with :math:`\|\phi(x)\|`, and so does their mean, so
the confidence stays where the curvature of the training data puts it, however far
:math:`\phi(x)` lies from every training feature. The residual adds to each logit an
independent

.. math::
    r_c \sim \mathcal{GP}\big(0,\; g(x)\,g(x')\,k(\phi, \phi')\big), \qquad
    k(\phi, \phi') = \exp\!\Big(-\frac{\|\phi - \phi'\|^2}{2\ell^2}\Big), \qquad
    g(x)^2 = \frac{\|\phi(x)\|^2 + 1}{\delta},

conditioned on :math:`r_c = 0` at the training features :math:`Z` (noise variance
:math:`\nu\,g(z)^2` there): its posterior mean is 0 and its variance

.. math::
    \operatorname{Var} r_c(x) = g(x)^2\, v(x), \qquad
    v(x) = 1 - k_Z(x)^\top (K_{ZZ} + \nu I)^{-1} k_Z(x) \in [0, 1].

:math:`g(x)^2` is the variance of a logit at :math:`\phi(x)` under the last layer's prior
:math:`\mathcal N(0, \delta^{-1} I)` (:math:`\delta`: the prior precision the marginal
likelihood fitted). Near the training features :math:`v \approx 0` and the predictive is
the Laplace one; far from them :math:`v \to 1` and every logit gains the prior's
variance at that feature: where the training images say nothing, the last layer is as
uncertain as its prior. The lengthscale :math:`\ell` is the median distance between two
training features (the median heuristic of kernel methods). Neither setting is tuned on
a held-out split.

**Conditioned on centres** (``centres = M``): the same formula with :math:`Z` the
:math:`M` k-means centres of the training features, a pseudo-data set that costs
:math:`M D` numbers in a file instead of :math:`N D` (on the MNIST subset's ResNet-20,
32 centres are 4 KB at float16 against 460 KB for the 3,600 features) and an
:math:`M \times M` solve instead of :math:`N \times N`. A training feature near its centre
keeps a small :math:`v`; uniform noise and other far inputs reach :math:`v \approx 1` as
with every feature. That small :math:`v` is the centres' error, not distance from the
data, and the prior's :math:`g(x)^2` multiplies it; a **floor** :math:`v_0` (the
:math:`q`-quantile of :math:`v` over the training features, ``floor_quantile = q``) reads
:math:`\max(0, v - v_0) / (1 - v_0)` instead, so that most training-like inputs add
nothing and far ones still reach 1.

Example::

    post = fit_laplace(net, loader, residual="gp")   # LaplacePosterior(..., residual=r)
    post.residual.variance(features)                 # v(x), (N,) in [0, 1]
    post.residual.logit_std(features)                # g(x) sqrt(v(x)), (N,)
"""

from __future__ import annotations

import torch
from torch import nn

from ..nn.functional import batch_input

#: features used for the median heuristic (a seeded subset beyond it)
_HEURISTIC_POINTS = 2000
#: the most training features the exact residual conditions on: its Gram matrix holds
#: ``M ** 2`` float64 numbers (3.2 GB at this bound; CIFAR-10's 50,000 would need 20 GB)
MAX_INDUCING = 20_000


def last_layer_module(net: nn.Module, param_names: list[str]) -> nn.Module:
    """The module whose parameters are the last-layer approximation's (``param_names``
    all of one module)."""
    owners = {n.rsplit(".", 1)[0] for n in param_names}
    if len(owners) != 1:
        raise ValueError(f"the covered parameters {param_names} are not one layer's")
    return net.get_submodule(owners.pop())


@torch.no_grad()
def layer_inputs(net: nn.Module, module: nn.Module, batches) -> torch.Tensor:
    """The inputs of ``module`` (flattened per example) when ``net`` runs on the inputs of
    ``batches`` (tensors or ``(x, y)`` pairs), concatenated."""
    out: list[torch.Tensor] = []
    hook = module.register_forward_hook(lambda m, i, o: out.append(i[0].detach().flatten(1)))
    try:
        like = next(net.parameters())
        for b in batches:
            net(batch_input(b, like))
    finally:
        hook.remove()
    return torch.cat(out)


class FeatureResidual(nn.Module):
    r"""The residual's posterior variance :math:`g(x)^2 v(x)` (module docstring).

    Args:
        inducing: the training features :math:`Z`, ``(M, D)``.
        lengthscale: :math:`\ell > 0`.
        prior_precision: :math:`\delta > 0`, the last layer's prior precision.
        nugget: :math:`\nu`, the noise variance at :math:`Z` over :math:`g(z)^2`.
        floor: :math:`v_0 \in [0, 1)`: the variance read is
            :math:`\max(0, v - v_0) / (1 - v_0)` (0: :math:`v` itself).

    Raises:
        ValueError: no features, non-finite ones, more than :data:`MAX_INDUCING`, or a
            setting out of range (named).
    """

    def __init__(
        self,
        inducing: torch.Tensor,
        lengthscale: float,
        prior_precision: float,
        nugget: float = 1e-2,
        floor: float = 0.0,
    ):
        super().__init__()
        z = torch.as_tensor(inducing).detach()
        if z.dim() != 2 or z.shape[0] == 0 or not torch.isfinite(z).all():
            raise ValueError(f"inducing must be (M, D) finite features, got {tuple(z.shape)}")
        if z.shape[0] > MAX_INDUCING:
            raise ValueError(
                f"the residual conditions on every training feature, and {z.shape[0]:,} is "
                f"more than it can hold (at most {MAX_INDUCING:,}: an M x M Gram matrix); "
                "condition it on k-means centres (centres = M)"
            )
        for name, value, ok in (
            ("lengthscale", lengthscale, lengthscale > 0),
            ("prior_precision", prior_precision, prior_precision > 0),
            ("nugget", nugget, nugget > 0),
            ("floor", floor, 0 <= floor < 1),
        ):
            if not ok or value != value:
                raise ValueError(f"{name} = {value!r} is out of range")
        self.register_buffer("inducing", z.clone())
        self.lengthscale, self.nugget, self.floor = float(lengthscale), float(nugget), float(floor)
        self.prior_precision = float(prior_precision)
        self._chol: torch.Tensor | None = None

    @classmethod
    def fit(
        cls,
        features: torch.Tensor,
        prior_precision: float,
        seed: int = 0,
        centres: int = 0,
        floor_quantile: float = 0.0,
    ) -> FeatureResidual:
        r"""The residual of the training ``features`` ``(N, D)`` under a last layer whose
        prior precision is ``prior_precision`` (:math:`\ell` by the median heuristic, on
        a seeded subset of at most 2,000 features).

        ``centres = M > 0`` conditions it on the :math:`M` k-means centres of the features
        (scikit-learn's ``KMeans``, seeded) instead of all :math:`N`: the file stores
        :math:`M \times D` numbers and a prediction solves against :math:`M`, while
        :math:`\ell` stays the features' median distance. A training feature then keeps
        the small variance :math:`v \approx 1 - k(\phi, c)^2` of its distance to the
        nearest centres :math:`c`. ``floor_quantile = q > 0`` sets the floor
        :math:`v_0` (class docstring) to the :math:`q`-quantile of :math:`v` over the
        training features: the part of :math:`v` the centres leave on the training set
        itself is then not read as distance from it.

        Raises:
            ValueError: ``centres`` is negative or more than the features, or
                ``floor_quantile`` is outside ``[0, 1)``.
        """
        f = torch.as_tensor(features).detach().double()
        if not 0 <= floor_quantile < 1:
            raise ValueError(f"floor_quantile = {floor_quantile!r} is outside [0, 1)")
        if not 0 <= int(centres) <= len(f):
            raise ValueError(
                f"centres = {centres!r}: the residual needs 0 (every feature) or 1 to "
                f"{len(f):,} (the number of training features) k-means centres"
            )
        sub = f
        if len(f) > _HEURISTIC_POINTS:
            g = torch.Generator().manual_seed(int(seed))
            sub = f[torch.randperm(len(f), generator=g)[:_HEURISTIC_POINTS]]
        d = torch.pdist(sub)
        if d.numel() == 0 or not float(prior_precision) > 0:
            raise ValueError(
                f"the residual needs at least 2 features and a positive prior precision, got "
                f"{len(f)} and {prior_precision!r}"
            )
        z = torch.as_tensor(features)
        if centres:
            from sklearn.cluster import KMeans

            km = KMeans(n_clusters=int(centres), n_init=4, random_state=int(seed))
            z = torch.as_tensor(km.fit(f.numpy()).cluster_centers_).to(z.dtype)
        out = cls(z, float(d.median()), float(prior_precision))
        if floor_quantile:  # read before the floor is set; its Cholesky factor is kept
            out.floor = min(float(out.variance(f).quantile(floor_quantile)), 0.99)
        return out

    def _cholesky(self) -> torch.Tensor:
        if self._chol is None or self._chol.device != self.inducing.device:
            z = self.inducing.double()
            k = self._kernel(z, z)
            k.diagonal().add_(self.nugget)
            self._chol = torch.linalg.cholesky(k)
        return self._chol

    def _kernel(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.exp(-torch.cdist(a, b).pow(2) / (2 * self.lengthscale**2))

    def variance(self, features: torch.Tensor) -> torch.Tensor:
        r""":math:`v(x)` of the features ``(N, D)``: ``(N,)`` in ``[0, 1]``, in the
        features' dtype."""
        kx = self._kernel(self.inducing.double(), features.double())
        w = torch.linalg.solve_triangular(self._cholesky(), kx, upper=False)
        v = 1 - w.pow(2).sum(0)
        if self.floor:
            v = (v - self.floor) / (1 - self.floor)
        return v.clamp(0, 1).to(features.dtype)

    def logit_std(self, features: torch.Tensor) -> torch.Tensor:
        r""":math:`g(x)\sqrt{v(x)}`, the residual's standard deviation of each logit at the
        features ``(N, D)``: ``(N,)``."""
        prior = (features.pow(2).sum(1) + 1) / self.prior_precision
        return (prior * self.variance(features)).sqrt()

    def settings(self) -> dict:
        """Its scalars (JSON-able; the model file's ``residual`` table)."""
        out = {
            "lengthscale": self.lengthscale,
            "prior_precision": self.prior_precision,
            "nugget": self.nugget,
        }
        return {**out, "floor": self.floor} if self.floor else out
