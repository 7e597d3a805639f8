"""The committed small experiment results are reproduced by their commands (slow).

Bit for bit holds on one machine: the float kernels torch picks for a CPU (AVX2 or
AVX-512, say) round differently, and a training run carries the last bit of every step
forward, so the committed files (written on a faster machine than this 2-core one) are
reproduced only on a machine whose kernels round as that one's do.  To check that a change leaves
every number alone on *this* machine, write the results of the commit before it into a
folder with the commands of ``experiments/results/*.json`` and point
``TWODG_REFERENCE_RESULTS`` at that folder: the tests then compare with it instead.
"""

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(os.environ.get("TWODG_REFERENCE_RESULTS") or ROOT / "experiments" / "results")


def _committed_and_fresh(name: str, args: list[str], tmp_path, timeout: int = 1800):
    """``(committed, fresh)``: ``experiments/results/<name>.json`` and the same file written
    by rerunning the experiment's script with ``args`` into ``tmp_path``."""
    script = "tables.py" if name in TABLES else f"{name}.py"
    cmd = [sys.executable, str(ROOT / "experiments" / script), *args, "--out", str(tmp_path)]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, timeout=timeout)
    committed = json.loads((RESULTS / f"{name}.json").read_text())
    return committed, json.loads((tmp_path / f"{name}.json").read_text())


def _same_metrics(a: dict, b: dict, keys, label, abs_tol: float = 1e-9) -> None:
    for key in keys:
        assert a[key] == pytest.approx(b[key], rel=1e-6, abs=abs_tol), (label, key)


TABLES = ["table4", "table5", "table10", "tyings", "merge_rules", "coordinates"]
METRICS = ("accuracy", "nll", "ece", "trainable_params")


@pytest.mark.slow
@pytest.mark.parametrize("table", TABLES)
def test_committed_table_is_reproduced_by_its_command(table, tmp_path):
    seed = json.loads((RESULTS / f"{table}.json").read_text())["seed"]
    committed, fresh = _committed_and_fresh(table, [table, "--seed", str(seed)], tmp_path)
    assert len(fresh["records"]) == len(committed["records"])
    for a, b in zip(fresh["records"], committed["records"], strict=True):
        assert (a["method"], a["variant"]) == (b["method"], b["variant"])
        _same_metrics(a, b, METRICS, (table, a["variant"]))


@pytest.mark.slow
def test_committed_guide_comparison_is_reproduced_for_its_first_seed(tmp_path):
    """``compare_guides.py`` for seed 0 alone gives the committed per-seed records."""
    seed = json.loads((RESULTS / "compare_guides.json").read_text())["seeds"][0]
    committed, fresh = _committed_and_fresh(
        "compare_guides", ["--seeds", str(seed)], tmp_path, timeout=3600
    )
    fresh, want = fresh["per_seed"][str(seed)], committed["per_seed"][str(seed)]
    assert [r["method"] for r in fresh] == [r["method"] for r in want]
    for a, b in zip(fresh, want, strict=True):
        _same_metrics(a, b, METRICS, a["method"])


@pytest.mark.slow
def test_committed_prediction_noise_is_reproduced(tmp_path):
    committed, fresh = _committed_and_fresh("prediction_noise", [], tmp_path)
    assert fresh["rows"].keys() == committed["rows"].keys()
    keys = ("accuracy", "nll", "ece")
    for name, row in committed["rows"].items():
        got = fresh["rows"][name]
        _same_metrics(got["s1000"], row["s1000"], keys, name, abs_tol=0.0)
        means = {k: got["s30"][k]["mean"] for k in keys}
        _same_metrics(means, {k: row["s30"][k]["mean"] for k in keys}, keys, name, abs_tol=0.0)
    # the point of the experiment: 30-sample NLL moves across prediction seeds
    assert all(r["s30"]["nll"]["std"] > 0 for r in committed["rows"].values())


