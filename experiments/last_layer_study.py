"""The last layer of the natural-gradient posterior (issue 43): why its OOD detection stays
at the deterministic network's, measured on the validation split.

The natural-gradient recipe's stage 1 (variational online Newton, KL weight 0.3 times the
data-size rule, BatchNorm statistics frozen: ``experiments/uncertainty.py``) is trained
once from the recipe's pretrained network; its last layer is then given other posteriors,
each scored on the **validation split** (the OOD sets and corruptions made from the
validation images, as in ``stage1_selection.py``; the test images play no part):

* ``as trained``: the mean-field posterior itself;
* ``diagonal, untempered``: the last layer's scales at the true ELBO's fixed point on the
  same curvature.  A Normal prior of precision :math:`P` and a tempered fit at KL weight
  :math:`\\beta` have :math:`S_i = h_i/\\beta + P` (``twodg_pyro.infer.von``), so the
  curvature is :math:`h_i = \\beta (S_i - P)` and the untempered precision
  :math:`h_i + P'`, with :math:`P'` the evidence's (type-II maximum likelihood of a
  diagonal Laplace at the fixed mean: the maximum over a log grid of
  :math:`-\\tfrac{P}{2}\\lVert\\mu\\rVert^2 + \\tfrac{D}{2}\\log P - \\tfrac12\\sum_i
  \\log(h_i + P)`) or :math:`P' = 0.1` (a prior standard deviation of 3.2, about 25
  times the network's on either network's last layer; chosen by hand on ResNet-20: the
  width the OOD gain needs);
* ``Laplace``: the last layer's full generalised Gauss-Newton matrix :math:`H` at the mean
  network's features (:math:`\\sum_n \\Lambda_n \\otimes \\tilde\\phi_n\\tilde\\phi_n^\\top`,
  :math:`\\Lambda_n = \\operatorname{diag}(p_n) - p_n p_n^\\top`, :math:`\\tilde\\phi_n`
  the features and a 1 for the bias), untempered, its prior precision by the same
  evidence with :math:`\\log\\det(H + P)`; drawn with the features of the mean network
  or of the mean-field posterior's draws; and the diagonal of the same :math:`H` (the
  structure a mean-field last layer can express).

    python experiments/last_layer_study.py --arch resnet20     # 10 min, 2 threads
    python experiments/last_layer_study.py --arch lenet5

Results: ``experiments/results/recipe_selection/last_layer_<arch>.{json,md}``.
"""

from __future__ import annotations

import copy
import json
import time

import torch
import torch.nn.functional as F
from common import cell, command, data_size_beta, setup
from recipe_selection import append_record, selection_output, selection_parser, settings_of
from stage1_selection import GRID, score_cells, validation_record

from twodg_pyro.data import make_loader
from twodg_pyro.guides.base import site_key
from twodg_pyro.methods import fit_laplace
from twodg_pyro.methods.base import TrainedMethod
from twodg_pyro.methods.feature_residual import layer_inputs
from twodg_pyro.nn.functional import inverse_softplus
from twodg_pyro.pipeline import config_from_dict, run
from twodg_pyro.pipeline.methods.algorithm1 import stage1_mean_field
from twodg_pyro.pipeline.outputs.uncertainty_step import UncertaintySets, data_tensors
from twodg_pyro.pipeline.runtime.context import RunContext
from twodg_pyro.pipeline.settings.build import eval_data, seed_everything
from twodg_pyro.pipeline.settings.config import merge_settings
from twodg_pyro.pipeline.settings.evaluation import UncertaintyConfig

#: the natural-gradient recipe's stage 1 on each network (its ResNet-20 epochs: 20)
POINTS = {"resnet20": "von, frozen, x0.3, 20 + 0 settle", "lenet5": "von, frozen, x0.3"}


def stage1_point(args) -> str:
    """The stage-1 point (a name of ``stage1_selection.GRID``) a study starts from: its
    ``--point`` where it has one, else the recipe's, ``POINTS[arch]``."""
    return getattr(args, "point", None) or POINTS[args.arch]


#: the prior precisions the evidence is maximised over
GRID_P = torch.logspace(-4, 4, 801, dtype=torch.float64)


def evidence_precision(mu2: float, curvature: torch.Tensor) -> float:
    r"""The scalar prior precision of largest Laplace evidence at a fixed mean:
    :math:`-\tfrac{P}{2}\lVert\mu\rVert^2 + \tfrac{D}{2}\log P - \tfrac12\sum_i
    \log(\lambda_i + P)`, with ``curvature`` the :math:`\lambda_i` (eigenvalues or a
    diagonal)."""
    d = curvature.numel()
    ev = [-(p / 2) * mu2 + d / 2 * p.log() - 0.5 * (curvature + p).log().sum() for p in GRID_P]
    return float(GRID_P[int(torch.stack(ev).argmax())])


