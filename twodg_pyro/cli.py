"""Command-line interface: ``twodg-pyro run | train | report``.

``run`` is the main job on the bundled digits; ``train --config FILE`` runs any
configuration; ``report RUN_DIR`` rebuilds the table of a finished run.
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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``twodg-pyro``."""
    parser = argparse.ArgumentParser(
        prog="twodg-pyro", description="Stochastic weight-sharing BNNs (2DGBNN) in Pyro."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="the main job: every method on the bundled digits")
    p.add_argument("--config", default=None, help="optional config file (TOML/JSON/YAML)")
    p.add_argument("--methods", nargs="+", default=None, help="subset of methods to run")
    _common(p)
    p = sub.add_parser("train", help="run the configuration in a config file")
    p.add_argument("--config", required=True, help="config file (TOML, JSON or YAML)")
    _common(p)
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
    if getattr(args, "methods", None):
        over["methods"] = args.methods
    return over


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = build_parser().parse_args(argv)
    from .pipeline import ConfigError, config_from_dict, format_table, load_config, read_results
    from .pipeline import run as run_pipeline

    try:
        if args.command in ("run", "train"):
            over = _overrides(args)
            if args.config:
                cfg = load_config(args.config, over)
            else:  # the main job: the digits preset
                from .pipeline.config import merge_settings
                from .pipeline.presets import preset

                cfg = config_from_dict(merge_settings(preset("digits"), over))
            out = Path(args.out or f"runs/{args.command}")
            run_pipeline(cfg, out)
            print(f"wrote {out / 'results.json'}")
            return 0
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
