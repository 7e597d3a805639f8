r"""Where a 2DG + Laplace head file's NLL comes from (issue 47): its head's spread, its
last layer's fit, or the body's features.  Reads the files a frontier run kept
(``experiments/frontier.py ... --laplace-head --keep DIR``) and scores, on the validation
and the test images, one seed at a time:

* the **mean network** alone (one forward pass, softmax of its logits): the deterministic
  network, stage 1's posterior means (the Laplace row's network) and each head file's
  body with its own last layer;
* the **head as stored** (its prior precision :math:`\delta` from laplace-torch's marginal
  likelihood), and with :math:`\delta` times each factor of :data:`FACTORS` (laplace-torch's
  grid search, scored by our seeded predictive): the factor of lowest validation NLL is
  the one a user would choose;
* the head **at its mode**: the last layer refitted to the maximum of
  :math:`\sum_n \log p(y_n \mid W\phi(x_n) + b) - \tfrac{\delta}{2}\lVert (W, b)\rVert^2`
  on the training set's features :math:`\phi` (:func:`last_layer_mode`; a Laplace
  approximation is taken at a mode, and the 2DG mean's last layer is the centre of its
  shared components, not one), the Laplace head fitted again around it.

The head cannot predict better than its mean network does, up to the spread it adds; a
body whose own one-pass NLL is above the deterministic network's leaves the head
nothing to gain.

    python experiments/frontier.py --arch resnet20 ... --laplace-head --keep runs/keep \
        --stem head_nll_seed2 --seeds 2
    python experiments/head_nll.py --frontier experiments/results/head_nll_seed2.json \
        --keep runs/keep

Writes ``experiments/results/{stem}.{json,md}`` (default stem: the frontier's, with
``_study``).
"""

from __future__ import annotations

import argparse
import copy
import json
import types
from pathlib import Path

import torch
import torch.nn.functional as F
from common import cell, command, setup, table
from frontier import HEAD, score, seed_settings
from torch.utils.data import DataLoader

from twodg_pyro.data import make_loader
from twodg_pyro.files import atomic_write_text
from twodg_pyro.methods import fit_laplace, load_method, with_feature_residual
from twodg_pyro.methods.feature_residual import last_layer_module, layer_inputs
from twodg_pyro.metrics import classification_metrics
from twodg_pyro.nn import recompute_norm_stats
from twodg_pyro.pipeline import config_from_dict
from twodg_pyro.pipeline.outputs.uncertainty_step import UncertaintySets, data_tensors
from twodg_pyro.pipeline.settings.build import load_data
from twodg_pyro.pipeline.settings.config import UncertaintyConfig

#: the prior precision's factors of the grid (half decades around laplace-torch's fit)
FACTORS = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
#: the OOD sets of the frontier's scores
OOD = UncertaintyConfig(ood_size=500, corruptions=[])


