"""The committed reference posterior (``python experiments/reference_posterior.py``,
issue 32) scores every method of the issue against NUTS, on the test images, the OOD sets
and the corruptions, and its checks follow from its own numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[1] / "experiments" / "results"
METHODS = {"deterministic", "mean_field", "rank1", "ssvi", "ensemble", "laplace", "mcmc"}
METHODS |= {f"2dg ({t})" for t in ("representative", "stochastic", "tied")}
#: ``--von`` (issue 43): mean-field and 2DG with a natural-gradient stage 1 beside them
VON = {"mean_field, VON", "2dg (representative), VON"}


@pytest.fixture(scope="module", params=["reference_posterior", "reference_posterior_von"])
def committed(request):
    path = RESULTS / f"{request.param}.json"
    if not path.exists():
        pytest.skip(f"{path.name} is not committed")
    return json.loads(path.read_text())


def test_every_method_is_scored_on_every_input_set(committed):
    assert not committed["quick"]
    rows = {r["method"]: r for r in committed["rows"]}
    assert set(rows) == (METHODS | VON if committed["stem"].endswith("_von") else METHODS)
    sets = set(rows["mcmc"]["sets"])
    assert "test" in sets and any(s.startswith("ood:") for s in sets)
    assert any(s.startswith("shift:") for s in sets)
    for name, row in rows.items():
        assert set(row["sets"]) == sets, name
        for s, f in row["sets"].items():
            assert 0.0 <= f["agreement"] <= 1.0 and 0.0 <= f["tv"] <= 1.0, (name, s)
    # HMC against itself: the scores' fixed point
    assert all(f["agreement"] == 1.0 and f["tv"] == 0.0 for f in rows["mcmc"]["sets"].values())


def test_the_checks_follow_from_the_numbers(committed):
    rows = {r["method"]: r for r in committed["rows"]}
    checks = committed["checks"]
    pred = committed["mcmc"]["predictive"]
    assert checks["predictive max R-hat <= 1.01"]["value"] == pred["max_rhat"]
    assert checks["predictive max R-hat <= 1.01"]["met"] == (pred["max_rhat"] <= 1.01)
    assert checks["predictive min bulk ESS >= 400"]["met"] == (pred["min_ess_bulk"] >= 400)
    share = committed["mcmc"]["sampler"]["divergence_share"]
    assert checks["divergences < 1 %"]["met"] == (share < 0.01)
    hmc, det = rows["mcmc"]["nll"], rows["deterministic"]["nll"]
    assert checks["HMC NLL < deterministic NLL (clean test)"]["met"] == (hmc < det)
    mf = rows["mean_field"]["sets"]["test"]["agreement"]
    for t in ("representative", "stochastic", "tied"):
        a = rows[f"2dg ({t})"]["sets"]["test"]["agreement"]
        assert checks[f"2dg ({t}) agreement >= mean-field"]["met"] == (a >= mf), t
    assert checks["whole run <= 30 min"]["met"] == (committed["seconds"] <= 1800)
    if committed["stem"].endswith("_von"):
        a, b = (rows[k]["sets"]["test"]["agreement"] for k in sorted(VON))
        name = "2dg (representative), VON agreement >= mean-field, VON"
        assert checks[name]["met"] == (a >= b)
