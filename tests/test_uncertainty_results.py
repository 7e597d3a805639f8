"""The committed uncertainty results (``python experiments/uncertainty.py``) hold the
fields issue 21 names, and their summary and targets follow from their records."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results" / "uncertainty.json"


def _script():
    spec = importlib.util.spec_from_file_location("uq", ROOT / "experiments" / "uncertainty.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def committed():
    return json.loads(RESULTS.read_text())


def _mean_ood(row: dict) -> float:
    """A record's or summary row's mean entropy AUROC over its OOD sets."""
    return sum(v["entropy_auroc"] for v in row["ood"].values()) / len(row["ood"])


def test_every_record_has_the_issue_fields(committed):
    fields = {"recipe", "method", "arch", "seed", "accuracy", "nll", "ece"}
    fields |= {"trainable_params", "stored_params", "ood", "shift", "mean_mi_clean"}
    sets, families = committed["evaluation"]["ood_sets"], committed["evaluation"]["shift"]
    for r in committed["records"]:
        assert fields <= set(r), r["method"]
        assert set(r["ood"]) == set(sets)
        for m in r["ood"].values():
            assert {"entropy_auroc", "aupr", "fpr95"} <= set(m)
        assert set(r["shift"]) == set(families)
        assert all(set(r["shift"][f]) == {"1", "2", "3", "4", "5"} for f in families)
        bayesian = not r["method"].startswith("deterministic")
        assert all(("mi_auroc" in m) == bayesian for m in r["ood"].values()), r["method"]
    recommended = {r["recipe"] for r in committed["records"] if r.get("recommended")}
    assert recommended == {"KL weight 0.1"}
    assert sorted({r["seed"] for r in committed["records"]}) == [0, 1, 2]


#: every committed table of the script: the first recipe, the one recipe on both networks
#: (LeNet-5's with its stage 1 at 50 epochs, and at the preset's 150)
TABLES = [
    "uncertainty",
    "uncertainty_one_recipe",
    "uncertainty_lenet5_bayes",
    "uncertainty_resnet20",
]


@pytest.mark.parametrize("stem", TABLES)
def test_summary_and_targets_follow_from_the_records(stem):
    path = RESULTS.with_name(f"{stem}.json")
    if not path.exists():
        pytest.skip(f"{path.name} is not committed")
    payload = json.loads(path.read_text())
    uq = _script()
    summary = uq.summarise(payload["records"])
    assert json.loads(json.dumps(summary)) == payload["summary"]
    targets = uq.targets(summary, payload.get("arch", "lenet5"))
    assert json.loads(json.dumps(targets)) == payload["targets"]


#: the natural-gradient tables (issue 43), merged from the per-run files they name
NATURAL_GRADIENT_TABLES = [
    "uncertainty_lenet5_von",
    "uncertainty_lenet5_von_laplace",
    "uncertainty_resnet20_von",
    "uncertainty_resnet20_von_laplace",
    "uncertainty_resnet20_von_body",
    "uncertainty_resnet20_von_body_seed345",
    "uncertainty_resnet20_von_body_seeds0to5",
    "uncertainty_lenet5_residual",
    "uncertainty_resnet20_residual",
]


@pytest.mark.parametrize("stem", NATURAL_GRADIENT_TABLES)
def test_natural_gradient_rows_are_checked_against_the_deterministic_laplace(stem):
    """Issue 43's targets, the mean entropy AUROC of each natural-gradient 2DG row at least
    that of the deterministic network's last-layer Laplace (against that row's mean) and
    its ECE at most 0.02, are checked on those rows (and not on the recommended recipe's
    own); the summary and targets follow from the records."""
    payload = json.loads(RESULTS.with_name(f"{stem}.json").read_text())
    uq = _script()
    summary = uq.summarise(payload["records"])
    assert json.loads(json.dumps(summary)) == payload["summary"]
    targets = uq.targets(summary, payload.get("arch", "lenet5"))
    assert json.loads(json.dumps(targets)) == payload["targets"]
    lap = next(r for r in summary if r["recommended"] and r["method"] == "laplace")
    goal = _mean_ood(lap)
    key = "mean entropy AUROC >= last-layer Laplace"
    checked = [label for label, t in targets.items() if key in t]
    assert checked and all(label.startswith("natural gradient: 2dg") for label in checked)
    for label in checked:
        assert targets[label][key]["target"] == f">= {goal:.3f}"
        ece = next(r["ece"] for r in summary if f"{r['recipe']}: {r['method']}" == label)
        assert targets[label]["ece <= 0.02"] == {
            "value": ece,
            "target": "<= 0.02",
            "met": ece <= 0.02,
        }
    assert all("ece <= 0.02" not in t for label, t in targets.items() if label not in checked)
    assert f"- {key}: " in RESULTS.with_name(f"{stem}.md").read_text()


def test_the_paper_recipe_carries_no_uncertainty_and_the_recommended_one_does(committed):
    """What the README says of the two recipes, checked on the committed means."""
    by = {(r["recipe"], r["method"]): r for r in committed["summary"]}
    paper = by[("paper recipe", "2dg (representative)")]
    rec = by[("KL weight 0.1", "2dg (representative)")]
    det = by[("KL weight 0.1", "deterministic")]
    assert paper["mean_mi_clean"] < 0.005 < 0.02 <= rec["mean_mi_clean"]
    for s in det["ood"]:
        assert rec["ood"][s]["entropy_auroc"] >= det["ood"][s]["entropy_auroc"] - 0.01, s
    assert rec["accuracy"] >= det["accuracy"] - 0.005 and rec["nll"] <= det["nll"]


@pytest.mark.parametrize("stem", TABLES[1:])
def test_the_one_recipe_tables_run_rank1_under_one_factor_prior(stem):
    """Rank-1's factor prior is N(1, 0.1^2) in every record of the one-recipe tables (a
    record of the earlier N(1, 1) states no ``prior_scale``), and the tables' commands
    read back as a shell reads them."""
    import shlex

    path = RESULTS.with_name(f"{stem}.json")
    payload = json.loads(path.read_text())
    rank1 = [r for r in payload["records"] if r["method"] == "rank1"]
    assert rank1 and all(r.get("prior_scale") == 0.1 for r in rank1)
    text = path.with_suffix(".md").read_text()
    command = text.split("Command: `", 1)[1].split("`", 1)[0]
    assert shlex.split(command)[:2] == ["python", "experiments/uncertainty.py"]


def test_the_150_epoch_stage1_keeps_issue_43s_lenet5_targets():
    """The LeNet-5 table of the preset's 150-epoch stage 1 came from it (the mean-field
    records' last epoch) and keeps issue 43's LeNet-5 targets against the 50-epoch table:
    the representative 2DG's NLL at most that table's 0.117 and its mean entropy AUROC at
    least the ensemble's of the same run."""
    new, old = (
        json.loads(RESULTS.with_name(f"{stem}.json").read_text())
        for stem in ("uncertainty_lenet5_bayes", "uncertainty_one_recipe")
    )
    stage1 = [r for r in new["records"] if r["method"] == "mean_field"]
    assert len(stage1) == 3 and all(r["scale_trajectory"][-1]["epoch"] == 149 for r in stage1)

    def by_method(payload):
        return {s["method"]: s for s in payload["summary"]}

    rep, ens = by_method(new)["2dg (representative)"], by_method(new)["ensemble"]
    assert rep["nll"] <= by_method(old)["2dg (representative)"]["nll"] <= 0.117 + 5e-4
    check = new["targets"]["2dg (representative)"]["mean entropy AUROC >= ensemble"]
    assert check["met"] and check["value"] >= 0.942
    assert rep["accuracy"] >= ens["accuracy"] - 0.005


