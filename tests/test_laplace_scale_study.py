"""The widened Laplace last layer of ``experiments/laplace_scale_study.py``: its covariance
is the fitted one times the scale (a known answer on digits), the fitted one is not
touched, and the rule picks the widest scale that keeps the clean targets on
validation."""

from __future__ import annotations

import pytest
import torch

from twodg_pyro.data import make_loader
from twodg_pyro.methods import fit_laplace
from twodg_pyro.models import MLP

pytest.importorskip("laplace")


@pytest.fixture(scope="module")
def study():
    import laplace_scale_study  # experiments/ is on the tests' path (pyproject)

    return laplace_scale_study


def test_a_widened_laplace_has_the_covariance_times_the_scale(study, digits):
    torch.manual_seed(0)
    net = MLP(64, (16,), 10)
    post = fit_laplace(net, make_loader(digits.train, 256), marglik_steps=10)
    before = post.covariance().clone()
    wide = study.widened(post, 2.5)
    torch.testing.assert_close(wide.covariance(), 2.5 * before, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(post.covariance(), before, rtol=0, atol=0)
    # the same seeded normal draws, sqrt(2.5) times as far from the mean
    mean = post.mean()
    torch.testing.assert_close(
        wide.sample_params(4, seed=1) - mean,
        2.5**0.5 * (post.sample_params(4, seed=1) - mean),
        rtol=1e-4,
        atol=1e-6,
    )


def _row(point, scale, nll, ece):
    return {"point": point, "scale": scale, "val": {"nll": nll, "ece": ece}}


def test_the_rule_takes_the_widest_scale_that_keeps_nll_and_ece(study):
    det = _row("deterministic", None, 0.10, 0.03)
    rows = [
        det,
        _row("x1", 1.0, 0.07, 0.012),
        _row("x1.5", 1.5, 0.08, 0.019),
        _row("x2", 2.0, 0.09, 0.021),  # ECE over 0.02
        _row("x3", 3.0, 0.11, 0.015),  # NLL over the deterministic network's
    ]
    assert study.choose(rows) == 1.5
    assert study.choose([det, _row("x1", 1.0, 0.07, 0.03)]) is None


def test_the_committed_resnet20_study_keeps_the_fitted_width(study):
    """``recipe_selection/laplace_scale_resnet20.json`` (seeds 0-2): validation keeps x1;
    on the test images x1.5 would meet the MI and severity-5 targets that x1 misses, at an
    ECE over 0.02: the scale trades one target for the others."""
    import json
    from pathlib import Path

    path = Path(study.__file__).parent / "results/recipe_selection/laplace_scale_resnet20.json"
    doc = json.loads(path.read_text())
    summary = study.summarise(doc["records"])
    assert summary == doc["summary"] and study.choose(summary) == doc["chosen_scale"] == 1.0
    by = {r["scale"]: r for r in summary}
    det = summary[0]

    def mi(r):
        return sum(v[1] for v in r["ood"].values()) / len(r["ood"])

    def severity5(r):
        return sum(r["shift5"][f] / det["shift5"][f] for f in det["shift5"]) / len(det["shift5"])

    assert det["point"] == "deterministic"
    assert mi(by[1.0]) < 0.90 and severity5(by[1.0]) > 0.8 and by[1.0]["test"]["ece"] <= 0.02
    assert mi(by[1.5]) >= 0.90 and severity5(by[1.5]) <= 0.8 and by[1.5]["test"]["ece"] > 0.02


def test_on_held_out_seeds_the_fitted_width_meets_what_seeds_0_to_2_missed(study):
    """Seeds 3-5 (``laplace_scale_resnet20_seed345.json``): validation keeps x1 again, and
    there x1 meets the MI AUROC (>= 0.90), the severity-5 ratio (<= 0.8) and the ECE; over
    the six seeds (``..._seeds0to5.json``) it keeps the MI AUROC and misses the ratio."""
    import json
    from pathlib import Path

    res = Path(study.__file__).parent / "results/recipe_selection"

    def row_and_ratio(stem):
        doc = json.loads((res / f"{stem}.json").read_text())
        summary = study.summarise(doc["records"])
        assert summary == doc["summary"] and study.choose(summary) == doc["chosen_scale"] == 1.0
        det, x1 = summary[0], next(r for r in summary if r["scale"] == 1.0)
        ratio = sum(x1["shift5"][f] / det["shift5"][f] for f in det["shift5"]) / len(det["shift5"])
        mi = sum(v[1] for v in x1["ood"].values()) / len(x1["ood"])
        return x1, mi, ratio

    x1, mi, ratio = row_and_ratio("laplace_scale_resnet20_seed345")
    assert mi >= 0.90 and ratio <= 0.8 and x1["test"]["ece"] <= 0.02
    x1, mi, ratio = row_and_ratio("laplace_scale_resnet20_seeds0to5")
    assert mi >= 0.90 and ratio > 0.8


@pytest.mark.slow
def test_the_study_runs_end_to_end_and_chooses_on_validation(study, tmp_path):
    """``--quick`` on a (fake) MNIST folder: every point of a seed, the fitted width's
    prior precision on each widened row, and the choice written into the table."""
    import json

    from test_data import write_fake_mnist

    write_fake_mnist(tmp_path, "MNIST", n_train=200, n_test=50)
    argv = ["--arch", "lenet5", "--quick", "--root", str(tmp_path), "--out", str(tmp_path)]
    assert study.main(argv + ["--stem", "q", "--threads", "1"]) == 0
    doc = json.loads((tmp_path / "q.json").read_text())
    points = [r["point"] for r in doc["records"]]
    assert points[:4] == [
        "deterministic",
        "last-layer Laplace (deterministic network)",
        study.RESIDUAL_DET,
        "2DG representative",
    ]
    assert points[-1] == study.RESIDUAL_2DG
    widened = doc["records"][4:-1]
    assert [r["scale"] for r in widened] == list(study.SCALES)
    assert len({json.dumps(r["prior_precision"]) for r in widened}) == 1
    # the residual's prior is the fitted one; it takes no part in the choice
    assert doc["records"][-1]["prior_precision"] == widened[0]["prior_precision"][0]
    assert "scale" not in doc["records"][-1] and "scale" not in doc["records"][2]
    assert doc["chosen_scale"] == study.choose(doc["summary"])
    text = (tmp_path / "q.md").read_text()
    assert "Chosen on validation" in text and "+ GP residual" in text


def test_the_feature_residual_meets_issue_43s_uncertainty_targets_on_six_seeds(study):
    """``laplace_residual_resnet20_seeds0to5.json``: the 2DG BNN's Laplace last layer with
    the distance-aware feature residual keeps accuracy, NLL and ECE, and meets the OOD
    AUROC (>= last-layer Laplace's), MI AUROC (>= 0.90) and severity-5 ratio (<= 0.8)
    that the fitted width missed; the deterministic network's Laplace with the same
    residual is below it on every one of them; the widths' rows are the committed ones."""
    import json
    from pathlib import Path

    res = Path(study.__file__).parent / "results/recipe_selection"
    doc = json.loads((res / "laplace_residual_resnet20_seeds0to5.json").read_text())
    summary = study.summarise(doc["records"])
    assert summary == doc["summary"] and study.choose(summary) == doc["chosen_scale"] == 1.0
    by = {r["point"]: r for r in summary}
    det, lap = by["deterministic"], by["last-layer Laplace (deterministic network)"]

    def scores(r):
        ood = sum(v[0] for v in r["ood"].values()) / len(r["ood"])
        mi = sum(v[1] for v in r["ood"].values()) / len(r["ood"])
        ratio = sum(r["shift5"][f] / det["shift5"][f] for f in det["shift5"]) / len(det["shift5"])
        return r["test"], ood, mi, ratio

    test, ood, mi, ratio = scores(by[study.RESIDUAL_2DG])
    assert test["accuracy"] >= det["test"]["accuracy"] - 0.005 and test["nll"] <= det["test"]["nll"]
    assert test["ece"] <= 0.02 and ood >= scores(lap)[1] and mi >= 0.90 and ratio <= 0.8
    d_test, d_ood, d_mi, d_ratio = scores(by[study.RESIDUAL_DET])
    assert d_test["accuracy"] < test["accuracy"] and d_test["nll"] > test["nll"]
    assert d_ood < ood and d_mi < mi and d_ratio > ratio
    old = json.loads((res / "laplace_scale_resnet20_seeds0to5.json").read_text())["records"]
    new = [r for r in doc["records"] if r["point"] not in (study.RESIDUAL_DET, study.RESIDUAL_2DG)]
    keys = ("point", "seed", "val", "test", "ood", "shift5")
    assert [{k: r[k] for k in keys} for r in new] == [{k: r[k] for k in keys} for r in old]
