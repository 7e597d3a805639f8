"""Command-line interface: ``twodg-pyro run | train | evaluate | diagnose | export | report``.

``run`` is the main job on the bundled digits; ``train --config FILE`` runs any
configuration (both write the table, a model file per Bayesian method, the
InferenceData, diagnostics and figures into ``--out``); ``evaluate MODEL_FILE`` prints
the predictive metrics of a saved model of any method (by default with the run's seed,
draws and data: the numbers of its results table; given a run folder, those of every
model file in it, keyed by file name); ``diagnose MODEL_FILE`` writes its
InferenceData, k-hat, PSIS-LOO, posterior summary and figures; ``export
RUN_OR_MODEL_FILE --out FILE.2dgz`` writes the compact model file of a 2DG BNN
(:mod:`twodg_pyro.io.compact`), which ``evaluate`` and ``diagnose`` read like the full
one; ``report RUN_DIR`` rebuilds the table of a finished run.

Errors: a user error (a bad setting, a missing or damaged file, an output folder that
cannot take the run, data that do not fit, a diverged training) is one line on stderr,
``twodg-pyro <command>: error: <message naming the value or file>``, and exit code 2;
an unexpected failure is one line and exit code 1.  Options with a known range
(``--seed``, ``--num-samples``, ``--khat-samples``, the bit widths of ``export``) and the
output paths are checked before any work; a full disk is "no space left on device
(writing <path>)", with the file's previous content kept.  ``--debug`` adds the traceback.
Ctrl-C stops a run with exit code 130 and says where its last checkpoint is and the
command that resumes it.  Warnings are one line each (``twodg-pyro <command>: warning:``),
matplotlib's too; paths print whatever bytes their names hold (:mod:`.cli_output`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import sys
import traceback
import warnings
from pathlib import Path

from .cli_output import cli_output
from .cli_parser import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USER_ERROR, build_parser

__all__ = ["main", "build_parser", "EXIT_USER_ERROR", "EXIT_FAILURE", "EXIT_INTERRUPTED"]


def _overrides(args) -> dict:
    over = {k: getattr(args, k) for k in ("seed", "device") if getattr(args, k, None) is not None}
    if getattr(args, "no_progress", False):
        over["progress"] = False
    if getattr(args, "no_diagnostics", False):
        over["diagnostics"] = {"enabled": False}
    if getattr(args, "root", None) is not None:
        over["data"] = {"root": args.root}
    if getattr(args, "methods", None):
        over["methods"] = args.methods
    return over


def _one_line(e: BaseException | str) -> str:
    text = re.sub(r"\s*\n\s*", " ", str(e)).strip()
    return text or type(e).__name__


#: Errors the user can act on (exit code 2): ``ValueError`` covers settings
#: (``ConfigError``), damaged or foreign files (checksums, formats), data that do not fit
#: and output folders that cannot take a run; ``OSError`` unreadable or unwritable paths
#: and a full disk; ``FloatingPointError`` a diverged training (NaN/inf loss).
USER_ERRORS = (ValueError, OSError, FloatingPointError)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code: 0, 2 (:data:`EXIT_USER_ERROR`) for a
    user error, 1 (:data:`EXIT_FAILURE`) for an unexpected failure, 130
    (:data:`EXIT_INTERRUPTED`) after Ctrl-C."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, or a one-line usage error (exit code 2)
        return e.code if isinstance(e.code, int) else 0
    debug = bool(getattr(args, "debug", False))
    prog = f"twodg-pyro {args.command}"
    ctx: dict = {}

    def say(text: str) -> None:
        print(f"{prog}: {text}", file=sys.stderr, flush=True)

    def warn_one_line(message, category, filename, lineno, file=None, line=None):
        say(f"warning: {_one_line(message)}")

    with warnings.catch_warnings(), cli_output(say):
        if not debug:
            warnings.showwarning = warn_one_line
        try:
            return _COMMANDS[args.command](args, ctx)
        except (KeyboardInterrupt, Exception) as e:  # one line; the traceback with --debug
            if debug:
                traceback.print_exc()
            if isinstance(e, KeyboardInterrupt):
                say(_interrupted(args, ctx))
                return EXIT_INTERRUPTED
            if isinstance(e, USER_ERRORS):
                say(f"error: {_one_line(e)}")
                return EXIT_USER_ERROR
            hint = "" if debug else " (an unexpected failure; --debug shows the traceback)"
            say(f"error: {type(e).__name__}: {_one_line(e)}{hint}")
            return EXIT_FAILURE


def _run_or_train(args, ctx: dict) -> int:
    from .distributed import env_rank, env_world_size
    from .pipeline import config_from_dict, load_config, run_distributed
    from .pipeline import run as run_pipeline
    from .pipeline.runtime.resume import load_run_config
    from .pipeline.settings.config import merge_settings
    from .pipeline.settings.presets import preset

    over = _overrides(args)
    resume = getattr(args, "resume", None)
    name = getattr(args, "preset", None)
    if resume and args.overwrite:
        raise ValueError(
            "--resume and --overwrite exclude each other: resuming keeps the run's "
            "checkpoints, overwriting removes them"
        )
    if resume and env_world_size() > 1:
        raise ValueError("--resume runs in one process; start it without torchrun")
    if resume:
        if args.out and Path(args.out).resolve() != Path(resume).resolve():
            raise ValueError(f"--out {args.out!r} and --resume {resume!r} differ")
        # the stored settings; a --config given too must agree with them
        cfg = load_config(args.config, over) if args.config else load_run_config(resume, over)
    elif args.command == "train" and not (args.config or name):
        raise ValueError("train needs --preset NAME or --config FILE (or --resume RUN_DIR)")
    elif args.config:  # on top of the preset, if one is named
        cfg = load_config(args.config, over, base=preset(name) if name else None)
    else:  # a preset; the main job is the digits preset
        cfg = config_from_dict(merge_settings(preset(name or "digits"), over))
    out = Path(resume or args.out or f"runs/{args.command}")
    ctx.update(out=out, cfg=cfg)
    if resume:
        run_pipeline(cfg, out, resume=True)
    elif env_world_size() > 1:  # started by torchrun: every stage on all processes
        run_distributed(cfg, out, overwrite=args.overwrite)
    else:
        run_pipeline(cfg, out, overwrite=args.overwrite)
    if env_rank() == 0:
        print(f"wrote {out / 'results.json'}")
    return 0


def _interrupted(args, ctx: dict) -> str:
    """What Ctrl-C leaves: the last checkpoint and the command that resumes the run."""
    out, cfg = ctx.get("out"), ctx.get("cfg")
    if out is None:
        return "interrupted"
    from .infer.checkpoint import load_checkpoint
    from .pipeline.runtime.resume import STAGES

    command = f"twodg-pyro {args.command} --resume {out}"
    for stage in STAGES:  # latest first
        path = out / "checkpoints" / f"{stage}.pt"
        if not path.is_file():
            continue
        where = str(path)
        with contextlib.suppress(OSError, ValueError), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ckpt = load_checkpoint(path)
            where += f" ({stage}, epoch {ckpt.epoch} of {ckpt.header.get('epochs')})"
        return f"interrupted; the last checkpoint is {where}. Continue with: {command}"
    every = int(getattr(cfg, "checkpoint_every", 0) or 0)
    if every > 0 and (out / "checkpoints" / "config.json").is_file():
        return (
            f"interrupted before the first checkpoint (written every {every} epoch(s)); "
            f"{command} starts it again from the seed"
        )
    return (
        "interrupted; this run writes no checkpoints (checkpoint_every = 0), so it cannot "
        "be resumed: set checkpoint_every > 0 to make a long run resumable"
    )


def _check_data_args(args, min_samples: int = 1, why: str = "") -> None:
    """The options of ``evaluate`` and ``diagnose`` that have a known range, checked
    before any work: ``--data``, ``--num-samples`` (at least ``min_samples``), ``--seed``."""
    from .data import available_datasets
    from .pipeline import ConfigError
    from .pipeline.settings.config import SEED

    if args.data is not None and args.data.strip().lower().replace("-", "_") not in (
        available_datasets()
    ):
        raise ConfigError(f"--data {args.data!r}: must be one of {available_datasets()}")
    if args.num_samples is not None:
        _check_count("--num-samples", args.num_samples, min_samples, why)
    if args.seed is not None:
        SEED.check("--seed", args.seed)


def _model_options(args) -> dict:
    """The options of ``evaluate`` and ``diagnose`` (``cli_parser._model_args``) that their
    jobs take as they are."""
    return {k: getattr(args, k) for k in ("data", "root", "num_samples", "seed", "device")}


def _check_count(flag: str, value: int, low: int, why: str = "") -> None:
    """``value`` of the integer option ``flag`` is at least ``low`` and fits 64 bits."""
    from .pipeline import ConfigError
    from .pipeline.settings.config import INT64_LIMIT

    if value < low:
        raise ConfigError(f"{flag} {value}: must be >= {low}{why}")
    if value >= INT64_LIMIT:
        raise ConfigError(f"{flag} {value}: must be below 2**63")


def _report(args, ctx: dict) -> int:
    from .files import atomic_write_text
    from .pipeline import read_results
    from .pipeline.outputs.results import format_results

    table = format_results(read_results(args.run_dir))
    atomic_write_text(Path(args.run_dir) / "results.md", table)
    print(table)
    return 0


def _evaluate(args, ctx: dict) -> int:
    import json

    from .files import atomic_write_text
    from .pipeline.outputs.saved_models import evaluate_model_file
    from .pipeline.runtime.run_folder import check_output_file, model_files
    from .pipeline.settings.build import check_device

    check_device(args.device, "--device")
    _check_data_args(args)
    if args.out:  # before the evaluation, not after it
        check_output_file(args.out, "--out")
    # a run folder: every model file in it, by file name
    files = model_files(args.model_file) if Path(args.model_file).is_dir() else None
    uncertainty = None
    if args.uncertainty:
        from .pipeline.settings.config import UncertaintyConfig, config_from_dict

        keys = ("folder_sets", "folder_root", "ood_size", "shift_size", "ood_sets")
        settings = {k: getattr(args, k) for k in keys} | {"draws": args.uncertainty_draws}
        settings = {"enabled": True} | {k: v for k, v in settings.items() if v is not None}
        uncertainty = config_from_dict(settings, UncertaintyConfig, prefix="uncertainty.")

    evaluate = functools.partial(
        evaluate_model_file, split_name=args.split, uncertainty=uncertainty, **_model_options(args)
    )
    metrics = evaluate(args.model_file) if files is None else {f.name: evaluate(f) for f in files}
    text = json.dumps(metrics, indent=2, sort_keys=True)
    print(text)
    if args.out:
        atomic_write_text(args.out, text + "\n")
        print(f"wrote {args.out}")
    return 0


def _export(args, ctx: dict) -> int:
    from .io.compact import FAITHFUL_OPTIONS, export_compact_file, resolve_model_file
    from .pipeline.runtime.run_folder import check_output_file

    src = resolve_model_file(args.source)
    out = Path(args.out) if args.out else src.with_suffix(".2dgz")
    check_output_file(out, "--out")  # before the export, not after it
    keys = ("outlier_sigma_bits", "outlier_mu_bits", "alpha_bits", "index_coding")
    options = {k: getattr(args, k) for k in keys} | {
        "centre_dtype": args.precision,
        "covariances": {"auto": None, "yes": True, "no": False}[args.covariances],
    }
    if args.faithful:
        options.update(FAITHFUL_OPTIONS)
    rep = export_compact_file(
        src, out, prune_snr=args.prune_snr, prune_spread=args.prune_spread, **options
    )
    parts = ("centres", "covariances", "index", "outliers", "ellipses", "net", "header")
    fp32 = rep["float32_network_bytes"]
    print(f"{rep['source']}: {rep['source_bytes']:,} bytes (the full model file)")
    print(
        f"{out}: {rep['total']:,} bytes, {rep['bytes_per_weight']:.3f} bytes per network "
        f"parameter; {rep['float32_ratio']:.1f}x smaller than the float32 deterministic "
        f"network of the same architecture ({rep['network_params']:,} parameters: "
        f"{fp32:,} bytes at float32, {rep['int8_network_bytes']:,} at INT8)"
    )
    print("  " + ", ".join(f"{k} {rep[k]:,}" for k in parts))
    if rep["pruned"] is not None:
        pr = rep["pruned"]
        print(
            f"  pruned: {pr['n_pruned']:,} weights ({pr['fraction']:.1%}) of stage-1 "
            f"|mu|/sigma < {pr['snr']:g}, spread {pr['spread']}"
        )
    print(
        f"  index: {rep['index_bits_per_weight']:.3f} bits/weight ({rep['index_coding']} rANS), "
        f"empirical entropy {rep['index_entropy_bits']:.3f} "
        f"({rep['index_entropy_bits_per_site']:.3f} given the layer)"
    )
    print(f"wrote {out}")
    return 0


def _diagnose(args, ctx: dict) -> int:
    from .diagnostics.vi import MIN_KHAT_SAMPLES
    from .pipeline.outputs.saved_models import diagnose_model_file
    from .pipeline.runtime.run_folder import check_output_folder
    from .pipeline.settings.build import check_device

    check_device(args.device, "--device")
    _check_data_args(args, 2, " (PSIS-LOO needs at least 2 posterior draws)")
    for flag, value, low, why in (
        ("--khat-samples", args.khat_samples, MIN_KHAT_SAMPLES, " (the Pareto fit of k-hat)"),
        ("--max-site-values", args.max_site_values, 1, ""),
        ("--max-examples", args.max_examples, 1, ""),
        ("--khat-components", args.khat_components, 0, ""),
    ):
        _check_count(flag, value, low, why)
    out = Path(args.out or "runs/diagnose")
    check_output_folder(out, "--out")
    report = diagnose_model_file(
        args.model_file,
        out,
        **_model_options(args),
        khat_samples=args.khat_samples,
        max_site_values=args.max_site_values,
        max_train_examples=args.max_examples,
        max_eval_examples=args.max_examples,
        progress=not args.no_progress,
        khat_components=None if args.no_khat_blocks else args.khat_components,
    )
    vi, loo = report.get("vi") or {}, report.get("loo") or {}
    metrics = report.get("metrics") or {}
    for line in report.get("mcmc_lines") or ():
        print(line)
    if report.get("diagnosed_part"):
        print(f"diagnosed: {report['diagnosed_part']}")
    if "rmse" in metrics:  # a regression model
        print(
            f"{report.get('method')}: RMSE {_num(metrics['rmse'], '.4f')}, NLL "
            f"{_num(metrics.get('nll'), '.4f')}, 90 % coverage "
            f"{_num(metrics.get('coverage_90'), '.3f')}"
        )
    elif metrics:
        print(
            f"{report.get('method')}: accuracy {_num(metrics.get('accuracy'), '.4f')}, "
            f"NLL {_num(metrics.get('nll'), '.4f')}, ECE {_num(metrics.get('ece'), '.4f')} "
            f"({_num(report['draws'].get('num_samples'), 'd')} draws, seed "
            f"{_num(report['draws'].get('seed'), 'd')})"
        )
    if vi:
        print(
            f"k-hat = {_num(vi.get('khat'), '.3f')} ({vi.get('khat_assessment')}, "
            f"log q: {vi.get('log_q_method')})"
        )
    if loo:
        print(
            f"PSIS-LOO elpd = {_num(loo.get('elpd_loo'), '.2f')} (se {_num(loo.get('se'), '.2f')}"
            f", max Pareto k {_num(loo.get('max_pareto_k'), '.2f')})"
        )
    for name, path in sorted(report["files"].items()):
        print(f"wrote {name}: {path}")
    for name, message in sorted(report["errors"].items()):
        print(
            f"twodg-pyro diagnose: error in {name}: {_one_line(message.splitlines()[0])}",
            file=sys.stderr,
        )
    return 1 if report["errors"] else 0


def _num(value, spec: str) -> str:
    """``value`` formatted with ``spec``; NaN, infinities, strings (``"nan"`` as
    diagnostics.json writes them) and ``None`` are written as they are, never an error."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return value
    if isinstance(value, bool) or (isinstance(value, float) and not math.isfinite(value)):
        return str(value)
    try:
        return format(value, spec)
    except (TypeError, ValueError):  # None, or a value the spec does not fit
        return str(value)


_COMMANDS = {
    "run": _run_or_train,
    "train": _run_or_train,
    "evaluate": _evaluate,
    "diagnose": _diagnose,
    "export": _export,
    "report": _report,
}

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