def test_a_laplace_last_layer_under_the_body_draws_does_not_help_resnet20():
    """What docs/uncertainty.md says of the two body-draw rows (body_laplace.py) on the
    committed three seeds: refitted under the body's draws, the last layer detects less
    than around the mean network (mean and two seeds of three) at a prior precision
    larger on every seed; drawing the body under the mean network's Laplace costs NLL
    above the deterministic network's and an ECE above 0.02."""
    payload = json.loads(RESULTS.with_name("uncertainty_resnet20_von_body.json").read_text())
    by = {(r["method"], r["seed"]): r for r in payload["records"]}
    rows = {s["method"]: s for s in payload["summary"]}
    base = "2dg (representative) + laplace"
    mean_network, body, under = base, f"{base}, body draws", f"{base}, under body draws"

    def ood(method, seed=None):
        rs = [by[(method, s)] for s in (0, 1, 2)] if seed is None else [by[(method, seed)]]
        return sum(v["entropy_auroc"] for r in rs for v in r["ood"].values()) / (6 * len(rs))

    assert ood(under) < ood(mean_network) - 0.01
    assert sum(ood(under, s) < ood(mean_network, s) for s in (0, 1, 2)) == 2
    for s in (0, 1, 2):
        assert by[(under, s)]["prior_precision"][0] > by[(mean_network, s)]["prior_precision"][0]
        assert by[(body, s)]["prior_precision"] == by[(mean_network, s)]["prior_precision"]
    assert rows[body]["nll"] > rows["deterministic"]["nll"] and rows[body]["ece"] > 0.02
    assert rows[under]["nll"] <= rows["deterministic"]["nll"]
    # the row around the mean network meets the OOD target in this run; its shift ratio not
    checks = payload["targets"][f"natural gradient: {mean_network}"]
    assert checks["mean entropy AUROC >= last-layer Laplace"]["met"]
    assert not checks["mean severity-5 NLL ratio <= 0.8"]["met"]


