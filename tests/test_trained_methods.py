"""The trained-method protocol (issue 44): every method of a run predicts, counts its
forward passes and saves through :class:`~twodg_pyro.methods.TrainedMethod`; MC dropout
is one module and one registration; the settings load no method; nothing outside the
implementations branches on a guide being ``None`` or on a method's class."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import twodg_pyro
from twodg_pyro.cli import main
from twodg_pyro.methods import Ensemble, GuidePosterior, Network, TrainedMethod, load_method
from twodg_pyro.models import MLP
from twodg_pyro.pipeline import config_from_dict, run
from twodg_pyro.pipeline.outputs.saved_models import evaluate_model_file
from twodg_pyro.pipeline.settings.registry import METHOD_REGISTRY

PACKAGE = Path(twodg_pyro.__file__).parent
ROOT = PACKAGE.parent


def _sources(*folders: str):
    for folder in folders:
        yield from sorted((ROOT / folder).rglob("*.py"))


def test_mc_dropout_is_one_module_and_one_registration():
    """Adding MC dropout changed no other module: its name appears in its own module and
    in the registry of methods (its entry and settings section) only, and no consumer
    (costs, artifacts, files, uncertainty, evaluate) names it."""
    mentions = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if re.search(r"mc_dropout|MCDropout", path.read_text())
    }
    assert mentions == {"pipeline/methods/mc_dropout.py", "pipeline/settings/registry.py"}
    registry = (PACKAGE / "pipeline" / "settings" / "registry.py").read_text()
    assert len(re.findall(r"mc_dropout", registry.split("class MCDropoutConfig")[0])) == 0
    assert METHOD_REGISTRY["mc_dropout"].module == "mc_dropout"


@pytest.fixture(scope="module")
def mc_dropout_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("mcd") / "run"
    cfg = {
        "methods": ["deterministic", "mc_dropout"],
        "num_samples": 6,
        "progress": False,
        "network": {"hidden": [32]},
        "stage1": {"deterministic_epochs": 4},
        "mc_dropout": {"p": 0.2},
        "uncertainty": {
            "enabled": True,
            "draws": 4,
            "ood_size": 40,
            "shift_size": 40,
            "corruptions": ["gaussian_noise"],
            "severities": [3],
        },
    }
    return out, run(config_from_dict(cfg), out)


def test_mc_dropout_predicts_counts_saves_and_evaluates_like_every_method(mc_dropout_run):
    out, art = mc_dropout_run
    records = {r["method"]: r for r in json.loads((out / "results.json").read_text())["records"]}
    r, det = records["mc_dropout"], records["deterministic"]
    assert r["p"] == 0.2 and r["epochs"] == 4 and 0.5 < r["accuracy"] <= 1
    assert r["trainable_params"] == det["trainable_params"] == 64 * 32 + 32 + 32 * 10 + 10
    # its costs and uncertainty columns, from the protocol alone
    assert r["forwards_per_prediction"] == 6 and r["file"] == "model_mc_dropout.pt"
    assert r["file_bytes"] == (out / "model_mc_dropout.pt").stat().st_size
    assert r["mean_mi_clean"] > 0 and det["mean_mi_clean"] == 0  # its draws differ
    assert all(v["mi_auroc"] is not None for v in r["ood"].values())
    # the file reads back and evaluates to the row's numbers (the same seeded draws)
    method = load_method(out / "model_mc_dropout.pt")
    assert type(method).__name__ == "MCDropout" and method.p == 0.2
    result = evaluate_model_file(out / "model_mc_dropout.pt")
    for key in ("accuracy", "nll", "ece", "brier"):
        assert result[key] == r[key], key
    assert result["num_samples"] == 6 and result["recorded_metrics"]["nll"] == r["nll"]
    # seeded: the same draws for the same seed, others for another
    x = art.split.test.tensors[0][:20]
    a, b = method.sample_probs(x, 5, seed=1), method.sample_probs(x, 5, seed=1)
    assert torch.equal(a, b) and not torch.equal(a, method.sample_probs(x, 5, seed=2))
    assert a.shape == (5, 20, 10) and not torch.equal(a[0], a[1])
    assert main(["evaluate", str(out / "model_mc_dropout.pt"), "--seed", "3"]) == 0


def test_every_trained_method_predicts_through_the_protocol(digits):
    """A network, an ensemble and a guide posterior: ``predict`` is the average of
    ``num_draws`` draws of ``sample_probs`` (one forward pass each; a network's one, an
    ensemble's members), and a file of each reads back as the same method."""
    x, y = (t[:30] for t in digits.test.tensors)
    torch.manual_seed(0)
    methods = [Network(MLP(64, (8,), 10)), Ensemble([MLP(64, (8,), 10) for _ in range(3)])]
    for method in methods:
        assert isinstance(method, TrainedMethod)
        pred = method.predict((x, y), num_samples=7, seed=0, keep_samples=True)
        draws = method.num_draws(7)
        assert pred.samples.shape == (draws, 30, 10) == method.sample_probs(x, 7).shape
        assert method.forwards_per_prediction(7) == draws == (1 if not method.bayesian else 3)
        torch.testing.assert_close(pred.mean, pred.samples.mean(0))
    with pytest.raises(TypeError, match="has no model file"):
        GuidePosterior.file_content(methods[0])  # not a baseline's file: save_model's


def test_the_settings_load_no_method():
    """Loading (and checking) a run's settings imports no method's implementation: the
    methods of the pipeline, the trained methods, the samplers and fitters."""
    code = (
        "import sys\n"
        "from twodg_pyro.pipeline.settings.config import config_from_dict\n"
        "config_from_dict({'methods': ['mcmc', 'laplace', 'ensemble', 'mc_dropout']})\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('twodg_pyro')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(out.stdout.split())
    assert (
        "twodg_pyro.pipeline.settings.config" in loaded
        and "twodg_pyro.methods.mcmc.settings" in loaded
    )
    implementations = [
        m
        for m in loaded
        if m.startswith(("twodg_pyro.pipeline.methods", "twodg_pyro.baselines"))
        or (m.startswith("twodg_pyro.methods.") and not m.endswith("settings"))
        and m != "twodg_pyro.methods.mcmc"
    ]
    assert implementations == [], implementations


def _dispatch(tree: ast.AST) -> list[str]:
    """The tests of ``guide is None`` and ``isinstance(x, <a trained method's class>)``."""
    classes = {"Ensemble", "LaplacePosterior", "MCMCPosterior", "Network", "GuidePosterior"}
    classes |= {"MCDropout", "TrainedMethod", "DrawBaseline"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.Is, ast.IsNot)):
            left, right = ast.unparse(node.left), ast.unparse(node.comparators[0])
            if re.search(r"(^|\.)guide$", left) and right == "None":
                found.append(ast.unparse(node))
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "isinstance":
            names = set(re.findall(r"\w+", ast.unparse(node.args[1])))
            if names & classes:
                found.append(ast.unparse(node))
    return found


def test_no_consumer_asks_for_a_guide_or_a_method_class():
    """Outside the trained methods' own package, no code asks whether a guide is ``None``
    or which class of trained method an object is: the protocol answers."""
    found = {}
    for path in _sources("twodg_pyro", "experiments", "benchmarks"):
        if path.is_relative_to(PACKAGE / "methods") or path.name == "mc_dropout.py":
            continue
        hits = _dispatch(ast.parse(path.read_text()))
        if hits:
            found[str(path.relative_to(ROOT))] = hits
    assert found == {}
    assert _dispatch(ast.parse("a = model if guide is None else isinstance(m, Ensemble)"))
