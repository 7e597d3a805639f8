"""Which component an inlier is tied to (issue 47): the paper's most responsible one or the
nearest in W2 (``sharing.assignment``), with few components, measured on the validation
split with the bytes of each 2DG file.

With few components a broad component is the most responsible for points far from its
centre, so under the representative tying those weights' means jump to a distant centre.
``nearest`` ties each inlier to the component whose Normal is nearest to
its stage-1 Normal in W2 (in the (mu, sigma) plane, the nearest centre), as a quantiser
rounds to its nearest level.

The natural-gradient recipe's stage 1 (``last_layer_study.POINTS``, or ``--point``: another
point of ``stage1_selection.GRID``, e.g. one whose scales settle) is trained once from the
recipe's pretrained network; every row then builds stage 2 from it (``K`` components,
one codebook or one per layer, each rule) and trains the recipe's stage 3 (the KL weight
of stage 1, the CPU epochs, both hooks), and is scored on the **validation split** (its
OOD sets and corruptions, as in ``stage1_selection.py``; the test images play no part),
beside the deterministic network and stage 1.  ``file bytes``: the 2DG BNN's ``.2dgz``
at the default precision (``export_compact``), against the float32 deterministic network.

    python experiments/assignment_study.py --arch resnet20     # about 20 min, 2 threads
    python experiments/assignment_study.py --merge A.json B.json ... --stem S   # means

Results: ``experiments/results/recipe_selection/assignment_<arch>.{json,md}``; ``--merge``
averages the records of runs at other seeds, row by row (``S.{json,md}``).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

from common import cell, command
from last_layer_study import natural_gradient_stage1, stage1_point
from recipe_selection import append_record, selection_output, selection_parser
from stage1_selection import GRID, score_cells, validation_record

from twodg_pyro.accounting import network_bytes
from twodg_pyro.files import atomic_write_text
from twodg_pyro.io import export_compact
from twodg_pyro.methods import GuidePosterior
from twodg_pyro.pipeline.methods.algorithm1 import stage3_shared_gmm
from twodg_pyro.pipeline.methods.mean_field import scale_convergence
from twodg_pyro.pipeline.runtime.context import RunContext
from twodg_pyro.pipeline.settings.build import network_spec, seed_everything, train_loader
from twodg_pyro.sharing import build_sharing

#: ``name: (K, codebook, ellipse scope, stage-3 pruning threshold)`` of the rows; each runs
#: under every rule of ``--rules``
VARIANTS = {
    "K = 32": (32, "global", "all", 0.0),
    "K = 16 per layer": (16, "per_layer", "all", 0.0),
    "K = 16 per layer, pruned SNR < 0.5": (16, "per_layer", "all", 0.5),
    "K = 16 per layer, pruned SNR < 1": (16, "per_layer", "all", 1.0),
    "K = 16 per layer, pruned SNR < 2": (16, "per_layer", "all", 2.0),
    "K = 16 per layer, pruned SNR < 3": (16, "per_layer", "all", 3.0),
    "K = 16 per layer, own-layer ellipses": (16, "per_layer", "layer", 0.0),
    "K = 16 per layer, own-layer ellipses, pruned SNR < 0.5": (16, "per_layer", "layer", 0.5),
    "K = 16 per layer, own-layer ellipses, pruned SNR < 1": (16, "per_layer", "layer", 1.0),
    "K = 8 per layer, own-layer ellipses": (8, "per_layer", "layer", 0.0),
}
RULES = ("responsibility", "nearest")


def markdown(doc: dict) -> str:
    lines = [
        f"# Assigning inliers to components: {doc['arch']}, seed {doc['seed']}",
        "",
        f"Command: `{doc['command']}`.  Stage 1: `{doc['point']}` (KL weight "
        f"{doc['kl_weight']:.4g}); stage 3: {doc['stage3_epochs']} epochs at the same KL "
        f"weight.  {doc['draws']} seeded draws on the validation images; OOD sets of "
        f"{doc['ood_size']} images made from them; severity-5 corruptions of "
        f"{doc['shift_size']}.  `x smaller`: the float32 deterministic network's "
        f"{doc['float32_bytes']:,.0f} bytes over the file's."
        + (
            f"  Runs averaged: {'; '.join(f'`{c}`' for c in doc['runs'])}." if "runs" in doc else ""
        ),
        "",
        "| point | assignment | components (outliers, ellipses) | file bytes | x smaller "
        "| index bits / weight | pruned | acc | NLL | ECE | clean MI | OOD AUROC entropy (MI) "
        "| severity-5 NLL (mean) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["records"]:
        parts = "-"
        if r.get("n_gaussians") is not None:
            parts = f"{r['n_gaussians']:.0f} ({r['n_outliers']:,.0f}, {r['n_ellipses']:,.0f})"
        size = "-" if r.get("file_bytes") is None else f"{r['file_bytes']:,.0f}"
        ratio = "-" if r.get("file_bytes") is None else f"{r['float32_ratio']:.1f}x"
        point = r["point"]
        if r.get("scale_change") is not None:  # stage 1: whether its scales settled
            point += f" (median scale {r['scale_change']:.1%} over the last tenth)"
        lines.append(
            f"| {point} | {r.get('assignment') or '-'} | {parts} | {size} | {ratio} "
            f"| {cell(r.get('index_bits_per_weight'), '.2f')} | {cell(r.get('pruned'), '.1%')} "
            f"| {score_cells(r)} "
            f"| {cell(r['severity5'])} |"
        )
    return "\n".join(lines) + "\n"


def merged(docs: list[dict], argv: list[str] | None) -> dict:
    """The first run's document with every numeric field of a row (``point`` and
    ``assignment``) averaged over the runs that have it (named when not all do), and
    their seeds."""
    rows: dict[tuple, list[dict]] = {}
    for d in docs:
        for r in d["records"]:
            rows.setdefault((r["point"], r.get("assignment")), []).append(r)
    records = []
    for group in rows.values():
        rec = dict(group[0])
        for key, value in rec.items():
            values = [r.get(key) for r in group]
            if isinstance(value, int | float) and None not in values:
                rec[key] = statistics.fmean(values)
        if len(group) < len(docs):  # a row that only some runs have
            rec["point"] += f" ({len(group)} of {len(docs)} runs)"
        records.append(rec)
    seeds = ", ".join(str(d["seed"]) for d in docs)
    return {
        **docs[0],
        "seed": f"{seeds} (means)",
        "records": records,
        "command": command("assignment_study.py", argv),
        "runs": [d["command"] for d in docs],
    }


def main(argv: list[str] | None = None) -> int:
    p = selection_parser(__doc__, 2, "default: assignment_<arch>")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS)[:2], choices=list(VARIANTS))
    p.add_argument("--rules", nargs="+", default=list(RULES), choices=list(RULES))
    p.add_argument("--merge", nargs="+", default=None, help="average these runs' JSON files")
    p.add_argument(
        "--point", choices=list(GRID), default=None, help="stage 1 (default: the recipe's)"
    )
    p.add_argument("--stage3-epochs", type=int, default=None, help="default: the recipe's")
    args = p.parse_args(argv)
    out, stem, done = selection_output(args, f"assignment_{args.arch}", markdown)
    if args.merge:
        doc = merged([json.loads(Path(f).read_text()) for f in args.merge], argv)
        atomic_write_text(out / f"{stem}.json", json.dumps(doc, indent=1))
        atomic_write_text(out / f"{stem}.md", markdown(doc))
        return 0
    if done:
        return 0
    study = natural_gradient_stage1(args)
    art, det, stage1, ev, beta, cfg = (
        study[k] for k in ("art", "det", "stage1", "ev", "beta", "cfg")
    )
    (xv, yv), split = study["val"], art.split
    epochs = args.stage3_epochs or cfg.stage3.epochs
    stage3 = dataclasses.replace(cfg.stage3, kl_weight=beta, epochs=epochs)
    cfg = dataclasses.replace(cfg, stage3=stage3)
    float32_bytes = network_bytes(det.net)["float32"]
    doc = {
        "arch": args.arch,
        "seed": args.seed,
        "command": command("assignment_study.py", argv),
        "point": stage1_point(args),
        "kl_weight": beta,
        "stage3_epochs": cfg.stage3.epochs,
        "draws": args.draws,
        "ood_size": args.ood_size,
        "shift_size": args.shift_size,
        "float32_bytes": float32_bytes,
        "records": [],
    }
    t0 = time.perf_counter()

    def save(point: str, method, **fields) -> None:
        probs = method.predict((xv, yv), args.draws, args.seed).mean
        rec = validation_record(probs, ev, method, args.draws, yv, point, **fields)
        append_record(out, stem, doc, rec, markdown)
        print(f"[{time.perf_counter() - t0:.0f} s] {point}: {json.dumps(rec)}", flush=True)

    save("deterministic network", det)
    conv = scale_convergence(stage1.state.history)  # a number of its own: --merge averages it
    change = None if conv is None else conv["median_scale_change"]
    save("stage 1 (mean-field)", stage1, scale_change=change, scale_convergence=conv)
    model, guide = stage1.model, stage1.guide
    loader = train_loader(split, cfg.data, cfg.seed)
    spec = network_spec(cfg.network, split)
    for name in args.variants:
        k, codebook, scope, snr = VARIANTS[name]
        for rule in args.rules:
            sharing = dataclasses.replace(
                cfg.sharing, n_components=k, codebook=codebook, assignment=rule, ellipse_scope=scope
            )
            stage3 = dataclasses.replace(cfg.stage3, prune_snr=snr)
            run_cfg = dataclasses.replace(cfg, sharing=sharing, stage3=stage3)
            seed_everything(cfg.seed)
            structure, _ = build_sharing(model, guide, loader, sharing, seed=cfg.seed)
            t1 = time.perf_counter()
            bnn, _ = stage3_shared_gmm(RunContext(cfg=run_cfg), model, structure, loader)
            seconds = time.perf_counter() - t1
            with tempfile.TemporaryDirectory() as tmp:
                report = export_compact(Path(tmp) / "model_2dg.2dgz", model, bnn.guide, spec)
            s = bnn.guide.structure()
            save(
                f"2DG, {name}",
                GuidePosterior(model, bnn.guide),
                assignment=rule,
                n_gaussians=s.n_gaussians,
                n_outliers=s.n_outliers,
                n_ellipses=s.n_ellipses,
                pruned=bnn.guide.pruning.get("n", 0) / s.num_weights,
                file_bytes=report["total"],
                float32_ratio=float32_bytes / report["total"],
                index_bits_per_weight=report["index_bits_per_weight"],
                stage3_seconds=seconds,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