def test_on_lenet5_the_body_draw_rows_cost_nll_and_detect_no_better():
    """docs/uncertainty.md's LeNet-5 sentence on the two body-draw rows (three seeds)."""
    payload = json.loads(RESULTS.with_name("uncertainty_lenet5_von2dgbody.json").read_text())
    rows = {s["method"]: s for s in payload["summary"]}
    lap = "2dg (representative) + laplace"

    for tag in ("body draws", "under body draws"):
        row = rows[f"{lap}, {tag}"]
        assert row["seeds"] == 3 and row["nll"] > rows[lap]["nll"] + 0.015
        assert _mean_ood(row) < _mean_ood(rows[lap])


def test_six_resnet20_seeds_confirm_the_body_draw_rows_and_the_2dg_laplace_misses():
    """docs/uncertainty.md's six-seed table: both body-draw rows below the body at its
    means on four seeds of six and on the mean; the 2DG + Laplace row meets the OOD
    target and misses the MI AUROC and the severity-5 ratio."""
    payload = json.loads(
        RESULTS.with_name("uncertainty_resnet20_von_body_seeds0to5.json").read_text()
    )
    assert payload["seeds"] == [0, 1, 2, 3, 4, 5]
    by = {(r["method"], r["seed"]): r for r in payload["records"]}
    lap = "2dg (representative) + laplace"

    def ood(method, seed):
        return _mean_ood(by[(method, seed)])

    for tag in ("body draws", "under body draws"):
        diffs = [ood(f"{lap}, {tag}", s) - ood(lap, s) for s in range(6)]
        assert sum(d < 0 for d in diffs) == 4 and sum(diffs) < 0
    checks = payload["targets"][f"natural gradient: {lap}"]
    assert checks["mean entropy AUROC >= last-layer Laplace"]["met"]
    assert checks["nll <= det"]["met"]
    assert not checks["mean MI AUROC >= 0.90"]["met"]
    assert not checks["mean severity-5 NLL ratio <= 0.8"]["met"]


