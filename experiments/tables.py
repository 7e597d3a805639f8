"""The experiments behind the paper's tables, small on the bundled digits.

Table 4 runs at full size (ResNet-20, the paper's recipe: the ``mnist-resnet20`` and
``cifar10-resnet20`` presets) when its data set is present under ``--root`` (MNIST:
``ROOT/MNIST/raw``, CIFAR-10: ``ROOT/cifar-10-batches-py``); every table runs at a small
size on scikit-learn's digits (the 64-128-10 MLP of the ``digits`` preset) otherwise.
Each writes ``<out>/<table>.json`` and ``<out>/<table>.md``.

    python experiments/tables.py table4        # 2DG vs INT8-quantised mean-field BNN
    python experiments/tables.py table5        # ablation: ellipses / outliers
    python experiments/tables.py table10       # merging on / off
    python experiments/tables.py tyings        # representative / stochastic / tied
    python experiments/tables.py merge_rules   # paper / moment-matching merge
    python experiments/tables.py coordinates   # (mu, sigma) vs (mu, log sigma)
    python experiments/tables.py all
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from common import setup

from twodg_pyro.baselines import quantize_mean_field, quantized_size_mb
from twodg_pyro.data import DatasetNotFoundError, load_dataset
from twodg_pyro.files import atomic_write_text
from twodg_pyro.metrics import classification_metrics
from twodg_pyro.pipeline import config_from_dict, format_table
from twodg_pyro.pipeline.runtime.variants import run_variants
from twodg_pyro.pipeline.settings.config import merge_settings
from twodg_pyro.pipeline.settings.presets import preset
from twodg_pyro.prediction import predict

MERGING = {"sharing": {"n_components": 64, "tau_d": 0.05}, "stage3": {"merge_every": 10}}

VARIANTS: dict[str, dict[str, dict]] = {
    "table5": {
        "full": {},
        "no ellipses": {"sharing": {"use_ellipses": False}},
        "no outliers": {"sharing": {"use_outliers": False}},
        "no ellipses, no outliers": {"sharing": {"use_ellipses": False, "use_outliers": False}},
    },
    "table10": {
        "merging": MERGING,
        "no merging": merge_settings(MERGING, {"sharing": {"use_merging": False}}),
    },
    "tyings": {t: {"stage3": {"tying": t}} for t in ("representative", "stochastic", "tied")},
    "merge_rules": {
        r: merge_settings(MERGING, {"sharing": {"merge_rule": r}}) for r in ("paper", "moment")
    },
    "coordinates": {c: {"sharing": {"coordinates": c}} for c in ("sigma", "log_sigma")},
}

PRETRAIN_EPOCHS = 150  # deterministic pretraining of Table 4's "pretrained" rows

#: overrides of the full-size presets (``mnist-resnet20``, ``cifar10-resnet20``: the
#: paper's recipe, see ``twodg_pyro/pipeline/presets.py``); empty: the presets as they are
FULL_OVERRIDES: dict = {}


def base_settings(dataset: str | None, root: str | None, seed: int) -> tuple[dict, str]:
    """Full-size settings if ``dataset`` is present under ``root``, else the digits preset."""
    if dataset is not None and root is not None:
        try:
            load_dataset(dataset, root)
            cfg = merge_settings(preset(f"{dataset}-resnet20"), FULL_OVERRIDES)
            cfg["data"]["root"] = root
            return merge_settings(cfg, {"seed": seed, "progress": False}), f"{dataset}-resnet20"
        except DatasetNotFoundError as e:
            print(f"[{dataset}] not found ({e.__class__.__name__}); running the small version")
    return merge_settings(preset("digits"), {"seed": seed, "progress": False}), "digits-mlp"


def _int8_rows(art, eval_data) -> list[dict]:
    model, guide = art.trained["mean_field"].model, art.trained["mean_field"].guide
    n_det = sum(p.numel() for p in model.deterministic_parameters())
    rows = []
    for bits in (4, 2, 1):
        q = quantize_mean_field(guide, bits)
        pred = predict(model, q, eval_data, 30)
        rows.append(
            {
                "method": f"mean_field INT8 mu + {bits}-bit sigma",
                "variant": "quantised",
                **classification_metrics(pred.mean, pred.targets),
                "trainable_params": guide.num_trainable() + n_det,
                "size_mb": quantized_size_mb(model.num_weights, len(model.sites), bits, n_det),
            }
        )
    return rows


def run_table(name: str, root: str | None, seed: int) -> tuple[list[dict], str]:
    """Records of one table and the setting it ran at."""
    if name == "table4":
        records, size = [], None
        for dataset in ("mnist", "cifar10"):
            settings, size = base_settings(dataset, root, seed)
            if size == "digits-mlp" and records:
                break  # the small version is the same for both data sets: run it once
            # the full-size presets pretrain as the paper does (App. I.3); digits for
            # PRETRAIN_EPOCHS epochs
            pretrained = settings["network"].get("pretrain_epochs") or PRETRAIN_EPOCHS
            for label, pre in (("no pretraining", 0), ("pretrained", pretrained)):
                s = merge_settings(
                    settings,
                    {"methods": ["mean_field", "2dg"], "network": {"pretrain_epochs": pre}},
                )
                recs, art = run_variants(config_from_dict(s), {label: {}})
                for r in recs:
                    r["setting"] = f"{size}, {label}"
                records += recs
                if pre == 0:
                    for r in _int8_rows(art, art.eval_data):
                        r["setting"] = f"{size}, {label}"
                        records.append(r)
        return records, size
    settings, size = base_settings(None, root, seed)
    settings["methods"] = ["mean_field", "2dg"]
    records, _ = run_variants(config_from_dict(settings), VARIANTS[name])
    return records, size


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", choices=["table4", *VARIANTS, "all"])
    parser.add_argument("--root", default=None, help="data folder for the full-size runs")
    parser.add_argument("--out", default="experiments/results")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (results are reproducible for a fixed count)",
    )
    args = parser.parse_args(argv)
    setup(args.threads)
    names = ["table4", *VARIANTS] if args.table == "all" else [args.table]
    for name in names:
        t0 = time.perf_counter()
        records, size = run_table(name, args.root, args.seed)
        command = " ".join(
            ["python experiments/tables.py", name, "--seed", str(args.seed)]
            + (["--root", args.root] if args.root else [])
        )
        payload = {
            "table": name,
            "size": size,
            "command": command,
            "seed": args.seed,
            "seconds": time.perf_counter() - t0,
            "records": records,
        }
        out = Path(args.out)
        atomic_write_text(out / f"{name}.json", json.dumps(payload, indent=2, default=str))
        cols = [
            dict(r, method=f"{r['method']} ({r.get('setting', r['variant'])})") for r in records
        ]
        table = f"# {name} ({size})\n\n`{command}`\n\n" + format_table(cols)
        atomic_write_text(out / f"{name}.md", table)
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