class LastLayer:
    """A mean-field posterior's network, its last layer (the last two sites: weight and
    bias) read out and its draws taken apart: features from the mean or a draw."""

    def __init__(self, stage1):
        self.model, self.guide = stage1.model, stage1.guide
        self.net = self.model.net
        self.sites = list(self.guide.sites)
        self.params = dict(self.net.named_parameters())
        self.last = self.net.get_submodule(self.sites[-1].name.rsplit(".", 1)[0])

    def set_weights(self, gen: torch.Generator | None = None) -> None:
        """The guide's means (``gen`` None) or one draw into the network's parameters."""
        with torch.no_grad():
            for s in self.sites:
                k = site_key(s.name)
                loc, scale = self.guide.locs[k], F.softplus(self.guide.rhos[k])
                w = loc if gen is None else loc + scale * torch.randn(loc.shape, generator=gen)
                self.params[s.name].copy_(w)

    @torch.no_grad()
    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The last layer's inputs and a column of ones, ``(N, F + 1)``, float64."""
        self.net.eval()
        phi = layer_inputs(self.net, self.last, x.split(500)).double()
        return torch.cat([phi, torch.ones(len(phi), 1, dtype=phi.dtype)], 1)

    def mean(self) -> torch.Tensor:
        """The last layer's mean, ``(C, F + 1)``: each class's weights and bias."""
        w, b = (self.guide.locs[site_key(s.name)].detach().double() for s in self.sites[-2:])
        return torch.cat([w, b[:, None]], 1)


class LaplaceLastLayer(TrainedMethod):
    r"""The features of ``ll``'s network (its mean, or a mean-field draw per draw) and a
    Gaussian last layer :math:`\mathcal N(\mu, \Sigma)` (``chol``: :math:`\Sigma`'s
    Cholesky factor over the class-major :math:`(C, F+1)` parameters)."""

    name = "laplace last layer"

    def __init__(self, ll: LastLayer, chol: torch.Tensor, feature_draws: bool):
        super().__init__()
        self.ll, self.chol, self.feature_draws = ll, chol, feature_draws

    @property
    def net(self):
        return self.ll.net

    def _draws(self, parts, num_samples: int, seed: int) -> torch.Tensor:
        x = torch.cat([p[0] for p in parts])
        gen = torch.Generator().manual_seed(int(seed))
        mu = self.ll.mean()
        self.ll.set_weights(None)
        phi = self.ll.features(x)
        out = []
        for _ in range(int(num_samples)):
            if self.feature_draws:
                self.ll.set_weights(gen)
                phi = self.ll.features(x)
            eps = torch.randn(mu.numel(), generator=gen, dtype=torch.float64)
            theta = mu + (self.chol @ eps).reshape(mu.shape)
            out.append(torch.softmax(phi @ theta.T, 1).float())
        self.ll.set_weights(None)
        return torch.stack(out)


def natural_gradient_stage1(args) -> dict:
    """What a validation study of the natural-gradient posterior starts from (``args``:
    :func:`recipe_selection.selection_parser`'s): torch's threads set, the recipe's
    pretrained network (``"art"``, ``"det"``), the validation images (``"val"``: inputs
    and labels) and their OOD and shifted sets (``"ev"``), the training inputs
    (``"train_x"``), and stage 1 (``"stage1"``) trained from a copy of the network at
    :func:`stage1_point` with its KL weight (``"beta"``) and settings (``"cfg"``)."""
    setup(args.threads)
    base = settings_of(args.arch, args.root, args.seed, args.quick)
    art = run(config_from_dict(merge_settings(base, {"methods": ["deterministic"]})))
    det = art.trained["deterministic"]
    xv, yv = data_tensors(eval_data(art.split.val))
    xt, _ = data_tensors(eval_data(art.split.train))
    ucfg = UncertaintyConfig(ood_size=args.ood_size, shift_size=args.shift_size, severities=[5])
    ev = UncertaintySets(art.split, (xv, yv), ucfg, args.seed)
    over, multiple = GRID[stage1_point(args)]
    beta = multiple * data_size_beta(len(art.split.train), det.net)
    over = merge_settings(over, {"stage1": {"kl_weight": beta}})
    cfg = config_from_dict(merge_settings(base, {**over, "methods": ["mean_field"]}))
    seed_everything(cfg.seed)
    stage1 = stage1_mean_field(RunContext(cfg=cfg), art.split, copy.deepcopy(det.net))
    return dict(
        art=art, det=det, val=(xv, yv), train_x=xt, ev=ev, beta=beta, cfg=cfg, stage1=stage1
    )