@pytest.mark.parametrize(
    "stem, seeds",
    [("uncertainty_resnet20_laplace_all_seed0", 1), ("uncertainty_lenet5_laplace_all", 3)],
)
def test_laplace_over_all_layers_is_worse_than_the_network_it_is_fitted_to(stem, seeds):
    """docs/uncertainty.md's "Laplace over every layer": on both networks the all-layer
    Kronecker Laplace loses accuracy, NLL, calibration and OOD detection to the
    deterministic network itself, and covers every layer (more stored values than twice
    the network's); each record names its environment."""
    payload = json.loads(RESULTS.with_name(f"{stem}.json").read_text())
    rows = {s["method"]: s for s in payload["summary"]}
    det, lap = rows["deterministic"], rows["laplace"]

    assert lap["seeds"] == det["seeds"] == seeds
    assert lap["accuracy"] < det["accuracy"] - 0.01 and lap["nll"] > 2 * det["nll"]
    assert lap["ece"] > 0.2 and _mean_ood(lap) < _mean_ood(det)
    assert lap["stored_params"] > 2 * det["stored_params"]
    assert all(r["environment"]["threads"] == 1 for r in payload["records"])


RESIDUAL = "2dg (representative) + laplace + GP residual"


def _residual_table(stem: str, width: int, size: int, forwards: tuple[int, int]) -> dict:
    """The committed table ``stem`` of the residual row, after checking on each of its
    three seeds that the row's file holds the 3,600 x ``width`` training features (at
    ``size`` bytes each) more than ``2dg + laplace``'s and that a prediction costs
    ``forwards`` passes (``2dg + laplace``'s, the row's)."""
    payload = json.loads(RESULTS.with_name(f"{stem}.json").read_text())
    assert payload["seeds"] == [0, 1, 2]
    by = {(r["method"], r["seed"]): r for r in payload["records"]}
    for s in (0, 1, 2):
        a, b = by[("2dg (representative) + laplace", s)], by[(RESIDUAL, s)]
        assert 0 < b["file_bytes"] - a["file_bytes"] - 3600 * width * size < 1000
        assert (a["forwards_per_prediction"], b["forwards_per_prediction"]) == forwards
    return payload


def test_on_lenet5_the_gp_residual_changes_nothing_but_the_file():
    """docs/uncertainty.md's LeNet-5 sentence on the residual row beside the ensemble (one
    command a seed, three seeds): the same last layer and draws with the residual score
    within 0.005 of it on accuracy, NLL and OOD AUROC, its file holds the 3,600 x 84
    float16 training features more, a prediction is one forward pass as without them (the
    table was rerun after both changes); the row misses the ensemble's mean OOD AUROC, and
    the SVI recipe's 2DG BNN meets it."""
    payload = _residual_table("uncertainty_lenet5_residual", 84, 2, (1, 1))
    lap, resid = "2dg (representative) + laplace", RESIDUAL
    rows = {(r["recipe"], r["method"]): r for r in payload["summary"]}

    a, b = rows[("natural gradient", lap)], rows[("natural gradient", resid)]
    for k in ("accuracy", "nll"):
        assert abs(a[k] - b[k]) < 0.005
    assert abs(_mean_ood(a) - _mean_ood(b)) < 0.005
    ens = _mean_ood(rows[("KL weight 0.1", "ensemble")])
    assert _mean_ood(b) < ens < _mean_ood(rows[("KL weight 0.1", "2dg (representative)")])
    checks = payload["targets"][f"natural gradient: {resid}"]
    assert not checks["mean entropy AUROC >= ensemble"]["met"]


def test_on_resnet20_the_gp_residual_meets_issue_43s_2dg_targets_beside_the_ensemble():
    """docs/uncertainty.md's ResNet-20 table of the residual row beside the deterministic
    network, the ensemble and the SVI recipe (one command a seed, three seeds): the row
    meets every 2DG target of issue 43 but the moonshot (the ensemble's OOD AUROC) and
    stage 1's convergence; its file holds the 3,600 x 64 float32 training features more
    (run before the .2dgz stored them at float16, and before a last-layer prediction took
    one forward pass: 31 counted); the SVI recipe's 2DG BNN has an NLL above the
    deterministic network's."""
    payload = _residual_table("uncertainty_resnet20_residual", 64, 4, (30, 31))
    assert payload["arch"] == "resnet20"
    checks = payload["targets"][f"natural gradient: {RESIDUAL}"]
    for key in (
        "accuracy >= det - 0.005",
        "nll <= det",
        "ece <= 0.02",
        "mean entropy AUROC >= last-layer Laplace",
        "mean MI AUROC >= 0.90",
        "mean severity-5 NLL ratio <= 0.8",
        "trainable: mean-field / 2DG >= 20",
    ):
        assert checks[key]["met"], key
    assert not checks["mean entropy AUROC >= ensemble"]["met"]
    assert not checks["stage 1 converged: median scale change over the last 10 % < 2 %"]["met"]
    rows = {(r["recipe"], r["method"]): r for r in payload["summary"]}
    assert (
        rows[("one recipe", "2dg (representative)")]["nll"]
        > rows[("one recipe", "deterministic")]["nll"]
    )


