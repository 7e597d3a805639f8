"""The uncertainty columns of a run (``[uncertainty] enabled``) and of ``twodg-pyro
evaluate --uncertainty``: every method gets them, and a saved model file reproduces its
run's numbers."""

from __future__ import annotations

import json
import math

import pytest
import torch

from twodg_pyro.cli import main as cli_main
from twodg_pyro.pipeline import config_from_dict, run
from twodg_pyro.pipeline.settings.config import ConfigError

SETTINGS = {
    "methods": ["deterministic", "mean_field", "2dg", "ensemble"],
    "seed": 0,
    "num_samples": 4,
    "progress": False,
    "network": {"hidden": [16]},
    "stage1": {"epochs": 3, "deterministic_epochs": 3},
    "sharing": {"outlier_rule": "quantile", "mu_quantile": 0.99, "n_components": 8, "n_min": 5},
    "stage3": {"epochs": 2},
    "ensemble": {"members": 2},
    "diagnostics": {"enabled": False},
    "uncertainty": {
        "enabled": True,
        "ood_sets": ["uniform_noise", "gaussian_blobs"],
        "ood_size": 100,
        "corruptions": ["gaussian_noise", "contrast"],
        "shift_size": 120,
    },
}


@pytest.fixture(scope="module")
def uq_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("uq")
    art = run(config_from_dict(SETTINGS), out)
    return art, out


def test_every_method_gets_the_uncertainty_fields(uq_run):
    art, out = uq_run
    by = {r["method"]: r for r in art.records}
    assert set(by) == {"deterministic", "mean_field", "2dg", "ensemble"}
    for method, r in by.items():
        assert set(r["ood"]) == {"uniform_noise", "gaussian_blobs"}
        for m in r["ood"].values():
            assert 0.0 <= m["entropy_auroc"] <= 1.0 and 0.0 <= m["fpr95"] <= 1.0
            assert ("mi_auroc" in m) == (method != "deterministic")
        assert set(r["shift"]) == {"gaussian_noise", "contrast"}
        assert set(r["shift"]["contrast"]) == {"1", "2", "3", "4", "5"}
        assert r["aurc"] >= 0
    assert by["deterministic"]["mean_mi_clean"] == 0.0
    assert by["ensemble"]["mean_mi_clean"] > 0.0  # members disagree
    # uniform noise is far from every digit: every method flags it better than chance
    assert all(r["ood"]["uniform_noise"]["entropy_auroc"] > 0.6 for r in by.values())
    # contrast at severity 5 hurts the deterministic network's accuracy
    shift = by["deterministic"]["shift"]["contrast"]
    assert shift["5"]["accuracy"] < shift["1"]["accuracy"]
    table = (out / "results.md").read_text()
    assert "AUROC uniform_noise" in table and "| ensemble |" in table.split("Uncertainty")[1]
    saved = json.loads((out / "results.json").read_text())
    rows = saved["records"] if isinstance(saved, dict) else saved
    assert all("ood" in r for r in rows)


def test_the_mean_field_record_carries_the_scales_trajectory(uq_run):
    art, _ = uq_run
    mf = next(r for r in art.records if r["method"] == "mean_field")
    traj = mf["scale_trajectory"]
    assert traj[-1]["epoch"] == 2
    assert {"loss", "kl", "sigma_median", "sigma_median_by_site"} <= set(traj[-1])
    # the convergence record names the site whose median scale moved most
    conv = mf["scale_convergence"]
    sites = [s.name for s in art.trained["mean_field"].guide.sites]
    assert conv["site"] in sites and math.isfinite(conv["site_scale_change"])


@pytest.mark.parametrize("method", ["2dg", "ensemble"])
def test_evaluate_uncertainty_reproduces_the_run(uq_run, method, tmp_path, capsys):
    art, out = uq_run
    rec = next(r for r in art.records if r["method"] == method)
    dest = tmp_path / "eval.json"
    argv = ["evaluate", str(out / f"model_{method}.pt"), "--uncertainty", "--out", str(dest)]
    argv += ["--ood-sets", "uniform_noise", "gaussian_blobs", "--ood-size", "100"]
    argv += ["--shift-size", "120"]
    assert cli_main(argv) == 0
    got = json.loads(dest.read_text())["uncertainty"]
    for name, metrics in rec["ood"].items():
        assert got["ood"][name] == pytest.approx(metrics)
    assert got["mean_mi_clean"] == pytest.approx(rec["mean_mi_clean"])
    for severity, metrics in rec["shift"]["contrast"].items():
        assert got["shift"]["contrast"][severity] == pytest.approx(metrics)


def test_bad_uncertainty_settings_are_named():
    with pytest.raises(ConfigError, match="uncertainty.corruptions"):
        config_from_dict({"uncertainty": {"corruptions": ["fog"]}})
    with pytest.raises(ConfigError, match="uncertainty.folder_root"):
        config_from_dict({"uncertainty": {"folder_sets": ["kmnist"]}})
    with pytest.raises(ConfigError, match="uncertainty.ood_size"):
        config_from_dict({"uncertainty": {"ood_size": 0}})


def test_float64_end_to_end_with_the_baselines():
    """A float64 network through the baselines and the uncertainty step (dtype bugs)."""
    settings = {
        **SETTINGS,
        "methods": ["deterministic", "ensemble", "laplace", "deterministic_matched"],
        "network": {"hidden": [16], "dtype": "float64"},
        "laplace": {"marglik_steps": 5},
    }
    art = run(config_from_dict(settings))
    for r in art.records:
        values = [m["entropy_auroc"] for m in r["ood"].values()]
        values += [s["nll"] for fam in r["shift"].values() for s in fam.values()]
        assert all(v == v and abs(v) < float("inf") for v in values), r["method"]
    ens = next(r for r in art.records if r["method"] == "ensemble")
    assert ens["mean_mi_clean"] > 0
    net = art.trained["laplace"].net
    assert next(net.parameters()).dtype == torch.float64


def test_diagnostics_report_the_mutual_information_and_the_scales():
    """diagnostics.json's ``posterior_uncertainty``: MI of the exported draws (0 when the
    draws agree, log 2 for two draws sure of different classes) and the scales."""
    import math

    from twodg_pyro.diagnostics._arviz import build_tree
    from twodg_pyro.pipeline.outputs.diagnostics_steps import posterior_uncertainty

    def idata(draws):  # an InferenceData on ArviZ 0.x, a DataTree on 1.x
        probs = {"class_probs": torch.tensor(draws)[None].numpy()}
        return build_tree({"posterior_predictive": probs}, {"posterior_predictive"}, {}, {}, {})

    same = [[[0.7, 0.3]], [[0.7, 0.3]]]
    apart = [[[1.0, 0.0]], [[0.0, 1.0]]]
    assert posterior_uncertainty(None, idata(same))["mean_mutual_information"] == pytest.approx(
        0.0, abs=1e-9
    )
    got = posterior_uncertainty(None, idata(apart))["mean_mutual_information"]
    assert got == pytest.approx(math.log(2), rel=1e-6)

    class Guide:
        def means_and_scales(self):
            return torch.tensor([-1.0, 1.0, -1.0, 1.0]), torch.tensor([0.1, 0.2, 0.3, 0.4])

    scales = posterior_uncertainty(Guide(), idata(same))
    assert scales["sigma_median"] == pytest.approx(0.2)  # torch's lower median
    assert scales["sigma_over_spread"] == pytest.approx(0.2 / torch.tensor([-1.0, 1] * 2).std())
