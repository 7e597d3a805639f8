"""SVI step time: our mean-field step and stage-3 step against a hand-written
Bayes-by-backprop step (MLP 784-400-400-10, batch 128), side by side in one run.

Targets (issues 2 and 4): mean-field step <= 1.1x the hand-written step; stage-3
(shared-GMM) step <= 1.1x our mean-field step.  For information (issue 14): the same
mean-field guide trained by stock ``pyro.infer.SVI`` + ``TraceMeanField_ELBO`` +
``pyro.optim.Adam``, i.e. with the guide's ``pyro.param`` statements and the param store,
which ``fit``'s loop (the rows above) skips; and ``mean_field_traced``, ``fit``'s step
with ``DecomposedELBO(fast_step=False)`` (Pyro traces and replays both programs at every
step; the default fast step, :mod:`twodg_pyro.infer.fast_step`, computes the same loss
and gradients without tracing).

Run: python benchmarks/bench_svi_step.py
"""

from __future__ import annotations

import math

import pyro
import pyro.optim
import torch
import torch.nn.functional as F
from _common import interleaved, record
from pyro.infer import SVI, TraceMeanField_ELBO
from torch import nn

from twodg_pyro.bnn import BNNModel
from twodg_pyro.guides import MeanFieldGuide, SharedGMMGuide
from twodg_pyro.infer import DecomposedELBO
from twodg_pyro.infer.optim import build_optimizer
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.models import MLP
from twodg_pyro.sharing import SharingStructure
from twodg_pyro.sharing.build import site_layouts

N_DATA, BATCH = 60000, 128


class HandBBB(nn.Module):
    """Bayes-by-backprop in plain torch: w = mu + softplus(rho) * eps, analytic KL to N(0,1)."""

    def __init__(self, sizes=(784, 400, 400, 10)):
        super().__init__()
        self.mu = nn.ParameterList()
        self.rho = nn.ParameterList()
        for a, b in zip(sizes[:-1], sizes[1:], strict=True):
            for shape in ((b, a), (b,)):
                self.mu.append(nn.Parameter(torch.randn(shape) * 0.05))
                self.rho.append(nn.Parameter(torch.full(shape, -5.0)))

    def loss(self, x, y):
        h = x
        kl = 0.0
        ws = []
        for mu, rho in zip(self.mu, self.rho, strict=True):
            s = F.softplus(rho)
            ws.append(mu + s * torch.randn_like(mu))
            kl = kl + (-torch.log(s) + (s**2 + mu**2) / 2 - 0.5).sum()
        for i in range(0, len(ws), 2):
            h = F.linear(h, ws[i], ws[i + 1])
            if i + 2 < len(ws):
                h = F.relu(h)
        return F.cross_entropy(h, y, reduction="sum") * (N_DATA / x.shape[0]) + kl


def make_structure(model, n_components=64, outlier_frac=0.01, ellipse_frac=0.005, seed=0):
    """A synthetic sharing structure of realistic proportions for timing."""
    g = torch.Generator().manual_seed(seed)
    sites, off = site_layouts(model.sites)
    perm = torch.randperm(off, generator=g)
    n_out, n_ell = int(outlier_frac * off), int(ellipse_frac * off)
    out, ell, plain = perm[:n_out], perm[n_out : n_out + n_ell], perm[n_out + n_ell :]
    K = n_components
    alphas = torch.rand(n_ell, 5, generator=g)
    return SharingStructure(
        sites=sites,
        coordinates="sigma",
        means=torch.stack([torch.linspace(-0.2, 0.2, K), torch.full((K,), 0.01)], 1),
        covariances=torch.eye(2).expand(K, 2, 2) * 1e-4,
        outlier_index=out.sort().values,
        outlier_loc=torch.randn(n_out) * 0.3,
        outlier_scale=torch.full((n_out,), 0.01),
        plain_index=plain.sort().values,
        plain_component=torch.randint(0, K, (plain.numel(),), generator=g),
        ellipse_index=ell.sort().values,
        ellipse_components=torch.randint(0, K, (n_ell, 5), generator=g),
        ellipse_alphas=alphas / alphas.sum(1, keepdim=True),
        inlier_points=torch.randn(off - n_out, 2, generator=g),
    )