def markdown(doc: dict) -> str:
    lines = [
        f"# The last layer of the natural-gradient posterior: {doc['arch']}, seed {doc['seed']}",
        "",
        f"Command: `{doc['command']}`.  Stage 1: `{doc['point']}` (KL weight "
        f"{doc['kl_weight']:.4g}).  {doc['draws']} seeded draws on the validation images; "
        f"OOD sets of {doc['ood_size']} images made from them; severity-5 corruptions of "
        f"{doc['shift_size']}.  `P`: the last layer's prior precision (the network's "
        f"prior: {doc['network_precision']:.3g} on the weights).",
        "",
        "| last layer | P | acc | NLL | ECE | clean MI | OOD AUROC entropy (MI) "
        "| severity-5 NLL (mean) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["records"]:
        lines.append(
            f"| {r['point']} | {cell(r.get('prior_precision'), '.3g')} | {score_cells(r)} "
            f"| {cell(r['severity5'])} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = selection_parser(__doc__, 2, "default: last_layer_<arch>")
    args = p.parse_args(argv)
    out, stem, done = selection_output(args, f"last_layer_{args.arch}", markdown)
    if done:
        return 0
    study = natural_gradient_stage1(args)
    art, det, stage1, ev, beta, cfg = (
        study[k] for k in ("art", "det", "stage1", "ev", "beta", "cfg")
    )
    (xv, yv), xt = study["val"], study["train_x"]
    ll = LastLayer(stage1)
    last = ll.sites[-2:]
    network_precision = float(1.0 / stage1.model.prior(last[0]).variance.flatten()[0])
    doc = {
        "arch": args.arch,
        "seed": args.seed,
        "command": command("last_layer_study.py", argv),
        "point": POINTS[args.arch],
        "kl_weight": beta,
        "draws": args.draws,
        "ood_size": args.ood_size,
        "shift_size": args.shift_size,
        "network_precision": network_precision,
        "records": [],
    }
    t0 = time.perf_counter()

    def save(point: str, method, probs, precision: float | None = None) -> None:
        rec = validation_record(probs, ev, method, args.draws, yv, point, prior_precision=precision)
        append_record(out, stem, doc, rec, markdown)
        print(f"[{time.perf_counter() - t0:.0f} s] {point}: {json.dumps(rec)}", flush=True)

    save("deterministic network", det, det.sample_probs(xv, 1, args.seed).mean(0))
    save("as trained (mean-field)", stage1, stage1.predict((xv, yv), args.draws, args.seed).mean)

    # the untempered diagonal on the fit's own curvature: h = beta (S - P)
    rhos = {s.name: ll.guide.rhos[site_key(s.name)] for s in last}
    kept = {n: r.detach().clone() for n, r in rhos.items()}
    curv = {}
    for s in last:
        sigma = F.softplus(kept[s.name]).double()
        prec = stage1.model.prior(s, sigma).variance.reciprocal()
        curv[s.name] = (beta * (sigma.pow(-2) - prec)).clamp_min(0)
    mu = ll.mean()
    h_diag = torch.cat([c.flatten() for c in curv.values()])
    for label, precision in (
        ("diagonal, untempered, evidence prior", evidence_precision(mu.square().sum(), h_diag)),
        ("diagonal, untempered, prior precision 0.1", 0.1),
    ):
        with torch.no_grad():
            for n, r in rhos.items():
                r.copy_(inverse_softplus((curv[n] + precision).rsqrt()).to(r.dtype))
        probs = stage1.predict((xv, yv), args.draws, args.seed).mean
        save(label, stage1, probs, precision)
    with torch.no_grad():
        for n, r in rhos.items():
            r.copy_(kept[n])

    # Laplace: the full GGN of the last layer at the mean network's training features
    ll.set_weights(None)
    phi = ll.features(xt)
    p = torch.softmax(phi @ mu.T, 1)
    lam = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    d = mu.numel()
    ggn = torch.einsum("nkl,ni,nj->kilj", lam, phi, phi).reshape(d, d)
    eye = torch.eye(d, dtype=ggn.dtype)
    full_p = evidence_precision(mu.square().sum(), torch.linalg.eigvalsh(ggn).clamp_min(0))
    diag_p = evidence_precision(mu.square().sum(), torch.diagonal(ggn))
    full = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(ggn + full_p * eye)))
    diag = torch.diag((torch.diagonal(ggn) + diag_p).rsqrt())
    for label, chol, draws, precision in (
        ("Laplace, full GGN, mean features", full, False, full_p),
        ("Laplace, full GGN, mean-field features", full, True, full_p),
        ("Laplace, diagonal GGN, mean-field features", diag, True, diag_p),
    ):
        method = LaplaceLastLayer(ll, chol, draws)
        save(label, method, method.sample_probs(xv, args.draws, args.seed).mean(0), precision)
    # laplace-torch's last-layer Kronecker-factored Laplace (the ``laplace`` row's
    # settings: the prior precision by the marginal likelihood) on the deterministic
    # network and on the natural-gradient posterior's mean network
    lc = cfg.laplace
    loader = make_loader(art.split.train, lc.batch_size, shuffle=False)
    ll.set_weights(None)
    mean_net = copy.deepcopy(ll.net).requires_grad_(True)  # the model holds its sites fixed
    for label, net in (
        ("laplace-torch (KFAC) on the deterministic network", det.net),
        ("laplace-torch (KFAC) on the mean-field mean network", mean_net),
    ):
        post = fit_laplace(net, loader, lc)
        precision = float(post.prior_precision.flatten()[0])
        save(label, post, post.sample_probs(xv, args.draws, args.seed).mean(0), precision)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
