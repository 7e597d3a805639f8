"""Algorithm 1 end to end on the bundled digits, and the refinement hooks mid-training."""

import json

import pytest
import torch

from twodg_pyro.cli import main
from twodg_pyro.data import make_loader
from twodg_pyro.guides import SharedGMMGuide
from twodg_pyro.infer import fit
from twodg_pyro.sharing import MahalanobisHook, MergeHook


def test_pipeline_on_digits_compresses_and_stays_accurate(tmp_path):
    out = tmp_path / "run"
    # the main job's table; its diagnostics are the same code as tests/test_diagnostics.py's
    args = ["run", "--out", str(out), "--no-progress", "--no-diagnostics"]
    args += ["--methods", "mean_field", "2dg"]
    assert main(args) == 0
    payload = json.loads((out / "results.json").read_text())
    rec = {r["method"]: r for r in payload["records"]}
    mf, dg = rec["mean_field"], rec["2dg"]
    assert dg["accuracy"] >= 0.90
    assert mf["trainable_params"] / dg["trainable_params"] >= 20
    for key in (
        "n_outliers",
        "n_ellipses",
        "n_gaussians",
        "trainable_params",
        "compression_ratio",
        "size_mb",
        "size_mb_with_index",
    ):
        assert key in dg
    assert dg["size_mb_with_index"] > dg["size_mb"] > 0
    assert (out / "results.md").read_text().startswith("| method")


def test_merge_hook_mid_training_leaves_a_consistent_trainable_guide(
    trained_mean_field, stage2_structure, digits
):
    model, _ = trained_mean_field
    loader = make_loader(digits.train, 128, shuffle=True, seed=0)
    guide = SharedGMMGuide(model, stage2_structure, "stochastic")
    k0 = guide.n_components
    # a W2 threshold that certainly merges some pairs, fired at epoch 2
    merge = MergeHook(tau_d=0.3, rule="moment", every=2, until_fixed_point=False)
    reassign = MahalanobisHook(every=3)
    state = fit(
        model, guide, loader, epochs=4, lr=1e-2, callbacks=[merge, reassign], progress=False
    )
    assert merge.log[0]["epoch"] == 2 and guide.n_components < k0
    s = guide.structure()  # validates: every weight exactly once, comps in range
    assert s.n_gaussians == guide.n_components
    n_k = guide.component_counts()
    assert n_k.sum().item() == pytest.approx(s.n_inliers, rel=1e-5)
    torch.testing.assert_close(
        torch.linalg.eigvalsh(guide.covariances()).min() > 0, torch.tensor(True)
    )
    # the optimiser holds exactly the guide's current parameters, and training goes on
    opt_params = {id(p) for g in state.optimizer.param_groups for p in g["params"]}
    assert opt_params == {id(p) for p in guide.parameters()}
    before = guide.centre_mu.detach().clone()
    fit(model, guide, loader, epochs=5, state=state, progress=False)
    assert not torch.equal(before, guide.centre_mu.detach())
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in state.history)