def _tables_module():
    spec = importlib.util.spec_from_file_location("tables", ROOT / "experiments" / "tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_table4_takes_the_full_size_path_when_the_data_is_present(tmp_path, monkeypatch):
    """ResNet-20 on (tiny, fake) MNIST and CIFAR-10 folders, every epoch count cut to 1."""
    from test_data import write_fake_cifar10, write_fake_mnist

    write_fake_mnist(tmp_path, "MNIST", n_train=20, n_test=10)
    write_fake_cifar10(tmp_path, per_batch=4)
    tables = _tables_module()
    quick = {
        "network": {"pretrain_epochs": 1},
        "stage1": {"epochs": 1, "deterministic_epochs": 1, "deterministic_milestones": []},
        "sharing": {"n_components": 16},
        "stage3": {"epochs": 1, "merge_every": 1, "reassign_every": 1},
        "num_samples": 2,
    }
    monkeypatch.setattr(tables, "FULL_OVERRIDES", quick)
    records, size = tables.run_table("table4", str(tmp_path), seed=0)
    settings = sorted({r["setting"] for r in records})
    assert settings == [
        "cifar10-resnet20, no pretraining",
        "cifar10-resnet20, pretrained",
        "mnist-resnet20, no pretraining",
        "mnist-resnet20, pretrained",
    ]
    for setting in settings:
        rows = {r["method"]: r for r in records if r["setting"] == setting}
        assert {"mean_field", "2dg"} <= rows.keys()
        assert rows["2dg"]["trainable_params"] < rows["mean_field"]["trainable_params"] / 10
        assert all(0.0 <= r["accuracy"] <= 1.0 and math.isfinite(r["nll"]) for r in rows.values())
        if setting.endswith("no pretraining"):  # the INT8 baselines, 3 sigma widths
            assert sum("INT8" in m for m in rows) == 3


@pytest.fixture
def mnist_folder(tmp_path):
    """A (fake) MNIST folder of 200 training and 50 test images."""
    from test_data import write_fake_mnist

    write_fake_mnist(tmp_path, "MNIST", n_train=200, n_test=50)
    return tmp_path


def _script_module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _quick_selection(name: str, folder, *extra: str):
    """Run a selection script ``--quick`` on LeNet-5 over ``folder``: the script, its
    output folder and the JSON it wrote."""
    script = _script_module(name)
    out = folder / "out"
    args = ["--arch", "lenet5", "--root", str(folder), "--quick", "--out", str(out)]
    assert script.main([*args, "--draws", "2", "--ood-size", "20", *extra]) == 0
    (path,) = out.glob("*.json")
    return script, out, json.loads(path.read_text())


@pytest.mark.slow
def test_mnist_subset_experiment_runs_end_to_end_on_an_mnist_folder(mnist_folder):
    """``experiments/mnist_subset.py`` on a (fake) MNIST folder: LeNet-5 with one recipe
    and ResNet-20 with the CPU epochs write records with the required fields."""
    tmp_path = mnist_folder
    script = _script_module("mnist_subset")
    out = tmp_path / "out"
    args = ["--root", str(tmp_path), "--seeds", "0", "--out", str(out), "--threads", "1"]
    assert script.main([*args, "--recipes", "KL weight 0.01"]) == 0
    payload = json.loads((out / "mnist_subset.json").read_text())
    assert {r["method"] for r in payload["records"]} == {"mean_field", "2dg"}
    for r in payload["records"]:
        assert set(script.FIELDS) <= r.keys() and r["kl_weight"] == 0.01
    assert "KL weight 0.01" in (out / "mnist_subset.md").read_text()
    assert script.main([*args, "--arch", "resnet20"]) == 0
    payload = json.loads((out / "mnist_subset_resnet20.json").read_text())
    assert [r["method"] for r in payload["records"]] == ["deterministic", "mean_field", "2dg"]
    assert set(payload["targets"]) == {"mean_field_accuracy"}


def test_recipe_selection_scores_every_variant_on_the_validation_split(mnist_folder):
    """``experiments/recipe_selection.py --quick`` on a (fake) MNIST folder: one stage 1,
    two 2DG variants, each scored on the validation and test splits; the choice follows
    the validation NLL within the parameter budget, and the markdown says so."""
    variants = ["tau_d 0.002", "stage-3 lr 1e-4, tau_d 0.002"]
    script, out, doc = _quick_selection("recipe_selection", mnist_folder, "--variants", *variants)
    recs = doc["records"]
    assert [(r["method"], r["variant"]) for r in recs] == [
        ("deterministic", "-"),
        ("mean_field", "-"),
        ("2dg", variants[0]),
        ("2dg", variants[1]),
    ]
    for r in recs:
        for split in ("val", "test"):
            s = r[split]
            assert 0 <= s["accuracy"] <= 1 and math.isfinite(s["nll"])
            assert set(s["severity5_nll"]) and 0 <= s["entropy_auroc"] <= 1
    two_dg = [r for r in recs if r["method"] == "2dg"]
    best = min(two_dg, key=lambda r: r["val"]["nll"])["variant"]
    assert script.choose(recs) == best
    assert f"Chosen: **{best}**" in (out / "lenet5.md").read_text()


def test_stage1_selection_scores_svi_and_von_on_the_validation_split(mnist_folder):
    """``experiments/stage1_selection.py --quick`` on a (fake) MNIST folder: the
    deterministic network with and without temperature scaling, then SVI and variational
    online Newton from copies of it, each at its multiple of the data-size KL weight,
    scored on the validation split; the markdown names the point of lowest NLL."""
    from twodg_pyro.infer import data_size_kl_weight

    points = ["svi", "von, frozen, x0.3"]
    _, out, doc = _quick_selection("stage1_selection", mnist_folder, "--points", *points)
    recs = {r["point"]: r for r in doc["records"]}
    assert list(recs) == ["deterministic", "deterministic, scaled", *points]
    det, scaled = recs["deterministic"], recs["deterministic, scaled"]
    assert scaled["accuracy"] == det["accuracy"] and scaled["nll"] <= det["nll"] + 1e-9
    beta0 = data_size_kl_weight(180, 61706)  # 90 % of 200 images train; LeNet-5's weights
    assert recs["svi"]["kl_weight"] == pytest.approx(beta0)
    assert recs["von, frozen, x0.3"]["kl_weight"] == pytest.approx(0.3 * beta0)
    for r in (recs[p] for p in points):
        assert 0 <= r["accuracy"] <= 1 and math.isfinite(r["nll"]) and r["mean_mi_clean"] >= 0
        assert "scale_convergence" in r and r["history"]
    best = min(points, key=lambda p: recs[p]["nll"])
    assert f"Chosen (lowest validation NLL): **{best}**" in (out / "stage1_lenet5.md").read_text()


@pytest.mark.slow
def test_the_natural_gradient_recipe_trains_von_at_its_multiple_of_the_data_size_rule(mnist_folder):
    """``uncertainty.py``'s natural-gradient recipe (``--quick``, a fake MNIST folder): the
    ``mnist-lenet5-von`` preset, stage 1 by variational online Newton, stages 1 and 3 at
    its multiple of the data-size KL weight, a temperature-scaled row per method, and the
    2DG + Laplace row with the bytes of its compact file, the same last layer with the GP
    residual (its file holds the training features too; one more forward pass), and its
    two body-draw rows (``body_laplace.py``: the same file; the refit's prior precision
    its own)."""
    from twodg_pyro.infer import data_size_kl_weight
    from twodg_pyro.pipeline.settings.presets import VON_RECIPE
    from twodg_pyro.settings import data_size_multiple

    tmp_path = mnist_folder
    script = _script_module("uncertainty")
    ev = {"draws": 2, "ood_size": 20, "shift_size": 10}
    recs, _ = script.run_recipe(script.NATURAL_GRADIENT, str(tmp_path), 0, ev, quick=True)
    lap = "2dg (representative) + laplace"
    body, under = f"{lap}, body draws", f"{lap}, under body draws"
    resid = f"{lap} + GP residual"
    chosen = f"2dg (representative), {script.CHOSEN}"
    methods = ["mean_field", "laplace", "2dg (representative)", lap, resid, body, under, chosen]
    assert [r["method"] for r in recs] == methods
    multiple = data_size_multiple(VON_RECIPE["stage1"]["kl_weight"])
    beta = multiple * data_size_kl_weight(180, 61706)
    for r in recs:
        assert r["recipe"] == script.NATURAL_GRADIENT and r.get("kl_weight", beta) == beta
        assert r["temperature_scaled"]["temperature"] > 0 and math.isfinite(r["nll"])
    by = {r["method"]: r for r in recs}
    assert by[lap]["file_bytes"] > 0 and 0 <= by[lap]["file_prob_diff"] < 0.1
    assert by[body]["file_bytes"] == by[under]["file_bytes"] == by[lap]["file_bytes"]
    assert by[body]["prior_precision"] == by[lap]["prior_precision"]
    assert by[under]["prior_precision"] != by[lap]["prior_precision"]
    assert by[body]["forwards_per_prediction"] == 30  # one body forward a draw
    # the residual: the same last layer, 180 training features of LeNet-5's 84 more (at
    # float16 in the file); one pass serves the draws and the features
    assert by[resid]["prior_precision"] == by[lap]["prior_precision"]
    assert by[resid]["stored_params"] == by[lap]["stored_params"] + 180 * 84
    assert 0 < by[resid]["file_bytes"] - by[lap]["file_bytes"] - 180 * 84 * 2 < 1000
    assert by[resid]["forwards_per_prediction"] == by[lap]["forwards_per_prediction"] == 1
    assert by[resid]["file_prob_diff"] < 0.1
    assert by[resid]["relative_predict_seconds"] > 0  # timed, as the other rows are
    # the head chosen on the validation split's OOD sets: only the plain row and its
    # Laplace row are scored there, and the chosen row is the better one's record
    scored = [m for m in methods if "validation" in by[m]]
    assert scored == ["2dg (representative)", lap, chosen]
    ood = {m: by[m]["validation"]["mean_ood_entropy_auroc"] for m in scored[:2]}
    assert by[chosen]["chosen"] == (lap if ood[lap] > ood["2dg (representative)"] else scored[0])
    picked = by[by[chosen]["chosen"]]
    assert {k: v for k, v in by[chosen].items() if k not in ("method", "chosen")} == {
        k: v for k, v in picked.items() if k != "method"
    }
    v = by[lap]["validation"]
    assert 0 <= v["accuracy"] <= 1 and v["nll"] > 0
    assert set(v["ood_entropy_auroc"]) == set(by[lap]["ood"])
    # --laplace-rows: only the rows asked for
    recs, _ = script.run_recipe(
        script.NATURAL_GRADIENT,
        str(tmp_path),
        0,
        ev,
        True,
        methods=["mean_field", "2dg"],
        laplace_rows=(),
    )
    assert [r["method"] for r in recs] == ["mean_field", "2dg (representative)", lap, chosen]
    # each record states the torch build and threads it was trained with, and a table
    # merged with older records says which were not recorded
    env = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "isa": torch.backends.cpu.get_cpu_capability(),
    }
    assert all({k: r["environment"][k] for k in env} == env for r in recs)
    (line, blank) = script.environments_line(recs + [{"method": "older"}])
    threads = f"{env['threads']} thread" + ("s" if env["threads"] != 1 else "")
    assert line.startswith(f"Trained in: torch {torch.__version__}, {threads}, ")
    assert f", {env['isa']} kernels" in line
    assert "(older runs: not recorded)" in line and blank == ""
    assert script.environments_line([{"method": "older"}]) == []