def main() -> None:
    torch.manual_seed(0)
    x, y = torch.randn(BATCH, 784), torch.randint(0, 10, (BATCH,))
    hand = HandBBB()
    opt_hand = torch.optim.Adam(hand.parameters(), lr=1e-3)

    def hand_step():
        opt_hand.zero_grad(set_to_none=True)
        hand.loss(x, y).backward()
        opt_hand.step()

    model = BNNModel(MLP(784, (400, 400), 10), likelihood=Categorical(N_DATA))
    mf = MeanFieldGuide(model)
    elbo = DecomposedELBO()
    opt_mf = build_optimizer(model, mf, 1e-3)

    def mf_step():
        opt_mf.zero_grad(set_to_none=True)
        elbo.combine(elbo.loss_terms(model, mf, x, y)).backward()
        opt_mf.step()

    elbo_traced = DecomposedELBO(fast_step=False)

    def mf_traced_step():
        opt_mf.zero_grad(set_to_none=True)
        elbo_traced.combine(elbo_traced.loss_terms(model, mf, x, y)).backward()
        opt_mf.step()

    mf_stock = MeanFieldGuide(model)
    mf_stock.pyro_name = "stock"
    svi = SVI(model, mf_stock, pyro.optim.Adam({"lr": 1e-3}), TraceMeanField_ELBO())

    def stock_step():
        svi.step(x, y)

    contenders = {
        "hand_bbb": hand_step,
        "mean_field": mf_step,
        "mean_field_traced": mf_traced_step,
        "stock_svi_mean_field": stock_step,
    }
    for tying in ("representative", "stochastic", "tied"):
        sg = SharedGMMGuide(model, make_structure(model), tying)
        opt = build_optimizer(model, sg, 1e-3)

        def step(sg=sg, opt=opt):
            opt.zero_grad(set_to_none=True)
            elbo.combine(elbo.loss_terms(model, sg, x, y)).backward()
            opt.step()

        contenders[f"stage3_{tying}"] = step
    t = interleaved(contenders, repeats=15, inner=10)
    ratios = {k: v / t["hand_bbb"] for k, v in t.items()}
    stage3_vs_mf = {k: v / t["mean_field"] for k, v in t.items() if k.startswith("stage3")}
    lines = [
        "# SVI step, MLP 784-400-400-10, batch 128 (median of 15 interleaved rounds)",
        "",
        "| step | ms | ratio to hand-written BBB | ratio to our mean-field |",
        "|---|---|---|---|",
    ]
    for k, v in t.items():
        r2 = stage3_vs_mf.get(k, math.nan)
        lines.append(
            f"| {k} | {v * 1e3:.2f} | {ratios[k]:.2f} | "
            + ("-" if math.isnan(r2) else f"{r2:.2f}")
            + " |"
        )
    lines += [
        "",
        "Targets: mean_field <= 1.10 x hand_bbb; stage3 <= 1.10 x mean_field.",
        "stock_svi_mean_field: the same guide under pyro.infer.SVI + TraceMeanField_ELBO +",
        "pyro.optim.Adam (param statements, param store); for information.",
        "mean_field_traced: fit's step with DecomposedELBO(fast_step=False), for information.",
        "Command: `python benchmarks/bench_svi_step.py`",
    ]
    record(
        "bench_svi_step",
        {
            "ms": {k: v * 1e3 for k, v in t.items()},
            "ratio_to_hand": ratios,
            "stage3_ratio_to_mean_field": stage3_vs_mf,
        },
        "\n".join(lines) + "\n",
    )


if __name__ == "__main__":
    main()
