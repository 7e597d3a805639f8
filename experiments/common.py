"""What the experiment scripts share: their set-up (torch's threads, the MNIST subset),
the command that reproduces a result (quoted as a shell reads it), and the pieces of their
tables (a target's check, a number's cell, a mean that skips what is missing).

A script imports it as ``common``: the folder of a script that runs is on Python's path,
and pytest puts ``experiments/`` there too (``pythonpath`` in ``pyproject.toml``); so does
a script that reuses another's settings (``from uncertainty import QUICK``).
"""

from __future__ import annotations

import platform
import shlex
import statistics
import sys

import torch

from twodg_pyro.data import DatasetNotFoundError, load_dataset


def setup(threads: int, mnist_root: str | None = None) -> bool:
    """Torch's ``threads``; with ``mnist_root``, whether the MNIST subset is there
    (``False`` after saying on stderr how to write it)."""
    torch.set_num_threads(threads)
    if mnist_root is None:
        return True
    try:
        load_dataset("mnist", mnist_root)
    except DatasetNotFoundError as e:
        print(
            f"{e}\nWrite the subset first: python experiments/mnist_subset_data.py "
            f"--root {mnist_root}",
            file=sys.stderr,
        )
        return False
    return True


def environment() -> dict:
    """What a seeded figure depends on besides the code and its seed: torch's version and
    threads, the CPU's name, family and model, and the vector instructions torch's kernels
    use (``isa``, e.g. AVX2 or AVX512: two machines named alike, "AMD EPYC", trained other
    numbers); stamped on each record, so merged tables keep it per run."""
    fields: dict[str, str] = {}  # the first processor's (Linux)
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                key, _, value = ln.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    cpu = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        cpu += f" (family {fields['cpu family']}, model {fields['model']})"
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": cpu,
        "isa": torch.backends.cpu.get_cpu_capability(),
    }


def command(script: str, argv: list[str] | None = None) -> str:
    """``python experiments/<script> <arguments>``, the arguments (``argv``, default the
    process's) quoted as a shell reads them (a recipe's name holds spaces)."""
    args = sys.argv[1:] if argv is None else list(argv)
    return f"python experiments/{script} {shlex.join(args)}".strip()


def check(value, target: str, met: bool) -> dict:
    """One target of a table: its value, the target as text and whether it is met."""
    return {"value": value, "target": target, "met": bool(met)}


def cell(x, fmt: str = ".3f") -> str:
    """A number in a table's cell, ``-`` where there is none."""
    return "-" if x is None else format(x, fmt)


def table(title: str, columns: list[str], rows) -> list[str]:
    """The markdown lines of a table after a blank line, ``title`` and a blank line:
    ``columns`` its header, each of ``rows`` a list of cells."""
    lines = ["", title, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def by_recipe_method(records: list[dict]) -> dict[tuple, list[dict]]:
    """The records grouped by ``(recipe, method)``, in the order they first appear."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["recipe"], r["method"]), []).append(r)
    return groups


def mean(xs) -> float | None:
    """The mean of the values that are not ``None`` (``None`` if there are none)."""
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def data_size_beta(n_train: int, net) -> float:
    """The data-size rule's KL weight (:func:`twodg_pyro.infer.data_size_kl_weight`) for
    ``n_train`` training examples and the Bayesian weights of ``net``."""
    from twodg_pyro.infer import data_size_kl_weight
    from twodg_pyro.nn import find_sites

    return data_size_kl_weight(n_train, sum(site.numel for site in find_sites(net)))
