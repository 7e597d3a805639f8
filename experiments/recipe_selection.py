"""Choosing the 2DG stage's settings on the validation split (issue 30).

The recommended recipe (``mnist-resnet20-bayes`` with ``experiments/uncertainty.py``'s CPU
epochs; ``--arch lenet5``: ``mnist-lenet5-bayes``) trains the deterministic network and
the mean-field BNN once, then runs stages 2-3 for each variant of :data:`VARIANTS` on a
copy of the same stage-1 posterior.  Every method is scored on the **validation split**
(the 10 % of the training images that no stage trains on) -- accuracy, NLL, ECE, clean
mutual information, entropy and MI AUROC against the built-in OOD sets made from the
validation images, the severity-5 NLL of each corruption family -- and, only for the
record, on the test images.  The variant the recipe takes is the one with the lowest
validation NLL among those with at most a twentieth of mean-field's trainable parameters
(the issue's budget); the test columns play no part in the choice.

    python experiments/recipe_selection.py                 # ResNet-20, seed 0
    python experiments/recipe_selection.py --arch lenet5   # LeNet-5
    python experiments/recipe_selection.py --quick --out /tmp/sel   # a check, no results

Results go to ``experiments/results/recipe_selection/<stem>.{json,md}`` (each committed
file states its command); ``--settings`` changes the base (stage 1 included), e.g. the
KL weight, and ``--variants`` picks the variants.  Each variant is saved as soon as it is
evaluated, so a sweep stopped half-way keeps what it measured; ``--from-json`` writes
the markdown again.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from common import cell, command, environment
from uncertainty import QUICK, RESNET_CPU_EPOCHS

from twodg_pyro.files import atomic_write_text
from twodg_pyro.metrics import accuracy, ece, nll
from twodg_pyro.pipeline import config_from_dict
from twodg_pyro.pipeline.outputs.uncertainty_step import UncertaintySets
from twodg_pyro.pipeline.runtime.variants import run_variants
from twodg_pyro.pipeline.settings.build import eval_data
from twodg_pyro.pipeline.settings.config import merge_settings
from twodg_pyro.pipeline.settings.evaluation import UncertaintyConfig
from twodg_pyro.pipeline.settings.presets import preset

#: stage-2/3 variants on one stage-1 posterior: the recipe as it is, and each change
#: that the ResNet-20 diagnosis of issue 30 points at (merging at an absolute W2
#: threshold large against a ResNet's weights; clustering on sigma, where the pinned
#: weights' small scales are one corner of the plane)
VARIANTS: dict[str, dict] = {
    "recipe": {},
    "no merging": {"sharing": {"use_merging": False}},
    "tau_d 0.002": {"sharing": {"tau_d": 0.002}},
    "log sigma": {"sharing": {"coordinates": "log_sigma"}},
    "moment merge": {"sharing": {"merge_rule": "moment"}},
    "stage-3 lr 1e-4": {"stage3": {"lr_centre": 1e-4, "lr_outlier": 1e-4}},
    "stage-3 lr 3e-4": {"stage3": {"lr_centre": 3e-4, "lr_outlier": 3e-4}},
    "stage-3 KL weight 0.025": {"stage3": {"kl_weight": 0.025}},
    "stage-3 KL weight 0.01": {"stage3": {"kl_weight": 0.01}},
    "stage-3 lr 1e-4, tau_d 0.002": {
        "sharing": {"tau_d": 0.002},
        "stage3": {"lr_centre": 1e-4, "lr_outlier": 1e-4},
    },
}
PRESETS = {"resnet20": "mnist-resnet20-bayes", "lenet5": "mnist-lenet5-bayes"}
BUDGET = 20  # trainable parameters at most mean-field's / BUDGET
SPLITS = ("val", "test")


def settings_of(arch: str, root: str, seed: int, quick: bool, over: dict | None = None) -> dict:
    s = merge_settings(preset(PRESETS[arch]), {"methods": ["deterministic", "mean_field"]})
    s = merge_settings(s, over or {})
    if arch == "resnet20":
        s = merge_settings(s, RESNET_CPU_EPOCHS)
    if quick:
        s = merge_settings(s, QUICK)
    over = {"data": {"root": root}, "seed": seed, "progress": False}
    return merge_settings(s, {**over, "diagnostics": {"enabled": False}})


def scores(trained, sets: dict, draws: int, seed: int) -> dict:
    """Clean metrics and uncertainty fields of one trained method on each split of
    ``sets``."""
    out = {}
    for split, ev in sets.items():
        probs = trained.sample_probs((ev.x, ev.y), draws, seed).mean(0)
        u = ev.record(trained, draws, "cpu")
        ood = u["ood"]
        sev5 = {f: v["5"]["nll"] for f, v in u["shift"].items() if "5" in v}
        out[split] = {
            "accuracy": accuracy(probs, ev.y),
            "nll": nll(probs, ev.y),
            "ece": ece(probs, ev.y),
            "mean_mi_clean": u["mean_mi_clean"],
            "entropy_auroc": statistics.fmean(v["entropy_auroc"] for v in ood.values()),
            "mi_auroc": (
                statistics.fmean(v["mi_auroc"] for v in ood.values()) if trained.bayesian else None
            ),
            "severity5_nll": sev5,
        }
    return out


def choose(records: list[dict]) -> str | None:
    """The variant of lowest validation NLL within the trainable-parameter budget."""
    mf = [r for r in records if r["method"] == "mean_field"]
    if not mf:
        return None
    budget = mf[0]["trainable_params"] / BUDGET
    ok = [r for r in records if r["method"] == "2dg" and r["trainable_params"] <= budget]
    return min(ok, key=lambda r: r["val"]["nll"])["variant"] if ok else None


def base_settings(doc: dict) -> str:
    """The settings the issue-30 variants are relative to, as a sentence."""
    st = doc["settings"]
    s1, sh, s3 = st["stage1"], st["sharing"], st["stage3"]
    return (
        f"preset `{PRESETS[doc['arch']]}`, stage-1 KL weight {s1['kl_weight']!r}, stage-3 KL "
        f"weight {s3['kl_weight']!r}, tau_d {sh['tau_d']}, merge rule {sh['merge_rule']!r}, "
        f"coordinates {sh['coordinates']!r}, stage-3 learning rates {s3['lr_centre']:g} "
        f"(centres) / {s3['lr_outlier']:g} (outliers), {s1['epochs']} stage-1 and "
        f"{s3['epochs']} stage-3 epochs"
    )


def markdown(doc: dict) -> str:
    recs, chosen = doc["records"], choose(doc["records"])
    lines = [
        f"# Choosing the 2DG stage on the validation split: {doc['arch']}, seed {doc['seed']}",
        "",
        f"Command: `{doc['command']}`.  One stage-1 posterior; each variant runs stages 2-3 "
        f"on a copy of it.  {doc['draws']} seeded draws; OOD sets of {doc['ood_size']} images "
        f"made from each split's images; severity-5 corruptions of {doc['shift_size']} "
        "images.  The choice: the lowest validation NLL among the 2DG variants with at most "
        f"1/{BUDGET} of mean-field's trainable parameters.  Chosen: **{chosen}**.",
        "",
        "The base that the variants change (the run's settings): " + base_settings(doc) + ".",
    ]
    for split in SPLITS:
        title = "Validation split (the choice)" if split == "val" else "Test split (reported only)"
        lines += [
            "",
            f"## {title}",
            "",
            "| method | variant | acc | NLL | ECE | clean MI | OOD AUROC entropy (MI) "
            "| severity-5 NLL (mean) | Gaussians | trainable |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in recs:
            s = r[split]
            sev = statistics.fmean(s["severity5_nll"].values()) if s["severity5_nll"] else None
            mi = f" ({cell(s['mi_auroc'])})" if s["mi_auroc"] is not None else ""
            lines.append(
                f"| {r['method']} | {r['variant']} | {s['accuracy']:.4f} | {s['nll']:.3f} "
                f"| {s['ece']:.3f} | {s['mean_mi_clean']:.3f} | {s['entropy_auroc']:.3f}{mi} "
                f"| {cell(sev)} | {r.get('n_gaussians', '-')} | {r['trainable_params']:,} |"
            )
    return "\n".join(lines) + "\n"


def selection_parser(doc: str, threads: int, stem_help: str) -> argparse.ArgumentParser:
    """The command line this selection and ``stage1_selection.py`` share."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--arch", choices=list(PRESETS), default="resnet20")
    p.add_argument("--root", default="data/mnist_subset", help="folder with MNIST/raw")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--draws", type=int, default=10)
    p.add_argument("--ood-size", type=int, default=400)
    p.add_argument("--shift-size", type=int, default=200)
    p.add_argument("--threads", type=int, default=threads)
    p.add_argument("--quick", action="store_true", help="an epoch per stage (a check)")
    p.add_argument(
        "--out", default=str(Path(__file__).resolve().parent / "results" / "recipe_selection")
    )
    p.add_argument("--stem", default=None, help=stem_help)
    p.add_argument("--from-json", default=None, help="write the markdown of a saved run")
    return p


