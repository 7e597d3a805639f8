r"""How wide the 2DG BNN's Laplace last layer should be (issue 43): its posterior covariance
scaled by :math:`s`, chosen on the validation split.

The ``2dg + laplace`` row of ``uncertainty.py`` (the natural-gradient recipe) fits
laplace-torch's last-layer Kronecker Laplace around the 2DG BNN's mean network, its prior
precision :math:`\delta` by the marginal likelihood: :math:`P = A \otimes G + \delta I`.
It meets issue 43's clean targets with room (NLL, ECE) and misses two of its uncertainty
targets (the mean MI AUROC >= 0.90 and the severity-5 NLL ratio <= 0.8). The study scales
the whole posterior covariance, :math:`P / s` (the curvature's factor and the prior
precision both divided by :math:`s`; :math:`s = 1` is the row), over :data:`SCALES`:
a wider last layer trades clean calibration for spread under shift and away from the data.

**The rule** (stated before the test images were scored for any seed but 0, and applied
on the validation split only): the widest :math:`s` whose validation NLL is at most the
deterministic network's and whose validation ECE is at most 0.02 (issue 43's clean
targets, on the seeds' means). The test rows of every :math:`s` are shown beside it.

Each seed trains the deterministic network with its last-layer Laplace (the baselines'
recipe) and the natural-gradient 2DG BNN (its representative tying), as
``uncertainty.py`` does with the same seed; every row is scored as there (30 seeded draws
on the clean images; 10 on the OOD sets and corruptions, made from the test images).

    python experiments/laplace_scale_study.py --arch resnet20 --seeds 0    # 14 min, 2 threads
    python experiments/laplace_scale_study.py --arch resnet20 --merge A.json B.json ...

Two more rows (:data:`RESIDUAL_DET`, :data:`RESIDUAL_2DG`) add the distance-aware
feature residual (:mod:`twodg_pyro.methods.feature_residual`) to the deterministic
network's Laplace and to the 2DG BNN's at x1; they take no part in the rule.

Results: ``experiments/results/recipe_selection/laplace_scale_<arch>.{json,md}``.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

from common import cell, command, environment, mean, setup, table
from uncertainty import NATURAL_GRADIENT, RECOMMENDED, recipe_settings

from twodg_pyro.data import make_loader
from twodg_pyro.files import atomic_write_text
from twodg_pyro.methods import LaplacePosterior, fit_laplace, with_feature_residual
from twodg_pyro.metrics import classification_metrics
from twodg_pyro.pipeline import config_from_dict
from twodg_pyro.pipeline.outputs.uncertainty_step import UncertaintySets, data_tensors
from twodg_pyro.pipeline.runtime.variants import run_variants
from twodg_pyro.pipeline.settings.build import eval_data
from twodg_pyro.pipeline.settings.config import UncertaintyConfig

#: the covariance scales of the 2DG BNN's Laplace last layer (1: the ``2dg + laplace`` row)
SCALES = (1.0, 1.5, 2.0, 3.0, 4.0)
#: the rows with the distance-aware feature residual (``laplace.residual = "gp"``: its
#: lengthscale set by the training features, its variance far from them by the fitted
#: prior; nothing tuned on a held-out split), beside the widths
RESIDUAL_DET = "last-layer Laplace (deterministic network) + GP residual"
RESIDUAL_2DG = "2DG + Laplace, covariance x1 + GP residual"
OUT = Path("experiments/results/recipe_selection")
DRAWS, OOD_DRAWS = 30, 10


def widened(post: LaplacePosterior, s: float) -> LaplacePosterior:
    """``post`` with its posterior covariance times ``s`` (precision ``P / s``)."""
    out = copy.deepcopy(post)
    out.h_factor = post.h_factor / s
    out.prior_precision.div_(s)
    return out


def splits(art) -> dict:
    """A run's validation and test data, made once for all its rows."""
    return {"val": eval_data(art.split.val), "test": art.eval_data}


