r"""Variational online Newton (VON): a natural-gradient optimiser for the mean-field guide.

The mean-field posterior :math:`q(w) = \prod_i \mathcal N(\mu_i, \sigma_i^2)` of a loss
:math:`L = \text{nll} + \beta\,\mathrm{KL}(q \,\|\, p)` (the tempered negative ELBO that
:func:`~twodg_pyro.infer.fit` minimises, with :math:`\text{nll}` scaled to the
:math:`N` training examples) is learnt in its natural parameters: the mean and the
precision :math:`S_i = 1/\sigma_i^2`.  This is the update of IVON (Shen et al., ICML 2024,
"Variational Learning is Effective for Large Deep Networks", Algorithm 1), written here
from its published equations, in the units of the library's loss.

**From the gradients of** :math:`L` **to the natural gradient.**  The guide's sample is
:math:`w = \mu + \sigma\epsilon` with :math:`\sigma = \operatorname{softplus}(\rho)`, so one
backward pass of the minibatch loss gives :math:`\partial L/\partial\mu` and
:math:`\partial L/\partial\sigma = (\partial L/\partial\rho) / \operatorname{sigmoid}(\rho)`.
For a Normal prior of precision :math:`P_i` (closed-form KL),

.. math::
    \frac{1}{\beta\sigma_i}\frac{\partial L}{\partial\sigma_i}
    = \underbrace{\frac{\hat g_i\,\epsilon_i}{\beta\sigma_i}}_{\text{Price}}
      + P_i - \frac{1}{\sigma_i^2} = \hat S_i - S_i ,

where :math:`\hat g_i \epsilon_i / \sigma_i` is the reparameterisation (Price) estimate of the
nll's Hessian diagonal, so :math:`\hat S_i = \hat h_i/\beta + P_i` estimates the precision
the ELBO's fixed point asks for.  (Any other prior adds its own Monte Carlo Hessian estimate
through the KL's gradient in the same way.)  In IVON's per-example units, with the
effective sample size :math:`\lambda = N / \beta` and the weight decay
:math:`\delta_i = \beta P_i / N`: :math:`S_i = \lambda (h_i + \delta_i)`, and
:math:`(\hat S_i - S_i)/\lambda = \hat h_i - h_i`.  **So** ``ess`` **is the data size over
the KL weight, the layer-wise** :math:`\mathcal N(0, 1/\text{fan\_in})` **prior is a
per-layer weight decay** :math:`\delta_l = \beta\,\text{fan\_in}_l / N`, **and a colder
posterior (a larger** ``ess``\ **) is a smaller** :math:`\beta`.

**The step** (:math:`t` counts steps, :math:`r = 1 - \beta_2`, :math:`\Delta_i = \hat S_i -
S_i`):

.. math::
    S_i &\leftarrow S_i + r\,\Delta_i + \tfrac12 r^2 \Delta_i^2 / S_i
        \qquad \text{(IVON's Hessian update with its correction term)} \\
    m_i &\leftarrow \beta_1 m_i + (1 - \beta_1)\,\partial L/\partial\mu_i, \qquad
    \bar m_i = m_i / (1 - \beta_1^t) \\
    \mu_i &\leftarrow \mu_i - \alpha_t \operatorname{clip}\big(\bar m_i / (\beta S_i),
        \pm\xi\big), \qquad \sigma_i \leftarrow S_i^{-1/2}

The precision update keeps :math:`S_i \geq S_i/2 > 0` whatever the noise of
:math:`\Delta_i` (the minimum over :math:`\Delta` of :math:`1 + r x + r^2 x^2 / 2`,
:math:`x = \Delta/S`, is 1/2).  :math:`\bar m / (\beta S)` is IVON's
:math:`(\bar g + \delta\mu)/(h + \delta)`; the one difference is that the momentum here
averages the whole per-example gradient, the prior's :math:`\delta\mu` included, where IVON
adds :math:`\delta\mu` after its momentum (the two agree while :math:`\mu` moves little over
:math:`1/(1-\beta_1)` steps).  The learning rate :math:`\alpha_t` warms up linearly over
``warmup_steps`` and then follows a cosine to 0 at ``total_steps`` (IVON's schedule; ``0``
total steps: constant).  Steps after ``total_steps`` keep the means and let the precisions
settle at their curvature: there the rate decays as :math:`r_k = 1 / (1/r + k)` at the
:math:`k`-th such step (Robbins-Monro), so that the precision averages its noisy estimates
instead of following the last hundred or so (``settle_rate`` holds it constant instead).

**Why a constant rate never settles at the ELBO's optimum.**  The correction term keeps
:math:`S` positive at the price of a bias: at a fixed point of the step,
:math:`\mathbb E[r\Delta + \tfrac12 r^2\Delta^2/S] = 0`, so
:math:`S - \mathbb E[\hat S] \approx \tfrac12 r \operatorname{Var}(\hat S) / S`: the
precision sits above the ELBO's fixed point :math:`\mathbb E[\hat S]` by a relative
:math:`\tfrac12 r \operatorname{Var}(\hat S)/S^2`, which the Price estimates' noise makes
large (tens of percent at :math:`r = 0.01` on the MNIST networks).  The decaying rate
removes it as :math:`\log(k)/k`; that, not the means, is what the settling steps wait for.

Parameters that are not the guide's (the network's deterministic parameters, e.g.
BatchNorm's affine ones: the group ``deterministic``) take Adam steps at their group's
learning rate.

The cost of a step is that of one SGD step on one weight draw: one forward and backward
pass, the KL's closed form, and a few elementwise operations per weight; with the fused
step (``fused_kl``) the draw and the update share one :math:`\sigma` on the CPU, so that
neither computes a softplus (:mod:`twodg_pyro.nn.shared_scale`).  Gradients averaged
over the ranks of a process group (DDP, each rank with its own draw) average the Price
estimates too: every rank takes the same step.

Example::

    guide = tp.MeanFieldGuide(model, init_scale=0.01)
    beta = 0.1
    von = functools.partial(VariationalOnlineNewton, kl_weight=beta, total_steps=10 * 32)
    tp.fit(model, guide, loader, epochs=10, lr={"loc": 0.1, "scale": 0.1, "deterministic": 1e-3},
           elbo=tp.DecomposedELBO(beta=beta), optimizer=von)
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from ..nn.flat_storage import flat, flat_view, pack, split_as
from ..nn.functional import MIN_SIGMA, inverse_softplus, softplus
from ..nn.shared_scale import remember_scale, scale_of_draw

#: the parameter groups VON trains as the guide's posterior, and the rest (Adam)
_LOC, _SCALE, _OTHER = "loc", "scale", "deterministic"
#: the state of a ``scale`` parameter that keeps a fused run's shared sigma'
_SHARED = "shared_scale"


class VariationalOnlineNewton(torch.optim.Optimizer):
    r"""Variational online Newton over a diagonal Normal guide's ``loc`` and ``scale`` groups
    (the :math:`\mu` and :math:`\rho` of :class:`~twodg_pyro.guides.MeanFieldGuide`, paired
    by position; module docstring for the update).

    Args:
        params: the groups of :func:`~twodg_pyro.infer.build_optimizer`: ``"loc"`` and
            ``"scale"`` (each tensor of ``loc`` paired with the ``scale`` tensor at the same
            position: the guide's sites in order), and optionally ``"deterministic"``.
        lr: the default learning rate :math:`\alpha` (the groups' own ``lr`` win; the
            ``scale`` group's is unused: :math:`\beta_2` sets the precision's rate).
        kl_weight: :math:`\beta` of the loss the gradients come from (``ess`` :math:`= N /
            \beta`).
        beta1: the momentum of the gradient (IVON: 0.9).
        beta2: the rate :math:`1 - \beta_2` of the precision's running estimate (IVON:
            0.99999; smaller moves the scales faster).
        clip_radius: :math:`\xi`, the largest change of a mean per unit learning rate
            (``None``: no clipping).
        warmup_steps: linear warm-up of the learning rate over this many steps.
        total_steps: the cosine schedule's length (``0``: constant after the warm-up); later
            steps only settle the precisions (learning rate 0, decaying :math:`r`).
        settle_rate: the precisions' rate in those steps held constant instead of decaying
            (``None``: the decay; a constant keeps the correction's bias, module
            docstring).
        adam_betas: Adam's ``betas`` for the ``deterministic`` group.

    Raises:
        ValueError: a setting out of range, a group other than ``loc`` / ``scale`` /
            ``deterministic`` (VON does not know how to train it), or ``loc`` and ``scale``
            tensors that do not pair up.
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 0.1,
        kl_weight: float = 1.0,
        beta1: float = 0.9,
        beta2: float = 0.99999,
        clip_radius: float | None = 1e-3,
        warmup_steps: int = 0,
        total_steps: int = 0,
        adam_betas: tuple[float, float] = (0.9, 0.999),
        settle_rate: float | None = None,
    ):
        for name, value, ok in (
            ("lr", lr, lr > 0),
            ("kl_weight", kl_weight, kl_weight > 0),
            ("beta1", beta1, 0 <= beta1 < 1),
            ("beta2", beta2, 0 <= beta2 < 1),
            ("clip_radius", clip_radius, clip_radius is None or clip_radius > 0),
            ("warmup_steps", warmup_steps, int(warmup_steps) >= 0),
            ("total_steps", total_steps, int(total_steps) >= 0),
            ("settle_rate", settle_rate, settle_rate is None or 0 < settle_rate <= 1),
        ):
            finite = value is None or math.isfinite(float(value))
            if not (ok and finite):
                raise ValueError(f"VariationalOnlineNewton: {name} = {value!r} is out of range")
        defaults = dict(
            lr=lr,
            kl_weight=float(kl_weight),
            beta1=beta1,
            beta2=beta2,
            clip_radius=clip_radius,
            warmup_steps=int(warmup_steps),
            total_steps=int(total_steps),
            adam_betas=tuple(adam_betas),
            settle_rate=settle_rate,
            step=0,
        )
        super().__init__(params, defaults)
        names = [g.get("name") for g in self.param_groups]
        unknown = [n for n in names if n not in (_LOC, _SCALE, _OTHER)]
        if unknown or _LOC not in names or _SCALE not in names:
            raise ValueError(
                "VariationalOnlineNewton trains a diagonal Normal guide (its groups 'loc' and "
                f"'scale', and the model's 'deterministic'); got groups {names}"
            )
        locs, rhos = self._group(_LOC)["params"], self._group(_SCALE)["params"]
        shapes = ([tuple(p.shape) for p in locs], [tuple(p.shape) for p in rhos])
        if shapes[0] != shapes[1]:
            raise ValueError(
                "VariationalOnlineNewton: the 'loc' and 'scale' tensors do not pair up "
                f"(shapes {shapes[0]} and {shapes[1]})"
            )

    def _group(self, name: str) -> dict:
        return next(g for g in self.param_groups if g.get("name") == name)

    @staticmethod
    def scheduled_lr(group: dict, step: int) -> float:
        r""":math:`\alpha_t` of ``group`` at step ``step`` (1-based): linear warm-up, then a
        cosine to 0 at ``total_steps``, and 0 after it (the precisions still move)."""
        lr, warm, total = group["lr"], group["warmup_steps"], group["total_steps"]
        if warm and step <= warm:
            return lr * step / warm
        if total:
            done = min(1.0, (step - warm) / max(1, total - warm))
            return lr * 0.5 * (1.0 + math.cos(math.pi * done))
        return lr

    @torch.no_grad()
    def step(self, closure=None):
        """One VON step from the gradients of the last backward pass (``closure``: as in
        ``torch.optim``, re-evaluates the loss first)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        loc_group, scale_group = self._group(_LOC), self._group(_SCALE)
        loc_group["step"] += 1
        t = loc_group["step"]
        alpha = self.scheduled_lr(loc_group, t)
        r, total = 1.0 - loc_group["beta2"], loc_group["total_steps"]
        if total and t > total:  # settling at fixed means: a Robbins-Monro rate
            r = loc_group.get("settle_rate") or 1.0 / (1.0 / r + t - total)
        pairs = [
            (mu, rho)
            for mu, rho in zip(loc_group["params"], scale_group["params"], strict=True)
            if mu.grad is not None and rho.grad is not None
        ]
        if pairs:
            locs, rhos = (list(ps) for ps in zip(*pairs, strict=True))
            self._posterior_step(loc_group, locs, rhos, alpha, r)
        for group in self.param_groups:
            if group.get("name") == _OTHER:
                self._adam(group, t)
        return loss

    def _posterior_step(self, group: dict, locs: list, rhos: list, alpha: float, r: float):
        r"""The update of the module docstring on every pair ``(mu, rho)`` of the ``loc``
        ``group`` at once: one flat vector of all the weights (a few elementwise operations
        in all, not a few per tensor); the momentum stays one state tensor per ``mu``
        (checkpoints, and :func:`~twodg_pyro.infer.optim.remap_optimizer_rows`).  After a
        fused draw (``fused_kl``) it takes the draw's :math:`\sigma` and leaves its own
        :math:`\sigma'` for the next draw (:mod:`twodg_pyro.nn.shared_scale`)."""
        beta, b1, radius = group["kl_weight"], group["beta1"], group["clip_radius"]
        t = group["step"]
        moms, grads = self._momenta(locs), [mu.grad for mu in locs]
        mom, grad = flat_view(moms), flat_view(grads)
        if mom is None or grad is None:
            torch._foreach_mul_(moms, b1)
            torch._foreach_add_(moms, grads, alpha=1.0 - b1)
            mom = flat(moms)
        else:  # the same arithmetic, as one operation on all the weights
            mom.mul_(b1).add_(grad, alpha=1.0 - b1)
        own_rho = flat_view(rhos)  # the parameters' own storage, where laid end to end
        rho = flat(rhos) if own_rho is None else own_rho
        drawn = scale_of_draw(rhos, rho)  # a fused draw's sigma at this rho, if any
        sigma = softplus(rho) if drawn is None else drawn
        precision = sigma.pow(-2)
        # (dL/drho) / (sigmoid(rho) beta sigma) = S_hat - S: the precision's natural gradient
        delta = flat([p.grad for p in rhos]).div(torch.sigmoid(rho).mul_(sigma).mul_(beta))
        correction = delta.square().div_(precision).mul_(0.5 * r * r)
        precision.add_(delta, alpha=r).add_(correction)
        direction = mom.div(precision * ((1.0 - b1**t) * beta))
        if radius is not None:
            direction.clamp_(-radius, radius)
        new_sigma = precision.rsqrt_().clamp_min_(MIN_SIGMA)
        new_rho = inverse_softplus(new_sigma)
        shapes = [mu.shape for mu in locs]
        loc = flat_view(locs)
        if loc is None:
            torch._foreach_add_(locs, split_as(direction, shapes), alpha=-alpha)
        else:
            loc.add_(direction, alpha=-alpha)
        if own_rho is None:
            for p, v in zip(rhos, split_as(new_rho, shapes), strict=True):
                p.copy_(v)
        else:
            own_rho.copy_(new_rho)
        if drawn is None:
            for p in rhos:
                self.state[p].pop(_SHARED, None)
        else:  # the next fused draw takes sigma' as it is; kept as state too, for a resume
            for p, v in zip(rhos, split_as(new_sigma, shapes), strict=True):
                self.state[p][_SHARED] = v
            remember_scale(rhos, new_rho, new_sigma)

    def _momenta(self, locs: list) -> list:
        """Each mean's momentum (its state ``momentum``, zeros at first), laid end to end
        (:func:`~twodg_pyro.nn.flat_storage.pack`: also after a resume, whose state comes
        back one tensor at a time) so that the update reads them as one view."""
        for mu in locs:
            if "momentum" not in self.state[mu]:
                self.state[mu]["momentum"] = torch.zeros_like(mu)
        moms = [self.state[mu]["momentum"] for mu in locs]
        pack(moms)
        return moms

    def load_state_dict(self, state_dict: dict) -> None:
        r"""``torch.optim.Optimizer.load_state_dict``; a fused run's shared scale
        :math:`\sigma'` comes back with it (the state ``shared_scale`` of the ``scale``
        parameters, taken while its inverse softplus is their :math:`\rho` to the bit), so
        that a resumed run draws as the uninterrupted one does."""
        super().load_state_dict(state_dict)
        rhos = [p for p in self._group(_SCALE)["params"] if _SHARED in self.state[p]]
        if rhos:
            rho = flat(rhos).clone()  # kept by the shared scale: no view of the parameters
            sigma = flat([self.state[p][_SHARED] for p in rhos])
            if torch.equal(inverse_softplus(sigma), rho):
                remember_scale(rhos, rho, sigma)

    def _adam(self, group: dict, t: int) -> None:
        """Adam on the ``deterministic`` group (no weight decay), at its scheduled rate."""
        lr, (a1, a2) = self.scheduled_lr(group, t), group["adam_betas"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "exp_avg" not in state:
                state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
            m = state["exp_avg"].mul_(a1).add_(p.grad, alpha=1 - a1)
            v = state["exp_avg_sq"].mul_(a2).addcmul_(p.grad, p.grad, value=1 - a2)
            denom = (v / (1 - a2**t)).sqrt_().add_(1e-8)
            p.addcdiv_(m, denom, value=-lr / (1 - a1**t))