def test_the_resnet20_residual_rows_rerun_at_one_forward_pass_with_float16_features():
    """docs/uncertainty.md's rerun of the ResNet-20 natural-gradient rows: every score of
    every seed repeats the residual table's to the bit; the Laplace rows are one forward
    pass a prediction (30 and 31 counted before); the residual row's file holds the
    3,600 x 64 training features at float16."""
    payload = _residual_table("uncertainty_resnet20_residual_cost", 64, 2, (1, 1))
    first = json.loads(RESULTS.with_name("uncertainty_resnet20_residual.json").read_text())
    before = {
        (r["method"], r["seed"]): r for r in first["records"] if r["recipe"] == "natural gradient"
    }
    assert len(payload["records"]) == 15
    for r in payload["records"]:
        a = before[(r["method"], r["seed"])]
        scores = ("accuracy", "nll", "ece", "aurc", "mean_mi_clean", "ood", "shift")
        assert all(r[k] == a[k] for k in scores + ("temperature_scaled",)), r["method"]
        laplace = "laplace" in r["method"]
        assert r["forwards_per_prediction"] == (1 if laplace else 30)
        assert (r["file_bytes"] < a["file_bytes"]) == r["method"].endswith("residual")


def test_the_settled_recipe_is_judged_against_the_baselines_it_trains():
    """``natural gradient, settled`` (and ``settled 120``) trains its own deterministic
    network and Laplace: its 2DG rows are judged against them, not the recommended
    recipe's (another run's networks), and it runs on ResNet-20 only (a LeNet-5 run
    refuses it by name)."""
    uq = _script()
    sets, fams = ("a", "b"), ("noise",)

    def row(recipe, method, acc, nll, auroc, shift):
        ood = {s: {"entropy_auroc": auroc, "mi_auroc": auroc} for s in sets}
        return {
            "recipe": recipe,
            "method": method,
            "recommended": recipe == uq.RECOMMENDED,
            "accuracy": acc,
            "nll": nll,
            "ece": 0.01,
            "ood": ood,
            "mean_mi_clean": 0.03,
            "shift5": {f: {"nll": shift} for f in fams},
            "trainable_params": 100,
        }

    summary = [
        row(uq.RECOMMENDED, "deterministic", 0.99, 0.05, 0.80, 2.0),
        row(uq.RECOMMENDED, "laplace", 0.99, 0.05, 0.95, 2.0),
        row(uq.SETTLED, "deterministic", 0.95, 0.20, 0.70, 2.0),
        row(uq.SETTLED, "laplace", 0.95, 0.15, 0.90, 1.8),
        row(uq.SETTLED, "2dg (representative)", 0.96, 0.10, 0.92, 1.5),
    ]
    t = uq.targets(summary, "resnet20")[f"{uq.SETTLED}: 2dg (representative)"]
    assert t["accuracy >= det - 0.005"]["met"] and t["nll <= det"]["met"]  # its own det
    assert t["mean entropy AUROC >= last-layer Laplace"]["target"] == ">= 0.900"
    assert uq.targets(summary[2:], "resnet20")  # no recommended recipe needed
    for name, n in ((uq.SETTLED, 80), (uq.SETTLED_120, 120)):
        assert name in uq.RESNET_RECIPES and name not in uq.RECIPES
        for arch, stage1 in (("resnet20", 20), ("resnet20-full", None)):  # CPU, paper epochs
            plain = uq.recipe_settings(uq.NATURAL_GRADIENT, "data", 0, arch=arch)[0]["stage1"]
            mine = uq.recipe_settings(name, "data", 0, arch=arch)[0]["stage1"]
            assert stage1 in (None, plain["epochs"])
            assert mine["epochs"] == plain["epochs"] + n and mine["von_settle_epochs"] == n
        with pytest.raises(SystemExit):
            uq.main(["--recipes", name, "--root", "/nonexistent"])


