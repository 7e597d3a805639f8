"""Command-line interface: ``twodg-pyro run | train | evaluate | diagnose | export | report``.

``run`` is the main job on the bundled digits; ``train --config FILE`` runs any
configuration (both write the table, the 2DG model file, the InferenceData,
diagnostics and figures into ``--out``); ``evaluate MODEL_FILE`` prints the
predictive metrics of a saved 2DG BNN; ``diagnose MODEL_FILE`` writes its
InferenceData, k-hat, PSIS-LOO, posterior summary and figures; ``export
RUN_OR_MODEL_FILE --out FILE.2dgz`` writes the compact model file
(:mod:`twodg_pyro.io.compact`), which ``evaluate`` and ``diagnose`` read like the full
one; ``report RUN_DIR`` rebuilds the table of a finished run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["main", "build_parser"]


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=None, help="output folder (default: runs/<command>)")
    p.add_argument("--seed", type=int, default=None, help="seed of the whole pipeline")
    p.add_argument("--device", default=None, help="cpu or cuda[:i]")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.add_argument(
        "--no-diagnostics",
        action="store_true",
        help="write the results and the model file only: no InferenceData, k-hat, "
        "PSIS-LOO or figures (the setting diagnostics.enabled = false)",
    )


_RESUME_HELP = (
    "continue a killed run from the checkpoints in RUN_DIR (written with checkpoint_every > 0); "
    "its stored settings are used"
)


def _data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default="digits", help="evaluation data set (default: digits)")
    p.add_argument("--root", default=None, help="folder of a file-based data set")
    p.add_argument("--num-samples", type=int, default=30, help="posterior samples N_s (30)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``twodg-pyro``."""
    parser = argparse.ArgumentParser(
        prog="twodg-pyro", description="Stochastic weight-sharing BNNs (2DGBNN) in Pyro."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="the main job: every method on the bundled digits")
    p.add_argument("--config", default=None, help="optional config file (TOML/JSON/YAML)")
    p.add_argument("--methods", nargs="+", default=None, help="subset of methods to run")
    p.add_argument("--resume", default=None, metavar="RUN_DIR", help=_RESUME_HELP)
    _common(p)
    p = sub.add_parser("train", help="run a preset and/or the configuration in a config file")
    p.add_argument(
        "--preset",
        default=None,
        help="named settings (digits, mnist-lenet5, mnist-resnet20, cifar10-resnet20, "
        "cifar10-resnet18); a --config file given too overrides them",
    )
    p.add_argument("--root", default=None, help="data folder (sets data.root)")
    p.add_argument("--config", default=None, help="config file (TOML, JSON or YAML)")
    p.add_argument("--resume", default=None, metavar="RUN_DIR", help=_RESUME_HELP)
    _common(p)
    p = sub.add_parser("evaluate", help="metrics of a saved 2DG model file")
    p.add_argument(
        "model_file", help="a model file written by run/train (model_2dg.pt) or export (.2dgz)"
    )
    _data_args(p)
    p.add_argument("--split", choices=["test", "val"], default="test", help="default: test")
    p.add_argument("--out", default=None, help="also write the metrics as JSON to this file")
    p.add_argument("--seed", type=int, default=0, help="seed of the posterior draws")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    p = sub.add_parser("diagnose", help="ArviZ diagnostics and figures of a saved 2DG model")
    p.add_argument(
        "model_file", help="a model file written by run/train (model_2dg.pt) or export (.2dgz)"
    )
    _data_args(p)
    p.add_argument("--out", default=None, help="output folder (default: runs/diagnose)")
    p.add_argument("--khat-samples", type=int, default=100, help="draws for k-hat (100)")
    p.add_argument(
        "--max-examples",
        type=int,
        default=2000,
        help="seeded subset of at most this many training examples (k-hat) and test "
        "examples (InferenceData, PSIS-LOO) (2000)",
    )
    p.add_argument("--n-weights", type=int, default=200, help="weights exported (200)")
    p.add_argument("--seed", type=int, default=0, help="seed of the draws and subsets")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p = sub.add_parser("export", help="write the compact model file (.2dgz) of a 2DG BNN")
    p.add_argument("source", metavar="RUN_OR_MODEL_FILE", help="a run folder or its model_2dg.pt")
    p.add_argument(
        "--out", default=None, help="the compact file (default: model_2dg.2dgz beside the source)"
    )
    p.add_argument(
        "--precision",
        choices=["float16", "float32"],
        default="float16",
        help="centres and covariances (default float16)",
    )
    p.add_argument(
        "--outlier-sigma-bits", type=int, default=16, help="bits per outlier sigma (1-16; 16)"
    )
    p.add_argument(
        "--outlier-mu-bits",
        type=int,
        default=16,
        help="bits per outlier mean (16, or 8: INT8 as the quantised baseline; 16)",
    )
    p.add_argument(
        "--alpha-bits", type=int, default=8, help="bits per ellipse blending weight (2-16; 8)"
    )
    p.add_argument(
        "--index-coding",
        choices=["auto", "global", "per_site"],
        default="auto",
        help="one rANS table, one per layer, or the smaller (default auto)",
    )
    p.add_argument(
        "--covariances",
        choices=["auto", "yes", "no"],
        default="auto",
        help="store the covariances (auto: when the tying draws with them)",
    )
    p.add_argument(
        "--faithful",
        action="store_true",
        help="predict as the full file does: float32 centres, 16-bit outliers and alphas "
        "(overrides --precision and the bit widths)",
    )
    p = sub.add_parser("report", help="rebuild the results table of a run folder")
    p.add_argument("run_dir")
    return parser