def score(trained, data_of: dict, ev: UncertaintySets, seed: int) -> dict:
    """Validation and test accuracy / NLL / ECE (``data_of``: :func:`splits`), the OOD
    AUROCs (entropy, MI) and the severity-5 NLL of each corruption."""
    rec = {}
    for split, data in data_of.items():
        m = classification_metrics(trained.predict(data, DRAWS, seed).mean, data_tensors(data)[1])
        rec[split] = {k: m[k] for k in ("accuracy", "nll", "ece")}
    u = ev.record(trained, OOD_DRAWS, "cpu")
    rec["ood"] = {k: [v["entropy_auroc"], v.get("mi_auroc")] for k, v in u["ood"].items()}
    rec["shift5"] = {f: u["shift"][f]["5"]["nll"] for f in u["shift"]}
    return rec


def run_seed(seed: int, arch: str, root: str, quick: bool) -> list[dict]:
    """The rows of one seed: the deterministic network, its Laplace, the 2DG BNN and its
    Laplace last layer at every scale."""
    rows = []

    def add(point, trained, data_of, **fields):
        r = {"point": point, "seed": seed, **fields, **score(trained, data_of, ev, seed)}
        r["environment"] = environment()
        rows.append(r)
        print(
            f"[seed {seed}] {point}: val nll {r['val']['nll']:.4f} ece {r['val']['ece']:.4f}"
            f" | test nll {r['test']['nll']:.4f} ece {r['test']['ece']:.4f}",
            flush=True,
        )

    base, _ = recipe_settings(RECOMMENDED, root, seed, quick, arch, ["deterministic", "laplace"])
    _, art = run_variants(config_from_dict(base), {})
    ev = UncertaintySets(
        art.split, art.eval_data, UncertaintyConfig(ood_size=500, shift_size=200), seed
    )
    data = splits(art)
    add("deterministic", art.trained["deterministic"], data)
    det_laplace = art.trained["laplace"]
    add("last-layer Laplace (deterministic network)", det_laplace, data)
    train = make_loader(art.split.train, 500, shuffle=False)
    add(RESIDUAL_DET, with_feature_residual(det_laplace, train), data, residual=True)
    ng, _ = recipe_settings(NATURAL_GRADIENT, root, seed, quick, arch, ["mean_field", "2dg"])
    cfg = config_from_dict(ng)
    _, art2 = run_variants(cfg, {"representative": {"stage3": {"tying": "representative"}}})
    bnn = art2.variants["representative"]
    data = splits(art2)
    add("2DG representative", bnn, data)
    loader = make_loader(art2.split.train, cfg.laplace.batch_size, shuffle=False)
    post = fit_laplace(bnn.mean_network(), loader, cfg.laplace)
    for s in SCALES:
        add(
            f"2DG + Laplace, covariance x{s:g}",
            widened(post, s),
            data,
            scale=s,
            prior_precision=post.prior_precision.tolist(),
        )
    gp = with_feature_residual(post, make_loader(art2.split.train, 500, shuffle=False))
    add(RESIDUAL_2DG, gp, data, residual=True, **gp.residual.settings())
    return rows


def summarise(records: list[dict]) -> list[dict]:
    """Means over seeds per point (the points in their first order)."""
    points = list(dict.fromkeys(r["point"] for r in records))
    out = []
    for p in points:
        rs = [r for r in records if r["point"] == p]
        row = {"point": p, "seeds": len(rs), "scale": rs[0].get("scale")}
        for split in ("val", "test"):
            row[split] = {k: mean(r[split][k] for r in rs) for k in rs[0][split]}
        row["ood"] = {s: [mean(r["ood"][s][i] for r in rs) for i in (0, 1)] for s in rs[0]["ood"]}
        row["shift5"] = {f: mean(r["shift5"][f] for r in rs) for f in rs[0]["shift5"]}
        out.append(row)
    return out