def test_one_rule_chooses_the_laplace_last_layer_on_validation_for_both_networks():
    """docs/uncertainty.md's "One rule for both networks": the head chosen per seed on
    the validation split's OOD sets is the Laplace last layer on every ResNet-20 seed and
    on LeNet-5's seed 2 only; the test images agree with five of the six choices; on
    LeNet-5 the chosen row keeps the NLL target and ties the ensemble's OOD AUROC (missed
    by less than 1e-4), on ResNet-20 it keeps accuracy, NLL and ECE and misses the
    Laplace's OOD AUROC; the validation NLL rises with the Laplace last layer on every
    ResNet-20 seed (so it could not be the rule)."""
    plain = "2dg (representative)"
    lap, chosen = f"{plain} + laplace", f"{plain}, head chosen on validation"
    payloads = {
        arch: json.loads(RESULTS.with_name(f"uncertainty_{arch}_rule.json").read_text())
        for arch in ("lenet5", "resnet20")
    }

    agree = 0
    for arch, payload in payloads.items():
        by = {(r["method"], r["seed"]): r for r in payload["records"]}
        picks = [by[(chosen, s)]["chosen"] for s in (0, 1, 2)]
        assert picks == ([plain, plain, lap] if arch == "lenet5" else [lap] * 3)
        for s in (0, 1, 2):
            val = {m: by[(m, s)]["validation"]["mean_ood_entropy_auroc"] for m in (plain, lap)}
            assert by[(chosen, s)]["chosen"] == max(val, key=lambda m: (val[m], m == plain))
            assert by[(chosen, s)]["nll"] == by[(picks[s], s)]["nll"]
            agree += (_mean_ood(by[(lap, s)]) > _mean_ood(by[(plain, s)])) == (picks[s] == lap)
            if arch == "resnet20":
                assert by[(lap, s)]["validation"]["nll"] > by[(plain, s)]["validation"]["nll"]
    assert agree == 5
    rows = {s["method"]: s for s in payloads["lenet5"]["summary"]}
    t = payloads["lenet5"]["targets"][f"natural gradient: {chosen}"]
    assert rows[chosen]["nll"] <= 0.117 and t["nll <= det"]["met"]
    gap = _mean_ood(rows["ensemble"]) - _mean_ood(rows[chosen])
    assert not t["mean entropy AUROC >= ensemble"]["met"] and 0 < gap < 1e-4
    assert _mean_ood(rows[chosen]) > max(_mean_ood(rows[plain]), _mean_ood(rows[lap]))
    t = payloads["resnet20"]["targets"][f"natural gradient: {chosen}"]
    assert all(t[k]["met"] for k in ("accuracy >= det - 0.005", "nll <= det", "ece <= 0.02"))
    assert not t["mean entropy AUROC >= last-layer Laplace"]["met"]
    assert not t["mean severity-5 NLL ratio <= 0.8"]["met"]


