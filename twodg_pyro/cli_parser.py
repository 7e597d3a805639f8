"""The argument parser of the command-line interface (:mod:`twodg_pyro.cli`): its
subcommands ``run``, ``train``, ``evaluate``, ``diagnose``, ``export`` and ``report``
and their options."""

from __future__ import annotations

import argparse
import re
import textwrap

from .pipeline.settings.presets import PRESETS

__all__ = ["EXIT_FAILURE", "EXIT_INTERRUPTED", "EXIT_USER_ERROR", "build_parser"]

#: Exit code of a user error (also argparse's).
EXIT_USER_ERROR = 2
#: Exit code of an unexpected failure.
EXIT_FAILURE = 1
#: Exit code after Ctrl-C (128 + SIGINT).
EXIT_INTERRUPTED = 130


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, wrapping help text at spaces only: a preset's name
    (``mnist-lenet5-bayes``) stays whole on an 80-column terminal."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        text = re.sub(r"\s+", " ", text).strip()
        return textwrap.wrap(text, width, break_on_hyphens=False, break_long_words=False)


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (with where to find the usage)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _int_in(low: int, high: int):
    """An argparse type: an integer in ``[low, high]``; else a one-line usage error naming
    the option and the value."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value}: must be an integer in [{low}, {high}]")
        return value

    return parse


def _choice(p: argparse.ArgumentParser, flag: str, choices: list[str], help: str) -> None:
    """An option taking one of ``choices``, the first by default."""
    p.add_argument(flag, choices=choices, default=choices[0], help=help)


def _debug(p: argparse.ArgumentParser, top: bool = False) -> None:
    p.add_argument(
        "--debug",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="show the full traceback of an error",
    )


def _run_args(p: argparse.ArgumentParser, config_help: str) -> None:
    """The options of ``run`` and ``train``."""
    p.add_argument("--config", default=None, help=config_help)
    p.add_argument(
        "--resume",
        default=None,
        metavar="RUN_DIR",
        help="continue a killed run from the checkpoints in RUN_DIR (written with "
        "checkpoint_every > 0); its stored settings are used",
    )
    p.add_argument("--out", default=None, help="output folder (default: runs/<command>)")
    p.add_argument("--seed", type=int, default=None, help="seed of the whole pipeline")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:<index>")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the results and checkpoints of an earlier run in --out (refused without it)",
    )
    p.add_argument(
        "--no-diagnostics",
        action="store_true",
        help="write the results and the model file only: no InferenceData, k-hat, "
        "PSIS-LOO or figures (the setting diagnostics.enabled = false)",
    )


def _model_args(p: argparse.ArgumentParser, model_help: str, out_help: str, seed_of: str):
    """The options of ``evaluate`` and ``diagnose``."""
    p.add_argument(
        "model_file",
        help="a model file written by run/train (model_<method>.pt) or export (.2dgz)" + model_help,
    )
    p.add_argument(
        "--data",
        default=None,
        help="evaluation data set (default: the run's, from the model file; else digits)",
    )
    p.add_argument("--root", default=None, help="folder of a file-based data set")
    p.add_argument(
        "--num-samples",
        type=int,
        default=None,
        help="posterior draws N_s (default: the run's, from the model file; else 30)",
    )
    p.add_argument("--out", default=None, help=out_help)
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help=f"seed of {seed_of} (default: the run's, from the model file; else 0)",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:<index>")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``twodg-pyro``."""
    parser = _Parser(
        prog="twodg-pyro", description="Stochastic weight-sharing BNNs (2DGBNN) in Pyro."
    )
    _debug(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        _debug(p)
        return p

    presets = ", ".join(PRESETS)  # the registry's names, in its order
    p = command("run", "the main job: every method on the bundled digits")
    _run_args(
        p,
        "optional config file (TOML/JSON/YAML): changes to the digits preset, or to the "
        f'preset it names with a top-level preset = "NAME" ({presets})',
    )
    p.add_argument("--methods", nargs="+", default=None, help="subset of methods to run")
    p = command("train", "run a preset and/or the configuration in a config file")
    _run_args(
        p,
        'config file (TOML, JSON or YAML); a top-level preset = "NAME" in it starts from '
        "that preset",
    )
    p.add_argument(
        "--preset",
        default=None,
        metavar="NAME",
        help=f"named settings, one of: {presets}; a --config file given too overrides them",
    )
    p.add_argument("--root", default=None, help="data folder (sets data.root)")
    p = command("evaluate", "metrics of a saved model file (any method)")
    _model_args(
        p,
        ", or a run folder: then every model file in it, by file name",
        "also write the metrics as JSON to this file",
        "the posterior draws",
    )
    _choice(p, "--split", ["test", "val"], "default: test")
    _uncertainty_args(p)
    p = command("diagnose", "ArviZ diagnostics and figures of a saved model file (any method)")
    _model_args(p, "", "output folder (default: runs/diagnose)", "the draws and subsets")
    p.add_argument("--khat-samples", type=int, default=100, help="draws for k-hat (100)")
    p.add_argument(
        "--max-examples",
        type=int,
        default=2000,
        help="seeded subset of at most this many training examples (k-hat) and test "
        "examples (InferenceData, PSIS-LOO) (2000)",
    )
    p.add_argument(
        "--max-site-values",
        type=int,
        default=10_000,
        help="values of each Pyro site exported per draw; a larger site is exported on a "
        "seeded sub-grid (10000)",
    )
    p.add_argument(
        "--khat-components",
        type=int,
        default=4,
        help="mixture components (the largest) with a block k-hat of their own, beside "
        "each layer's and the outliers' (4)",
    )
    p.add_argument(
        "--no-khat-blocks", action="store_true", help="skip the block k-hats (the joint one stays)"
    )
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p = command("export", "write the compact model file (.2dgz) of a 2DG BNN")
    p.add_argument("source", metavar="RUN_OR_MODEL_FILE", help="a run folder or its model_2dg.pt")
    p.add_argument(
        "--out", default=None, help="the compact file (default: model_2dg.2dgz beside the source)"
    )
    _choice(p, "--precision", ["float16", "float32"], "centres and covariances (default float16)")
    bits = "bits per outlier sigma (1-16; 16)"
    p.add_argument("--outlier-sigma-bits", type=_int_in(1, 16), default=16, help=bits)
    p.add_argument(
        "--outlier-mu-bits",
        type=int,
        choices=[8, 16],
        default=16,
        help="bits per outlier mean (16, or 8: INT8 as the quantised baseline; 16)",
    )
    bits = "bits per ellipse blending weight (2-16; 8)"
    p.add_argument("--alpha-bits", type=_int_in(2, 16), default=8, help=bits)
    _choice(
        p,
        "--index-coding",
        ["auto", "global", "per_site"],
        "one rANS table, one per layer, or the smaller (default auto)",
    )
    _choice(
        p,
        "--covariances",
        ["auto", "yes", "no"],
        "store the covariances (auto: when the tying draws with them)",
    )
    p.add_argument(
        "--faithful",
        action="store_true",
        help="predict as the full file does: float32 centres, 16-bit outliers and alphas "
        "(overrides --precision and the bit widths)",
    )
    p.add_argument(
        "--prune-snr",
        type=float,
        default=None,
        metavar="T",
        help="tie every inlier of stage-1 |mu|/sigma < T to a zero-mean component (fewer "
        "index bits; docs/results.md measures what it costs)",
    )
    _choice(
        p,
        "--prune-spread",
        ["zero", "matched"],
        "pruned weights: removed (zero), or N(0, their mean second moment) per layer",
    )
    p = command("report", "rebuild the results table of a run folder")
    p.add_argument("run_dir")
    return parser


def _uncertainty_args(p) -> None:
    g = p.add_argument_group("uncertainty (OOD detection, shift, selective prediction)")
    g.add_argument(
        "--uncertainty",
        action="store_true",
        help="also report OOD detection on the built-in sets, shift and AURC",
    )
    g.add_argument("--ood-sets", nargs="+", default=None, help="built-in OOD sets (default: all)")
    g.add_argument(
        "--folder-sets",
        nargs="+",
        default=[],
        help="OOD test sets read from --folder-root (fashion_mnist, kmnist, svhn, cifar100)",
    )
    g.add_argument("--folder-root", default=None, help="folder of the --folder-sets")
    g.add_argument("--ood-size", type=int, default=None, help="images per OOD set (all)")
    g.add_argument("--shift-size", type=int, default=None, help="images corrupted (all)")
    g.add_argument("--uncertainty-draws", type=int, default=None, help="draws (the run's)")