def choose(summary: list[dict]) -> float | None:
    """The rule: the widest scale whose validation NLL is at most the deterministic
    network's and whose validation ECE is at most 0.02 (seeds' means)."""
    det = next(r for r in summary if r["point"] == "deterministic")
    ok = [
        r["scale"]
        for r in summary
        if r["scale"] is not None
        and r["val"]["nll"] <= det["val"]["nll"]
        and r["val"]["ece"] <= 0.02
    ]
    return max(ok) if ok else None


def markdown(doc: dict) -> str:
    summary, chosen = doc["summary"], doc["chosen_scale"]
    det = next(r for r in summary if r["point"] == "deterministic")
    lines = [
        f"# The 2DG BNN's Laplace last layer, widened ({doc['arch']}, seeds {doc['seeds']})",
        "",
        f"Command: `{doc['command']}`.  Means over seeds.  Validation: the 400 validation "
        f"images; test: the 1,000 test images ({DRAWS} draws), the OOD sets and "
        f"corruptions ({OOD_DRAWS} draws).  Severity-5 ratio: the mean over corruptions of "
        "the row's severity-5 NLL over the deterministic network's.",
        "",
        f"**Chosen on validation** (the widest scale with validation NLL <= the "
        f"deterministic network's {det['val']['nll']:.4f} and validation ECE <= 0.02): "
        + (f"**x{chosen:g}**." if chosen is not None else "**none**."),
    ]
    if any(r["point"] in (RESIDUAL_DET, RESIDUAL_2DG) for r in summary):
        lines += [
            "",
            "Rows `+ GP residual`: the same last-layer Laplace at x1 with the distance-aware "
            'feature residual (`laplace.residual = "gp"`, '
            "`twodg_pyro.methods.feature_residual`): a Gaussian process on the last "
            "layer's input features, conditioned on the training features, whose variance "
            "grows to the last layer's prior away from them. Nothing in it is chosen on "
            "any split (lengthscale: the training features' median distance).",
        ]
    rows = []
    for r in summary:
        ood = [v[0] for v in r["ood"].values()]
        mi = [v[1] for v in r["ood"].values() if v[1] is not None]
        ratio = mean(r["shift5"][f] / det["shift5"][f] for f in r["shift5"])
        rows.append(
            [
                r["point"],
                cell(r["val"]["nll"], ".4f"),
                cell(r["val"]["ece"], ".4f"),
                cell(r["test"]["accuracy"], ".4f"),
                cell(r["test"]["nll"], ".4f"),
                cell(r["test"]["ece"], ".4f"),
                f"{mean(ood):.3f} ({cell(mean(mi))})",
                cell(r["ood"]["uniform_noise"][0]),
                cell(ratio, ".2f"),
            ]
        )
    cols = [
        "point",
        "val NLL",
        "val ECE",
        "acc",
        "NLL",
        "ECE",
        "OOD AUROC (MI)",
        "uniform noise",
        "severity-5 / det",
    ]
    lines += table("## Validation and test", cols, rows)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", choices=["lenet5", "resnet20"], default="resnet20")
    p.add_argument("--root", default="data/mnist_subset")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="an epoch or two per stage (a check)")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--stem", default=None, help="default: laplace_scale_<arch>")
    p.add_argument("--merge", nargs="+", default=None, metavar="JSON")
    args = p.parse_args(argv)
    if not setup(args.threads, None if args.merge else args.root):
        return 2
    records = []
    if args.merge:
        for path in args.merge:
            records += json.loads(Path(path).read_text())["records"]
    for seed in [] if args.merge else args.seeds:
        records += run_seed(seed, args.arch, args.root, args.quick)
    summary = summarise(records)
    doc = {
        "arch": args.arch,
        "seeds": sorted({r["seed"] for r in records}),
        "command": command("laplace_scale_study.py", argv),
        "scales": list(SCALES),
        "chosen_scale": choose(summary),
        "records": records,
        "summary": summary,
    }
    out, stem = Path(args.out), args.stem or f"laplace_scale_{args.arch}"
    atomic_write_text(out / f"{stem}.json", json.dumps(doc, indent=1))
    atomic_write_text(out / f"{stem}.md", markdown(doc))
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