def test_three_held_out_lenet5_seeds_make_the_rule_miss_the_ensemble():
    """docs/uncertainty.md's held-out LeNet-5 seeds: the rule keeps the plain BNN on seeds
    3-5, and over the six seeds the chosen row's OOD AUROC misses the ensemble's by about
    0.002 while its NLL keeps the target; the six-seed file merges the two runs' records."""
    chosen = "2dg (representative), head chosen on validation"
    held, six = (
        json.loads(RESULTS.with_name(f"uncertainty_lenet5_rule_{stem}.json").read_text())
        for stem in ("seed345", "seeds0to5")
    )
    assert [r["chosen"] for r in held["records"] if r["method"] == chosen] == [
        "2dg (representative)"
    ] * 3
    assert six["seeds"] == [0, 1, 2, 3, 4, 5]
    rows = {s["method"]: s for s in six["summary"]}

    assert 0.0015 < _mean_ood(rows["ensemble"]) - _mean_ood(rows[chosen]) < 0.003
    assert rows[chosen]["nll"] <= 0.117 and rows[chosen]["seeds"] == 6
    t = six["targets"][f"natural gradient: {chosen}"]
    assert not t["mean entropy AUROC >= ensemble"]["met"] and t["nll <= det"]["met"]


def test_the_von_preset_runs_150_stage1_epochs_because_validation_chose_them():
    """``mnist-lenet5-von``'s 150 stage-1 epochs: on each of three seeds' validation split
    150 epochs of the natural-gradient stage 1 have a lower NLL than 50 (the selection
    files' rule), and the preset runs them."""
    from twodg_pyro.pipeline import config_from_dict
    from twodg_pyro.pipeline.settings.presets import preset

    folder = RESULTS.parent / "recipe_selection"
    for seed in (0, 1, 2):
        payload = json.loads((folder / f"stage1_lenet5_von_longer_seed{seed}.json").read_text())
        nll = {r["point"]: r["nll"] for r in payload["records"]}
        assert nll["von, frozen, x0.3, 150 epochs"] < nll["von, frozen, x0.3, 50 epochs"]
    assert config_from_dict(preset("mnist-lenet5-von")).stage1.epochs == 150


def test_on_the_150_epoch_von_preset_the_rule_meets_the_lenet5_targets():
    """docs/uncertainty.md's "The rule on the 150-epoch preset" (its fused step): on three
    and on six seeds the head chosen on validation keeps the NLL target and detects OOD
    inputs better than the ensemble, stage 1 misses the 2 % rule on one seed by less
    than 0.5 points, and the plain 2DG BNN beats its 50-epoch self on the same six
    seeds."""
    chosen = "2dg (representative), head chosen on validation"
    for stem, seeds in (("merged", 3), ("seeds0to5", 6)):
        payload = json.loads(
            RESULTS.with_name(f"uncertainty_lenet5_von150_rule_{stem}.json").read_text()
        )
        assert payload["seeds"] == list(range(seeds))
        t = payload["targets"][f"natural gradient: {chosen}"]
        assert t["nll <= det"]["met"] and t["nll <= det"]["value"] <= 0.117
        assert t["mean entropy AUROC >= ensemble"]["met"]
        rule = t["stage 1 converged: median scale change over the last 10 % < 2 %"]
        assert not rule["met"] and rule["value"] < 0.025
    picks = [r["chosen"] for r in payload["records"] if r["method"] == chosen]
    assert picks.count("2dg (representative)") == 6
    old = json.loads(RESULTS.with_name("uncertainty_lenet5_rule_seeds0to5.json").read_text())

    def row(p, method="2dg (representative)"):
        r = next(s for s in p["summary"] if s["method"] == method)
        return r["nll"], _mean_ood(r)

    (nll_new, ood_new), (nll_old, ood_old) = row(payload), row(old)
    assert nll_new < nll_old - 0.01 and ood_new > ood_old + 0.01