def one_pass_nll(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    """Accuracy and NLL of the softmax of ``net``'s logits (one forward pass)."""
    with torch.no_grad():
        probs = torch.softmax(net.eval()(x), -1)
    return classification_metrics(probs, y)


def last_layer_mode(post, train_loader, max_iter: int = 500):
    r"""A copy of ``post``'s network whose last layer (the layer ``post`` covers) is the
    maximum of :math:`\sum_n \log \mathrm{softmax}(W\phi_n + b)_{y_n} -
    \tfrac{\delta}{2}(\lVert W\rVert^2 + \lVert b\rVert^2)` over the training features
    :math:`\phi_n` (L-BFGS from the current weights; :math:`\delta` = ``post``'s prior
    precision), the body unchanged."""
    net = copy.deepcopy(post.net).eval()
    last = last_layer_module(net, post.param_names)
    phi = layer_inputs(net, last, train_loader)
    y = torch.cat([b[1] for b in train_loader])
    delta = float(post.prior_precision[0])
    w = last.weight.detach().clone().requires_grad_(True)
    b = last.bias.detach().clone().requires_grad_(True)
    opt = torch.optim.LBFGS([w, b], max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        nll = F.cross_entropy(phi @ w.T + b, y, reduction="sum")
        loss = nll + 0.5 * delta * (w.square().sum() + b.square().sum())
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        last.weight.copy_(w)
        last.bias.copy_(b)
    return net


def predictive(method, x, y, draws: int, seed: int) -> dict:
    """Accuracy, NLL and ECE of ``method``'s seeded predictive."""
    return classification_metrics(method.sample_probs(x, draws, seed).mean(0), y)


def study_seed(points: list[dict], folder: Path, args, seed: int) -> list[dict]:
    """The rows of one seed (module docstring)."""
    ns = types.SimpleNamespace(
        methods=None, arch="resnet20", recipe=args.recipe, root=args.root, quick=False
    )
    ns.settle_epochs = args.settle_epochs
    cfg = config_from_dict(seed_settings(ns, seed))
    split = load_data(cfg.data, image=True)
    sets = {
        "val": data_tensors(DataLoader(split.val, batch_size=1000)),
        "test": data_tensors(DataLoader(split.test, batch_size=1000)),
    }
    train = make_loader(split.train, cfg.laplace.batch_size, shuffle=False)
    S = cfg.num_samples
    rows: list[dict] = []

    ev = UncertaintySets(split, DataLoader(split.test, batch_size=1000), OOD, seed)

    def add(name: str, scores: dict, ood=None, **extra) -> None:
        row = {"seed": seed, "row": name, **extra}
        for where, m in scores.items():
            row.update({f"{where}_accuracy": m["accuracy"], f"{where}_nll": m["nll"]})
        if ood is not None:  # a head: its mean OOD AUROC, as the frontier scores it
            row["mean_ood_auroc"] = score(ood, *sets["test"], ev, S, 10, seed)["mean_ood_auroc"]
        rows.append(row)
        print(
            f"[seed {seed}] {name}: "
            + ", ".join(f"{k} {v:.4f}" for k, v in row.items() if k.endswith("nll")),
            flush=True,
        )

    def one_pass(name: str, net) -> None:
        add(name, {k: one_pass_nll(net, *v) for k, v in sets.items()})

    def around(name: str, head) -> None:
        add(name, {k: predictive(head, *v, S, seed) for k, v in sets.items()}, head)

    for point, name in (("deterministic float32", "deterministic network"), ("laplace", "laplace")):
        q = next(p for p in points if p["point"] == point)
        rows.append(
            {
                "seed": seed,
                "row": f"{name} (the frontier's point)",
                "val_accuracy": q["val_accuracy"],
                "val_nll": q["val_nll"],
                "test_accuracy": q["accuracy"],
                "test_nll": q["nll"],
                "mean_ood_auroc": q["mean_ood_auroc"],
            }
        )
    stage1 = load_method(folder / "model_laplace.pt").net
    one_pass("stage 1's mean network", stage1)
    stage1 = recompute_norm_stats(copy.deepcopy(stage1), train)
    one_pass("stage 1's mean network, BatchNorm statistics at the mean", stage1)
    for p in points:
        if p["family"] != HEAD or " chosen " in p["point"]:
            continue
        variant = p["point"].removeprefix(f"{HEAD} ")
        post = load_method(folder / p["file"])
        one_pass(f"{variant}: mean network", post.net)
        delta = float(post.prior_precision[0])
        grid = []
        for f in FACTORS:
            tuned = post.rebuilt(prior_precision=torch.tensor([delta * f]))
            grid.append((f, {k: predictive(tuned, *v, S, seed) for k, v in sets.items()}))
        for f, scores in grid:
            name = "head as stored" if f == 1.0 else f"head, prior precision x{f:g}"
            add(f"{variant}: {name}", scores, post if f == 1.0 else None, factor=f)
        f, scores = min(grid, key=lambda g: g[1]["val"]["nll"])
        tuned = post.rebuilt(prior_precision=torch.tensor([delta * f]))
        name = f"{variant}: head, prior precision chosen on validation (x{f:g})"
        add(name, scores, tuned, factor=f)
        mode = last_layer_mode(post, train)
        calibrated = post.bnn.with_mean_norm_stats(train).mean_network()
        for net, label, head_label in (
            (mode, "last layer at its mode", "head at the mode"),
            (calibrated, "BatchNorm statistics at the mean", "head around it"),
        ):
            one_pass(f"{variant}: mean network, {label}", net)
            head = fit_laplace(net, train, cfg.laplace)
            around(f"{variant}: {head_label}", head)
        gp = with_feature_residual(head, train, 16, seed, 0.9)
        around(f"{variant}: head around it + GP residual on 16 centres floored at q=0.9", gp)
    return rows


def markdown(rows: list[dict], argv) -> str:
    """The study's table, one per seed."""
    lines = [
        "# Where the head file's NLL comes from (issue 47)",
        "",
        f"Command: `{command('head_nll.py', argv)}`.  Validation: 400 images; test: 1,000;"
        " the heads' predictive: the run's 30 seeded draws.",
    ]
    for seed in sorted({r["seed"] for r in rows}):
        cells = [
            [
                r["row"],
                f"{r['val_accuracy']:.4f}",
                f"{r['val_nll']:.4f}",
                f"{r['test_accuracy']:.4f}",
                f"{r['test_nll']:.4f}",
                cell(r.get("mean_ood_auroc")),
            ]
            for r in rows
            if r["seed"] == seed
        ]
        cols = ["row", "val acc", "val NLL", "test acc", "test NLL", "OOD AUROC"]
        lines += table(f"Seed {seed}:", cols, cells)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frontier", required=True, help="the frontier run's JSON")
    p.add_argument("--keep", required=True, help="its --keep folder")
    p.add_argument("--root", default="data/mnist_subset")
    p.add_argument("--recipe", default="natural gradient")
    p.add_argument("--settle-epochs", type=int, default=40)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="experiments/results")
    p.add_argument("--stem", default=None)
    args = p.parse_args(argv)
    if not setup(args.threads, args.root):
        return 2
    run = json.loads(Path(args.frontier).read_text())
    rows: list[dict] = []
    for seed in run["seeds"]:
        mine = [q for q in run["points"] if q["seed"] == seed]
        rows += study_seed(mine, Path(args.keep) / f"seed{seed}", args, seed)
    stem = args.stem or f"{Path(args.frontier).stem}_study"
    out = Path(args.out)
    atomic_write_text(out / f"{stem}.json", json.dumps({"rows": rows}, indent=1))
    text = markdown(rows, argv)
    atomic_write_text(out / f"{stem}.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
