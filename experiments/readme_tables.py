"""Print the result tables of the README and docs/results.md, docs/real-images.md from
the committed results in ``experiments/results``.

    python experiments/readme_tables.py          # digits tables (tables.py), then real images

Those tables (the README's headline one, the "Results" sections of docs/results.md and
docs/real-images.md) are this script's output, so every figure there can be
traced to a results file and the command that wrote it (named above each table).
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"

TITLES = {
    "table5": "Main result and ablation (paper Table 5)",
    "tyings": "Tyings",
    "table10": "Merging on/off, K = 64 initial components (paper Table 10)",
    "merge_rules": "Merge rules, K = 64",
    "coordinates": "Mixture coordinates",
    "table4": "Against the INT8-quantised mean-field BNN (paper Table 4, small version)",
}


def _cell(r: dict, key: str, fmt: str) -> str:
    v = r.get(key)
    return "-" if v is None else fmt.format(v)


def digits_table(name: str) -> str:
    payload = json.loads((RESULTS / f"{name}.json").read_text())
    full = name == "table5"
    head = "| method | variant | acc | NLL | ECE | trainable |"
    if full:
        head += " compression (floats) | #outliers | #ellipses | #Gaussians |"
        head += " MB (MB with uint8 index) |"
    else:
        head += " #ellipses | #Gaussians | MB |"
    lines = [
        f"**{TITLES[name]}** — `{payload['command']}`",
        "",
        head,
        "|" + "---|" * (head.count("|") - 1),
    ]
    for r in payload["records"]:
        if not full and r["method"] == "mean_field" and name != "table4":
            continue  # the shared stage-1 row is table5's
        variant = r.get("setting", r.get("variant", "-"))
        cells = [
            r["method"],
            variant,
            f"{r['accuracy']:.4f}",
            f"{r['nll']:.3f}",
            f"{r['ece']:.4f}",
            f"{r['trainable_params']:,}",
        ]
        if full:
            mb = _cell(r, "size_mb", "{:.4f}")
            if "size_mb_with_index" in r:
                mb += f" ({r['size_mb_with_index']:.4f})"
            cells += [
                _cell(r, "compression_ratio", "{:.1f}x"),
                _cell(r, "n_outliers", "{:,}"),
                _cell(r, "n_ellipses", "{:,}"),
                _cell(r, "n_gaussians", "{:,}"),
                mb,
            ]
        else:
            cells += [
                _cell(r, "n_ellipses", "{:,}"),
                _cell(r, "n_gaussians", "{:,}"),
                _cell(r, "size_mb", "{:.4f}"),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    for name in TITLES:
        print(digits_table(name))
    for stem in ("mnist_subset", "mnist_subset_resnet20"):
        path = RESULTS / f"{stem}.md"
        if path.exists():
            print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