def selection_output(args, default_stem: str, markdown) -> tuple[Path, str, bool]:
    """``(out, stem, done)`` of a selection run (``args``: :func:`selection_parser`'s): the
    results folder (made), the files' stem (``--stem``, else ``default_stem``) and, with
    ``--from-json``, ``True`` once the saved run's ``markdown(doc)`` is written there
    (nothing left to run)."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = args.stem or default_stem
    if args.from_json:
        doc = json.loads(Path(args.from_json).read_text())
        atomic_write_text(out / f"{stem}.md", markdown(doc))
    return out, stem, bool(args.from_json)


def append_record(out: Path, stem: str, doc: dict, rec: dict, markdown) -> None:
    """Add ``rec`` to a selection run's ``doc`` and write its JSON and ``markdown(doc)``
    again (each row is on disk as soon as it is scored), ``rec`` stamped with the torch
    build, threads and CPU it was scored in (``environment``)."""
    rec["environment"] = environment()
    doc["records"].append(rec)
    atomic_write_text(out / f"{stem}.json", json.dumps(doc, indent=1))
    atomic_write_text(out / f"{stem}.md", markdown(doc))


def main(argv: list[str] | None = None) -> int:
    p = selection_parser(__doc__, 2, "default: the --arch")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument(
        "--settings", default="{}", help="JSON settings over the preset's (stage 1 included)"
    )
    args = p.parse_args(argv)
    out, stem, done = selection_output(args, args.arch, markdown)
    if done:
        return 0
    torch.set_num_threads(args.threads)
    over = json.loads(args.settings)
    cfg = config_from_dict(settings_of(args.arch, args.root, args.seed, args.quick, over))
    doc = {
        "arch": args.arch,
        "seed": args.seed,
        "command": command("recipe_selection.py", argv),
        "draws": args.draws,
        "ood_size": args.ood_size,
        "shift_size": args.shift_size,
        "settings": cfg.to_dict(),
        "records": [],
    }
    ucfg = UncertaintyConfig(ood_size=args.ood_size, shift_size=args.shift_size, severities=[5])
    sets: dict = {}
    t0 = time.perf_counter()

    def save(rec: dict) -> None:
        append_record(out, stem, doc, rec, markdown)
        v = rec["val"]
        print(
            f"[{time.perf_counter() - t0:.0f} s] {rec['method']} / {rec['variant']}: val acc "
            f"{v['accuracy']:.4f} nll {v['nll']:.3f} OOD {v['entropy_auroc']:.3f}",
            flush=True,
        )

    def on_variant(name: str, record: dict, art) -> None:
        if name == "-":  # the shared part: the splits' sets, then its methods
            for split in SPLITS:
                data = eval_data(getattr(art.split, split))
                sets[split] = UncertaintySets(art.split, data, ucfg, args.seed)
            for r in art.records:
                trained = art.trained[r["method"]]
                save(_record(r, "-", scores(trained, sets, args.draws, args.seed)))
            return
        trained = art.variants[name]
        save(_record(record, name, scores(trained, sets, args.draws, args.seed)))

    variants = {v: VARIANTS[v] for v in args.variants}
    run_variants(cfg, variants, on_variant)
    print(f"chosen: {choose(doc['records'])}")
    return 0


def _record(r: dict, variant: str, s: dict) -> dict:
    keep = ("method", "trainable_params", "n_gaussians", "n_outliers", "n_ellipses")
    rec = {k: r[k] for k in keep if k in r}
    return {**rec, "variant": variant, **s, "scale_convergence": r.get("scale_convergence")}


if __name__ == "__main__":
    raise SystemExit(main())