def _overrides(args) -> dict:
    over: dict = {}
    if getattr(args, "seed", None) is not None:
        over["seed"] = args.seed
    if getattr(args, "device", None) is not None:
        over["device"] = args.device
    if getattr(args, "no_progress", False):
        over["progress"] = False
    if getattr(args, "no_diagnostics", False):
        over["diagnostics"] = {"enabled": False}
    if getattr(args, "methods", None):
        over["methods"] = args.methods
    if getattr(args, "root", None) is not None and args.command in ("run", "train"):
        over["data"] = {"root": args.root}
    return over


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = build_parser().parse_args(argv)
    from .pipeline import ConfigError, config_from_dict, format_table, load_config, read_results
    from .pipeline import run as run_pipeline

    try:
        if args.command in ("run", "train"):
            from .distributed import env_rank, env_world_size

            over = _overrides(args)
            resume = getattr(args, "resume", None)
            if resume and env_world_size() > 1:
                raise ValueError("--resume runs in one process; start it without torchrun")
            if resume:
                from .pipeline.resume import load_run_config

                if args.out and Path(args.out).resolve() != Path(resume).resolve():
                    raise ValueError(f"--out {args.out!r} and --resume {resume!r} differ")
                # the stored settings; a --config given too must agree with them
                cfg = load_config(args.config, over) if args.config else None
                cfg = cfg or load_run_config(resume, over)
                run_pipeline(cfg, Path(resume), resume=True)
                print(f"wrote {Path(resume) / 'results.json'}")
                return 0
            from .pipeline.config import merge_settings
            from .pipeline.presets import preset

            name = getattr(args, "preset", None)
            if args.command == "train" and not (args.config or name):
                raise ValueError("train needs --preset NAME or --config FILE (or --resume RUN_DIR)")
            if args.config:  # on top of the preset, if one is named
                cfg = load_config(args.config, over, base=preset(name) if name else None)
            else:  # a preset; the main job is the digits preset
                cfg = config_from_dict(merge_settings(preset(name or "digits"), over))
            out = Path(args.out or f"runs/{args.command}")
            if env_world_size() > 1:  # started by torchrun: every stage on all processes
                from .distributed import run_distributed

                run_distributed(cfg, out)
            else:
                run_pipeline(cfg, out)
            if env_rank() == 0:
                print(f"wrote {out / 'results.json'}")
            return 0
        if args.command == "evaluate":
            return _evaluate(args)
        if args.command == "diagnose":
            return _diagnose(args)
        if args.command == "export":
            return _export(args)
        if args.command == "report":
            payload = read_results(args.run_dir)
            table = format_table(payload["records"])
            (Path(args.run_dir) / "results.md").write_text(table)
            print(table)
            return 0
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(f"twodg-pyro {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 1  # pragma: no cover


def _check_device(device: str) -> None:
    from .pipeline import ConfigError

    if not (device == "cpu" or device.startswith("cuda")):
        raise ConfigError(f"device = {device!r}: must be 'cpu' or 'cuda[:i]'")


def _evaluate(args) -> int:
    import json

    from .pipeline.artifacts import evaluate_model_file
    from .pipeline.results import atomic_write_text

    _check_device(args.device)
    metrics = evaluate_model_file(
        args.model_file,
        data=args.data,
        root=args.root,
        split_name=args.split,
        num_samples=args.num_samples,
        seed=args.seed,
        device=args.device,
    )
    text = json.dumps(metrics, indent=2, sort_keys=True)
    print(text)
    if args.out:
        atomic_write_text(args.out, text + "\n")
        print(f"wrote {args.out}")
    return 0


def _export(args) -> int:
    from .io.compact import FAITHFUL_OPTIONS, export_compact_file, resolve_model_file

    src = resolve_model_file(args.source)
    out = Path(args.out) if args.out else src.with_suffix(".2dgz")
    options = {
        "centre_dtype": args.precision,
        "outlier_sigma_bits": args.outlier_sigma_bits,
        "outlier_mu_bits": args.outlier_mu_bits,
        "alpha_bits": args.alpha_bits,
        "index_coding": args.index_coding,
        "covariances": {"auto": None, "yes": True, "no": False}[args.covariances],
    }
    if args.faithful:
        options.update(FAITHFUL_OPTIONS)
    rep = export_compact_file(src, out, **options)
    parts = ("centres", "covariances", "index", "outliers", "ellipses", "net", "header")
    print(f"{rep['source']}: {rep['source_bytes']:,} bytes")
    print(f"{out}: {rep['total']:,} bytes ({rep['source_bytes'] / rep['total']:.1f}x smaller)")
    print("  " + ", ".join(f"{k} {rep[k]:,}" for k in parts))
    print(
        f"  index: {rep['index_bits_per_weight']:.3f} bits/weight ({rep['index_coding']} rANS), "
        f"empirical entropy {rep['index_entropy_bits']:.3f} "
        f"({rep['index_entropy_bits_per_site']:.3f} given the layer)"
    )
    print(f"wrote {out}")
    return 0


def _diagnose(args) -> int:
    from .pipeline.artifacts import diagnose_model_file

    _check_device(args.device)
    out = Path(args.out or "runs/diagnose")
    report = diagnose_model_file(
        args.model_file,
        out,
        data=args.data,
        root=args.root,
        num_samples=args.num_samples,
        khat_samples=args.khat_samples,
        n_weights=args.n_weights,
        max_train_examples=args.max_examples,
        max_eval_examples=args.max_examples,
        seed=args.seed,
        device=args.device,
        progress=not args.no_progress,
    )
    vi, loo = report.get("vi") or {}, report.get("loo") or {}
    if vi:
        print(f"k-hat = {vi['khat']:.3f} ({vi['khat_assessment']}, log q: {vi['log_q_method']})")
    if loo:
        print(f"PSIS-LOO elpd = {loo['elpd_loo']:.2f} (se {loo['se']:.2f})")
    for name, path in sorted(report["files"].items()):
        print(f"wrote {name}: {path}")
    for name, message in sorted(report["errors"].items()):
        print(f"twodg-pyro diagnose: error in {name}: {message}", file=sys.stderr)
    return 1 if report["errors"] else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