def test_the_head_is_chosen_per_seed_and_variant_by_validation_ood_ties_keeping_the_plain_row():
    """``uncertainty.head_on_validation``: per 2DG variant, the row (plain or with the
    Laplace last layer) of the higher mean validation OOD AUROC; a tie keeps the plain
    row; a variant without both rows scored gets no chosen row."""
    script = _script_module("uncertainty")

    def row(method, auroc, nll=0.1):
        return {"method": method, "nll": nll, "validation": {"mean_ood_entropy_auroc": auroc}}

    recs = [
        row("2dg (representative)", 0.90),
        row("2dg (representative) + laplace", 0.93, nll=0.2),
        row("2dg (tied)", 0.95),
        row("2dg (tied) + laplace", 0.95),
        row("2dg (stochastic)", 0.80),
        {"method": "2dg (stochastic) + laplace", "nll": 0.1},  # not scored on validation
        row("2dg (representative) + laplace, body draws", 0.99),
    ]
    out = {r["method"]: r for r in script.head_on_validation(recs)}
    rep, tied = (f"2dg ({v}), {script.CHOSEN}" for v in ("representative", "tied"))
    assert list(out) == [rep, tied]
    assert out[rep]["chosen"] == "2dg (representative) + laplace" and out[rep]["nll"] == 0.2
    assert out[tied]["chosen"] == "2dg (tied)"
    assert script.in_head_rule("2dg (tied) + laplace") and script.in_head_rule("2dg (tied)")
    assert not script.in_head_rule("2dg (representative) + laplace, body draws")
    assert not script.in_head_rule("mean_field")


