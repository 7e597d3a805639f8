"""Draws per prediction (issue 31, item 4): the NLL / OOD AUROC curve against the number
of draws and the fewest draws within a tolerance of 30."""

from __future__ import annotations

import pytest
import torch

from twodg_pyro.uncertainty import draws_curve, sufficient_draws


def _pool(P: int, N: int, C: int, noise: float, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(1, N, C, generator=g) * 2
    return (base + noise * torch.randn(P, N, C, generator=g)).softmax(-1)


def test_identical_draws_need_one():
    probs = _pool(1, 40, 3, 0.0).expand(60, 40, 3)
    labels = probs[0].argmax(1)
    ood = {"a": _pool(1, 20, 3, 0.0, seed=1).expand(60, 20, 3)}
    curve = draws_curve(probs, labels, ood, range(1, 31))
    assert list(curve) == list(range(1, 31))
    assert curve[1]["nll"] == pytest.approx(curve[30]["nll"]) and curve[1]["nll_sd"] == 0
    assert curve[1]["accuracy"] == 1.0
    assert (curve[1]["blocks"], curve[2]["blocks"], curve[30]["blocks"]) == (16, 16, 2)
    assert sufficient_draws(curve) == 1


def test_noisy_draws_need_more_and_the_curve_says_how_many():
    probs = _pool(120, 200, 4, 2.0)
    labels = probs.mean(0).argmax(1)
    ood = {"a": _pool(120, 100, 4, 4.0, seed=1), "b": _pool(120, 50, 4, 6.0, seed=2)}
    curve = draws_curve(probs, labels, ood, [1, 2, 5, 10, 20, 30], max_blocks=4)
    assert curve[1]["nll"] > curve[5]["nll"] > curve[30]["nll"]  # fewer draws: higher NLL
    assert set(curve[5]["auroc"]) == {"a", "b"}
    assert curve[5]["mean_auroc"] == pytest.approx(sum(curve[5]["auroc"].values()) / 2)
    n = sufficient_draws(curve)
    assert 1 < n <= 30
    # within the tolerance at n and every measured n above it
    for m in (k for k in curve if k >= n):
        assert abs(curve[m]["nll"] / curve[30]["nll"] - 1) <= 0.01
        assert abs(curve[m]["mean_auroc"] / curve[30]["mean_auroc"] - 1) <= 0.01
    assert sufficient_draws(curve, tolerance=10.0) == 1
    assert sufficient_draws(curve, tolerance=0.0) == 30
    assert sufficient_draws(draws_curve(probs, labels, None, [1, 30]), criteria=["nll"]) >= 1


def test_bad_arguments_are_named():
    probs = _pool(10, 5, 3, 1.0)
    labels = torch.zeros(5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"draws must be in \[1, 10\] \(the pool\), got 11"):
        draws_curve(probs, labels, None, [11])
    with pytest.raises(ValueError, match="labels has 4 entries, probs_in 5 test images"):
        draws_curve(probs, labels[:4], None, [1])
    with pytest.raises(ValueError, match=r"probs_out\['x'\] has 9 draws, probs_in 10"):
        draws_curve(probs, labels, {"x": probs[:9]}, [1])
    with pytest.raises(ValueError, match="max_blocks must be at least 1, got 0"):
        draws_curve(probs, labels, None, [1], max_blocks=0)
    curve = draws_curve(probs, labels, None, [1, 2])
    with pytest.raises(ValueError, match="reference 30 draws is not in the curve"):
        sufficient_draws(curve)
    with pytest.raises(ValueError, match="tolerance must be >= 0, got -1"):
        sufficient_draws(curve, reference=2, tolerance=-1)


def test_the_draws_experiment_runs_end_to_end(tmp_path, monkeypatch):
    """``experiments/draws.py`` on the tiny digits run (its preset swapped in): a curve of
    1-30 draws per Bayesian method, the ensemble's over its members, and the files."""
    import copy
    import importlib.util
    import json
    from pathlib import Path

    from conftest import _TINY_RUN

    path = Path(__file__).resolve().parents[1] / "experiments" / "draws.py"
    spec = importlib.util.spec_from_file_location("draws_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    tiny = copy.deepcopy(_TINY_RUN)
    tiny.update(checkpoint_every=0, ensemble={"members": 2})
    monkeypatch.setattr(script, "preset", lambda name: copy.deepcopy(tiny))
    methods = ["deterministic", "mean_field", "2dg", "ensemble"]
    argv = ["--seeds", "0", "--methods", *methods, "--pool", "30", "--out", str(tmp_path)]
    assert script.main(argv) == 0
    payload = json.loads((tmp_path / "draws.json").read_text())
    summary = payload["summary"]
    assert list(summary) == ["mean_field", "2dg", "ensemble"]
    assert list(summary["mean_field"]["curve"]) == [str(n) for n in range(1, 31)]
    assert list(summary["ensemble"]["curve"]) == ["1", "2"]
    assert payload["recommended_draws"] == max(
        n for m in ("mean_field", "2dg") for n in summary[m]["sufficient_draws_per_seed"]
    )
    records = payload["per_seed"]["0"]["records"]
    assert records["2dg"]["file"] == "model_2dg.2dgz" and records["deterministic"]["file_bytes"]
    text = (tmp_path / "draws.md").read_text()
    assert "Recommended default" in text and "x smaller than the float32" in text
    assert (tmp_path / "draws.png").stat().st_size > 0


@pytest.mark.parametrize("name", ["draws", "draws_lenet5", "draws_resnet20"])
def test_committed_draws_support_the_library_default(name):
    """Item 4 of issue 31 on digits (``draws``), LeNet-5 on the MNIST subset
    (``draws_lenet5``) and ResNet-20 (``draws_resnet20``, issue 47): the recommended
    number of draws is the largest per-seed figure of the Bayesian draw methods, and the
    library's default (30) is not below it."""
    import json
    from pathlib import Path

    from twodg_pyro.pipeline import config_from_dict

    default = config_from_dict({}).num_samples
    path = Path(__file__).resolve().parents[1] / "experiments" / "results" / f"{name}.json"
    if not path.exists():
        pytest.skip(f"{name}.json is not committed")
    payload = json.loads(path.read_text())
    summary = payload["summary"]
    drawn = [m for m in summary if m != "ensemble"]
    assert {"mean_field", "2dg"} <= set(drawn)
    worst = max(n for m in drawn for n in summary[m]["sufficient_draws_per_seed"])
    assert payload["recommended_draws"] == worst
    assert payload["library_default"] == default >= worst
    for m in drawn:
        curve = summary[m]["curve"]
        assert float(curve["1"]["nll"]) > float(curve["30"]["nll"])  # one draw is worse
