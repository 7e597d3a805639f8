"""The trained-method protocol (issue 44): every method of a run predicts, counts its
forward passes and saves through :class:`~twodg_pyro.methods.TrainedMethod`; the settings
load no method; nothing outside the implementations branches on a guide being ``None``
or on a method's class."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import twodg_pyro
from twodg_pyro.methods import Ensemble, GuidePosterior, Network, TrainedMethod
from twodg_pyro.models import MLP

PACKAGE = Path(twodg_pyro.__file__).parent
ROOT = PACKAGE.parent


def _sources(*folders: str):
    for folder in folders:
        yield from sorted((ROOT / folder).rglob("*.py"))


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
        "from twodg_pyro.pipeline.config import config_from_dict\n"
        "config_from_dict({'methods': ['mcmc', 'laplace', 'ensemble']})\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('twodg_pyro')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(out.stdout.split())
    assert "twodg_pyro.pipeline.config" in loaded and "twodg_pyro.methods.mcmc.settings" in loaded
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