@pytest.mark.slow
def test_the_all_layer_laplace_recipe_fits_every_layer_of_the_deterministic_network(
    mnist_folder,
):
    """``--recipes "Laplace over all layers"``: the deterministic network and its Laplace
    with Kronecker factors over every layer (LeNet-5: all 61,706 weights; ResNet-20's
    settings are the same over its own preset), scored like every row."""
    script = _script_module("uncertainty")
    # a study, run by name: a run without --recipes is the committed table's
    assert script.LAPLACE_ALL not in script.DEFAULT_RECIPES
    assert len(script.DEFAULT_RECIPES) == len(script.RECIPES) - 1
    for arch in ("lenet5", "resnet20"):
        settings, spec = script.recipe_settings(
            script.LAPLACE_ALL, str(mnist_folder), 0, True, arch
        )
        assert settings["methods"] == ["deterministic", "laplace"] and spec["tyings"] == ()
        lap = settings["laplace"]
        assert (lap["subset"], lap["hessian"], lap["prior_structure"]) == (
            "all",
            "kron",
            "layerwise",
        )
    ev = {"draws": 2, "ood_size": 20, "shift_size": 10}
    recs, _ = script.run_recipe(script.LAPLACE_ALL, str(mnist_folder), 0, ev, quick=True)
    assert [r["method"] for r in recs] == ["deterministic", "laplace"]
    lap = recs[1]
    assert lap["recipe"] == script.LAPLACE_ALL and math.isfinite(lap["nll"])
    assert lap["stored_params"] > 2 * 61706  # the network and its factors over every layer