def test_one_ulp_of_the_start_flips_the_2_percent_rule_at_the_von_presets_end():
    """docs/uncertainty.md's "The rule on the 150-epoch preset": seed 2's stage 1 reads
    1.96 % site by site, 2.04 % site by site from the start moved by one ulp and 2.48 %
    fused, so the fused preset's miss is the rule's rounding noise; the table's fused
    stage 1 is the selection's, to the bit, on seeds 0-2."""
    folder = RESULTS.parent / "recipe_selection"

    def changes(stem: str) -> dict[str, float]:
        payload = json.loads((folder / f"{stem}.json").read_text())
        return {
            r["point"]: r["scale_convergence"]["median_scale_change"]
            for r in payload["records"]
            if r.get("scale_convergence")
        }

    point = "von, frozen, x0.3, 150 epochs"
    site = changes("stage1_lenet5_von_longer_seed2")[point]
    ulp = changes("stage1_lenet5_von150_ulp_seed2")
    assert site < 0.02 <= ulp[f"{point}, start + 1 ulp"] < ulp[f"{point}, fused"] < 0.025
    table = json.loads(RESULTS.with_name("uncertainty_lenet5_von150_rule.json").read_text())
    by_seed = {
        r["seed"]: r["scale_convergence"]["median_scale_change"]
        for r in table["records"]
        if r["method"] == "mean_field"
    }
    for seed in (0, 1, 2):  # the selection's fused stage 1 is the table's
        fused = changes(f"stage1_lenet5_von150_ulp_seed{seed}")[f"{point}, fused"]
        assert by_seed[seed] == fused


def test_the_settled_resnet20_misses_the_2_percent_rule_by_its_trend_not_by_rounding():
    """docs/uncertainty.md's settled ResNet-20 table: seed 1 misses the 2 % rule from its
    start and from the start moved by one ulp alike, and its median scale still rises at
    every recorded epoch of the last 40 (the settling's trend, unlike LeNet-5's noise)."""
    folder = RESULTS.parent / "recipe_selection"
    payload = json.loads((folder / "stage1_resnet20_settle80_ulp_seed1.json").read_text())
    (ulp,) = [r for r in payload["records"] if r.get("scale_convergence")]
    assert ulp["point"].endswith("start + 1 ulp")
    table = json.loads(RESULTS.with_name("uncertainty_resnet20_settled_seed1.json").read_text())
    (stage1,) = [r for r in table["records"] if r["method"] == "mean_field"]
    for rec in (ulp, stage1):
        assert 0.02 < rec["scale_convergence"]["median_scale_change"] < 0.025
    trajectory = [t["sigma_median"] for t in stage1["scale_trajectory"] if t["epoch"] >= 60]
    assert len(trajectory) == 5
    assert all(a < b for a, b in zip(trajectory[:-1], trajectory[1:], strict=True))


def test_the_settled_120_recipe_meets_the_2_percent_rule_on_every_seed():
    """docs/uncertainty.md's ``natural gradient, settled 120`` table: stage 1 meets the 2 %
    rule on every seed (each over the last 14 of its 140 epochs), and stage 1 and the 2DG
    rows keep the clean-data targets against the deterministic networks of the same
    command; the 2DG BNN with the Laplace head misses the MI AUROC and severity-5 targets
    by small margins, as the docs say. Trained in another environment than the
    80-epoch table (the same seeds give other networks)."""
    payload = json.loads(RESULTS.with_name("uncertainty_resnet20_settled120.json").read_text())
    stage1 = [r for r in payload["records"] if r["method"] == "mean_field"]
    assert sorted(r["seed"] for r in stage1) == [0, 1, 2]
    for r in stage1:
        conv = r["scale_convergence"]
        assert conv["over_epochs"] == 14 and conv["median_scale_change"] < 0.02, r["seed"]
    summary = {r["method"]: r for r in payload["summary"]}
    det, mf = summary["deterministic"], summary["mean_field"]
    assert mf["accuracy"] >= det["accuracy"] - 0.003 and mf["nll"] <= det["nll"]
    assert mf["ece"] <= 0.02
    t = payload["targets"]["natural gradient, settled 120: 2dg (representative) + laplace"]
    for name in ("accuracy >= det - 0.005", "nll <= det", "ece <= 0.02"):
        assert t[name]["met"], name
    assert t["mean entropy AUROC >= last-layer Laplace"]["met"]
    assert 0.88 < t["mean MI AUROC >= 0.90"]["value"] < 0.90
    assert 0.80 < t["mean severity-5 NLL ratio <= 0.8"]["value"] < 0.81
    old = json.loads(RESULTS.with_name("uncertainty_resnet20_settled.json").read_text())
    assert stage1[0]["environment"]["cpu"] != old["records"][0]["environment"]["cpu"]