def test_the_assignment_study_scores_both_rules_and_merges_seeds(mnist_folder):
    """``experiments/assignment_study.py --quick`` on a (fake) MNIST folder: the
    deterministic network, stage 1 (``--point``: another than the recipe's, with whether
    its scales settled) and each variant (``--stage3-epochs`` of them) under both rules,
    each with the bytes of its ``.2dgz`` (and the share stage-3 pruning removed);
    ``--merge`` of two runs averages them row by row."""
    pruned = "K = 16 per layer, own-layer ellipses, pruned SNR < 1"
    point = "von, frozen, x0.1"
    script, out, doc = _quick_selection(
        "assignment_study",
        mnist_folder,
        *("--variants", "K = 32", pruned, "--point", point, "--stage3-epochs", "2"),
    )
    assert doc["point"] == point and f"Stage 1: `{point}`" in next(out.glob("*.md")).read_text()
    assert doc["stage3_epochs"] == 2  # --stage3-epochs over the quick run's 1
    recs = doc["records"]
    assert "scale_change" in recs[1] and "scale_change" not in recs[2]
    assert [(r["point"], r.get("assignment")) for r in recs] == [
        ("deterministic network", None),
        ("stage 1 (mean-field)", None),
        ("2DG, K = 32", "responsibility"),
        ("2DG, K = 32", "nearest"),
        (f"2DG, {pruned}", "responsibility"),
        (f"2DG, {pruned}", "nearest"),
    ]
    for r in recs[2:]:
        assert r["file_bytes"] > 0 and r["float32_ratio"] == doc["float32_bytes"] / r["file_bytes"]
    assert recs[2]["pruned"] == 0 and 0 < recs[4]["pruned"] < 1  # stage-3 pruning's share
    assert all(r["environment"]["torch"] == torch.__version__ for r in recs)
    path = next(out.glob("*.json"))
    assert script.main(["--merge", str(path), str(path), "--out", str(out), "--stem", "m"]) == 0
    merged = json.loads((out / "m.json").read_text())
    assert [r["nll"] for r in merged["records"]] == pytest.approx([r["nll"] for r in recs])
    assert "(means)" in (out / "m.md").read_text()
