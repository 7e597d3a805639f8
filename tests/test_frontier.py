"""The compression frontier's baselines (``experiments/frontier.py``, issue 31): the
deterministic network at INT8 by torch.ao and at 4 bits, and the targets' logic."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from twodg_pyro.models import LeNet5
from twodg_pyro.pipeline import config_from_dict

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def frontier():
    spec = importlib.util.spec_from_file_location("frontier", ROOT / "experiments" / "frontier.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _by_seed_point(points) -> dict:
    """A frontier's points by ``(seed, point name)``."""
    return {(p["seed"], p["point"]): p for p in points}


def _net():
    torch.manual_seed(0)
    return LeNet5().eval()


def test_four_bit_network_rounds_every_tensor_to_15_levels_and_counts_its_bytes(frontier):
    net = _net()
    q, n_bytes = frontier.four_bit_network(net)
    expected = 0
    for p, pq in zip(net.parameters(), q.parameters(), strict=True):
        scale = p.abs().max() / 7
        assert (pq - p).abs().max() <= scale / 2 + 1e-6
        assert torch.unique(pq).numel() <= 15
        expected += (p.numel() + 1) // 2 + 4
    assert n_bytes == expected
    assert n_bytes < sum(p.numel() for p in net.parameters()) * 4 / 7  # ~8x below float32


def test_int8_network_by_torch_ao_is_a_quarter_of_the_file_and_predicts_alike(frontier, tmp_path):
    net = _net()
    x = torch.randn(256, 1, 28, 28)
    q, n_bytes = frontier.int8_network(net, x, tmp_path / "q.pt")
    assert n_bytes == (tmp_path / "q.pt").stat().st_size
    f32 = 4 * sum(p.numel() for p in net.parameters())
    assert n_bytes < 0.4 * f32
    with torch.no_grad():
        ref, out = net(x), q(x)
    assert (out - ref).abs().max() < 0.05 * ref.abs().max()
    assert (out.argmax(1) == ref.argmax(1)).float().mean() > 0.9


def _row(point, family, nbytes, acc, nll, auroc, seeds=3):
    return {
        "point": point,
        "family": family,
        "seeds": seeds,
        "file_bytes": nbytes,
        "float32_ratio": 1000 / nbytes,
        "accuracy": acc,
        "nll": nll,
        "mean_ood_auroc": auroc,
    }


def _baselines(*ood):
    """The deterministic float32 and 4-bit and the INT8 mean-field rows the targets read,
    with these OOD AUROCs."""
    return [
        _row("deterministic float32", "deterministic", 1000, 0.97, 0.15, ood[0]),
        _row("deterministic 4-bit", "deterministic", 130, 0.96, 0.16, ood[1]),
        _row("mean-field INT8 mu, 1-bit sigma", "mean_field", 300, 0.95, 0.20, ood[2]),
    ]


def test_targets_pick_the_smallest_2dg_file_that_keeps_the_uncertainty(frontier):
    rows = _baselines(0.90, 0.89, 0.93) + [
        _row("ensemble", "ensemble", 5000, 0.975, 0.10, 0.94),
        _row("2dg small", "2dg", 20, 0.90, 0.30, 0.95),  # too inaccurate
        _row("2dg mid", "2dg", 25, 0.97, 0.12, 0.95),  # keeps all: 40x
        _row("2dg big", "2dg", 50, 0.975, 0.11, 0.96),
        # kept on the two seeds where validation chose a threshold: not a 3-seed claim
        _row("2dg chosen on validation", "2dg", 22, 0.97, 0.12, 0.95, seeds=2),
    ]
    kept = "keeping acc >= det - 0.5 pp, NLL <= det, OOD >= ensemble"
    checks = frontier.targets(rows)
    first = checks[f"smallest 2DG file {kept} (chosen on the test images: a bound, not a choice)"]
    assert first["met"] and first["value"].startswith("2dg mid: 40.0x")
    assert not any(k.startswith("the 2DG file chosen") for k in checks)  # no such rows
    # the files chosen on validation are judged as they are, whatever the test images say
    rows += [
        _row("2dg, K and pruning chosen on validation", "2dg", 50, 0.975, 0.11, 0.96),
        _row(f"2dg, {frontier.ONCE}", "2dg", 25, 0.90, 0.12, 0.95),
    ]
    checks = frontier.targets(rows)
    per_seed = checks[f"the 2DG file chosen on each seed's validation split, {kept}"]
    assert not per_seed["met"] and per_seed["value"].endswith("20.0x, keeps them: yes")
    once = checks[f"the 2DG file chosen once, on the seeds' mean validation, {kept}"]
    assert not once["met"] and once["value"].endswith("40.0x, keeps them: no")
    assert not checks["moonshot: that file >= 50x smaller"]["met"]
    beat4 = checks["a 2DG point beats 4-bit det on NLL and OOD AUROC at a smaller file"]
    assert beat4["met"] and "2dg small" not in beat4["value"]
    assert checks["a 2DG point beats INT8-mu / 1-bit-sigma mean-field on every axis"]["met"]
    baselines = [r for r in rows if r["family"] != "2dg"]  # a --no-variants run's table
    assert frontier.targets(baselines) == {}
    # no file keeps the targets: the lines say so and quote no kept file's size
    weak = baselines + [_row("2dg small", "2dg", 20, 0.90, 0.30, 0.95)]
    checks = frontier.targets(weak)
    first = checks[f"smallest 2DG file {kept} (chosen on the test images: a bound, not a choice)"]
    assert first["value"] == "none keeps the uncertainty targets (the smallest file is 50.0x)"
    moon = checks["moonshot: that file >= 50x smaller"]
    assert not first["met"] and not moon["met"] and moon["value"] == "no file kept"


def test_resnet20s_heads_face_the_stronger_laplace_baseline(frontier):
    rows = _baselines(0.70, 0.69, 0.80) + [
        _row("laplace", "laplace", 1000, 0.97, 0.10, 0.85),
        _row("2dg + laplace head small", frontier.HEAD, 100, 0.97, 0.12, 0.88),
    ]
    kept = "keeping acc >= det - 0.5 pp, NLL <= det, OOD >= laplace"
    bound = "(chosen on the test images: a bound, not a choice)"
    name = f"smallest 2DG + Laplace head file {kept} {bound}"
    assert frontier.targets(rows, "resnet20")[name]["met"]  # 10x, OOD above Laplace's 0.85
    # the baseline given BatchNorm statistics at its mean scores 0.90: now the bar
    rows.append(_row(frontier.LAPLACE_AT_MEAN, "laplace", 1000, 0.97, 0.09, 0.90))
    assert not frontier.targets(rows, "resnet20")[name]["met"]
    rows[-1]["mean_ood_auroc"] = 0.80  # weaker than the plain one: the plain one stays the bar
    assert frontier.targets(rows, "resnet20")[name]["met"]


def test_the_committed_frontier_follows_from_its_points(frontier):
    """``experiments/results/frontier.json``: every seed has every point, with its bytes
    and forward passes, and the summary and targets are recomputed from the points."""
    import json

    path = ROOT / "experiments" / "results" / "frontier.json"
    if not path.exists():
        pytest.skip("frontier.json is not committed")
    payload = json.loads(path.read_text())
    assert payload["seeds"] == [0, 1, 2]
    names = {p["point"] for p in payload["points"]}
    for seed in payload["seeds"]:
        assert {p["point"] for p in payload["points"] if p["seed"] == seed} == names
    for p in payload["points"]:
        assert p["file_bytes"] > 0 and p["forwards_per_prediction"] >= 1, p["point"]
    rows = frontier.summarise(payload["points"])
    assert json.loads(json.dumps(rows)) == payload["summary"]
    assert json.loads(json.dumps(frontier.targets(rows))) == payload["targets"]


def test_the_committed_pruned_points_trade_bytes_for_snr(frontier):
    """Item 3: per variant and spread, a larger SNR threshold prunes more weights and
    writes a smaller file; at the smallest threshold the file is already smaller than the
    unpruned one of the same coding."""
    import json

    path = ROOT / "experiments" / "results" / "frontier.json"
    if not path.exists():
        pytest.skip("frontier.json is not committed")
    rows = {r["point"]: r for r in json.loads(path.read_text())["summary"]}
    for variant in frontier.PRUNED_VARIANTS:
        plain = rows[f"2dg {variant} small"]
        for spread in frontier.PRUNE_SPREADS:
            pts = [
                rows[f"2dg {variant} small pruned SNR<{t:g} {spread}"] for t in frontier.PRUNE_SNRS
            ]
            fractions = [p["pruned_fraction"] for p in pts]
            sizes = [p["file_bytes"] for p in pts]
            assert fractions == sorted(fractions) and 0 < fractions[0] < fractions[-1] < 1
            assert sizes == sorted(sizes, reverse=True) and sizes[0] < plain["file_bytes"]


def test_the_stage3_threshold_is_the_largest_that_keeps_the_targets_on_validation(frontier):
    """Issue 47, item 1: the threshold is chosen on the validation split, never on the
    test images (their accuracy and NLL are not looked at)."""

    def point(name, snr, acc, nll, family="2dg"):
        keys = ("point", "stage3_prune_snr", "val_accuracy", "val_nll", "family")
        return dict(zip(keys, (name, snr, acc, nll, family), strict=True))

    det = point("deterministic float32", None, 0.970, 0.120)
    points = [
        det,
        point("2dg K=32", None, 0.975, 0.090),
        point("t=0.5", 0.5, 0.972, 0.100),
        point("t=1", 1.0, 0.966, 0.110),  # keeps acc >= det - 0.5 pp and NLL <= det
        point("t=2", 2.0, 0.950, 0.300),
    ]
    assert frontier.choose_pruned(points)["point"] == "t=1"
    points[3]["val_nll"] = 0.121  # above the deterministic network's: t=1 no longer keeps
    assert frontier.choose_pruned(points)["point"] == "t=0.5"
    assert frontier.choose_pruned([det, points[4]]) is None
    # a Laplace head's file is its own family: chosen among its kind only
    head = point("head t=2", 2.0, 0.975, 0.080, family=frontier.HEAD)
    assert frontier.choose_pruned([*points, head])["point"] == "t=0.5"
    assert frontier.choose_pruned([*points, head], frontier.HEAD)["point"] == "head t=2"


def _val_point(name, nbytes, acc, nll, seed=0, family="2dg") -> dict:
    """A frontier point with its file's bytes and its validation scores."""
    keys = ("point", "file_bytes", "val_accuracy", "val_nll", "seed", "family")
    return dict(zip(keys, (name, nbytes, acc, nll, seed, family), strict=True))


def test_the_deployed_file_is_the_smallest_stage3_variant_that_keeps_validation(frontier):
    """Issue 47, item 2: K (and stage-3 pruning) chosen on the validation split: the
    smallest file of the stage-3 variants keeping the targets there; after-training
    pruned points are not candidates, and the choice is made anew per seed."""

    det = _val_point("deterministic float32", 1000, 0.970, 0.120, family="deterministic")
    points = [
        det,
        _val_point("2dg K=256", 300, 0.975, 0.090),
        _val_point("2dg K=16", 120, 0.968, 0.115),  # keeps: the smallest that does
        _val_point("2dg K=8", 100, 0.960, 0.200),  # too inaccurate
        _val_point("2dg K=16 small pruned SNR<2 zero", 50, 0.975, 0.090),  # after training
    ]
    assert frontier.choose_variant(points)["point"] == "2dg K=16"
    both = frontier.with_chosen(points + [dict(p, seed=1) for p in points[:2]])
    chosen = {
        p["seed"]: p["chosen"]
        for p in both
        if p["point"] == "2dg, K and pruning chosen on validation"
    }
    assert chosen == {0: "2dg K=16", 1: "2dg K=256"}
    assert frontier.with_chosen(both) == both  # made anew, not added twice
    # a Laplace head's files (small coding only) are chosen apart from the plain ones
    head = [
        _val_point(f"{frontier.HEAD} K=16 small", 130, 0.972, 0.100, family=frontier.HEAD),
        _val_point(f"{frontier.HEAD} K=8 small", 110, 0.960, 0.200, family=frontier.HEAD),
    ]
    chosen = {p["point"]: p["chosen"] for p in frontier.with_chosen(points + head) if "chosen" in p}
    assert chosen["2dg, K and pruning chosen on validation"] == "2dg K=16"
    name = f"{frontier.HEAD} small, K and pruning chosen on validation"
    assert chosen[name] == f"{frontier.HEAD} K=16 small"
    assert f"{frontier.HEAD}, K and pruning chosen on validation" not in chosen


def test_the_file_chosen_once_keeps_the_targets_on_the_seeds_mean_validation(frontier):
    """One variant for every seed, as the studies choose their other settings: the
    smallest mean file whose seed-averaged validation accuracy and NLL keep the targets
    against the deterministic network's averages, though one seed alone would refuse it;
    a variant that a seed lacks is not a candidate."""

    det = "deterministic float32"
    points = [
        _val_point(det, 1000, 0.970, 0.120, seed=0, family="deterministic"),
        _val_point(det, 1000, 0.960, 0.140, seed=1, family="deterministic"),
        _val_point("2dg K=32", 300, 0.975, 0.090, seed=0),
        _val_point("2dg K=32", 310, 0.965, 0.100, seed=1),
        # seed 0 alone refuses it (0.125 > 0.120); the means keep (0.1275 <= 0.130)
        _val_point("2dg T=1", 100, 0.966, 0.125, seed=0),
        _val_point("2dg T=1", 110, 0.962, 0.130, seed=1),
        _val_point("2dg T=2", 50, 0.950, 0.200, seed=0),  # too inaccurate
        _val_point("2dg T=2", 60, 0.955, 0.150, seed=1),
        _val_point("2dg T=3", 10, 0.970, 0.100, seed=0),  # seed 1 lacks it
    ]
    assert frontier.choose_for_recipe(points) == "2dg T=1"
    assert frontier.choose_variant([p for p in points if p["seed"] == 0])["point"] == "2dg T=3"
    once = [p for p in frontier.with_chosen(points) if p["point"].endswith(frontier.ONCE)]
    assert [(p["seed"], p["chosen"], p["file_bytes"]) for p in once] == [
        (0, "2dg T=1", 100),
        (1, "2dg T=1", 110),
    ]
    points[5]["val_nll"] = 0.140  # the means no longer keep: the unpruned file
    assert frontier.choose_for_recipe(points) == "2dg K=32"


def _three_seed_means(frontier, stem: str) -> tuple[dict, dict]:
    """A committed merged frontier of seeds 0, 1, 2 (``experiments/results/STEM.json``)
    and its summary by point, which must regenerate from its points."""
    import json

    merged = json.loads((ROOT / "experiments" / "results" / f"{stem}.json").read_text())
    rows = frontier.summarise(frontier.with_chosen(merged["points"]))
    assert json.loads(json.dumps(rows)) == merged["summary"] and merged["seeds"] == [0, 1, 2]
    return merged, {r["point"]: r for r in rows}


def _chosen_once(frontier, merged: dict) -> dict[str, str]:
    """The files chosen once on the seeds' mean validation of a merged frontier: each
    family and coding's point name to the name of the file it chose."""
    return {
        p["point"]: p["chosen"]
        for p in frontier.with_chosen(merged["points"])
        if p["seed"] == 0 and p["point"].endswith(frontier.ONCE)
    }


def _setting_picks(frontier, points: list[dict], family: str) -> tuple:
    """What ``with_chosen`` picks of ``family`` among files that differ in a setting
    (two seeds): seed 0's and seed 1's file, the one chosen once, and the
    ``setting_chosen`` markers of ``points[2:8]``."""
    out = frontier.with_chosen(points)
    chosen = {(p["seed"], p["point"]): p["chosen"] for p in out if "chosen" in p}
    per_seed = f"{family} small, K and pruning chosen on validation"
    once = chosen[(0, f"{family} small, {frontier.ONCE}")]
    marks = [p["setting_chosen"] for p in out[2:8]]
    return chosen[(0, per_seed)], chosen[(1, per_seed)], once, marks


def test_a_residuals_floor_is_chosen_by_validation_nll_before_the_size_rules(frontier):
    """``--head-residual-floor``: among the floors of one variant and number of centres,
    only the one of lowest validation NLL (per seed; once, by the seeds' mean) is a
    candidate, though the unfloored file is a few bytes smaller; the size rules then pick
    among the candidates."""
    gp, det = frontier.HEAD_GP, "deterministic float32"

    def point(floor, seed, n_bytes, nll, m=16):
        q = f" floored at q={floor}" if floor else ""
        name = f"{gp} on {m} centres{q} K=16 SNR<2 small"
        return _val_point(name, n_bytes, 0.97, nll, seed=seed, family=gp)

    points = [
        _val_point(det, 1000, 0.970, 0.120, seed=0, family="deterministic"),
        _val_point(det, 1000, 0.970, 0.120, seed=1, family="deterministic"),
        point(None, 0, 100, 0.119),  # smallest, keeps, but not its group's best NLL
        point(0.5, 0, 101, 0.110),
        point(0.9, 0, 101, 0.100),  # seed 0's floor
        point(None, 1, 100, 0.118),
        point(0.5, 1, 101, 0.090),  # seed 1's floor
        point(0.9, 1, 101, 0.115),  # the seeds' mean: 0.1075 against 0.100 at q=0.5
        point(0.9, 0, 140, 0.080, m=64),  # another group: its own choice, larger
        point(0.9, 1, 140, 0.080, m=64),
    ]
    picks = _setting_picks(frontier, points, gp)
    marks = [False, False, True, False, True, False]
    assert picks == (points[4]["point"], points[6]["point"], points[6]["point"], marks)
    assert frontier.without_floor(points[4]["point"]) == points[2]["point"]


def test_a_tuned_mean_is_chosen_over_the_untuned_body_by_validation_nll(frontier):
    """``--head-tune-lr``: a head file around its tuned body and the same file around
    the untuned body differ only in a setting; validation NLL picks one of them (per
    seed; once, by the seeds' mean), though the untuned file is a few bytes smaller, and
    the size rules then choose among the picked files.  ``with_chosen`` marks copies:
    the points passed in are left as they are."""
    head, det = frontier.HEAD, "deterministic float32"

    def point(lr, seed, n_bytes, nll, k=16):
        tuned = f", {frontier.TUNED} lr={lr:g}" if lr else ""
        return _val_point(f"{head} K={k} SNR<2{tuned} small", n_bytes, 0.97, nll, seed, head)

    points = [
        _val_point(det, 1000, 0.970, 0.120, seed=0, family="deterministic"),
        _val_point(det, 1000, 0.970, 0.120, seed=1, family="deterministic"),
        point(None, 0, 100, 0.110),
        point(1e-3, 0, 102, 0.100),  # seed 0's pick
        point(3e-3, 0, 102, 0.105),
        point(None, 1, 100, 0.115),
        point(1e-3, 1, 102, 0.119),
        point(3e-3, 1, 102, 0.090),  # seed 1's pick, and the seeds' mean (0.0975)
        point(None, 0, 140, 0.050, k=32),  # another variant: larger
        point(None, 1, 140, 0.050, k=32),
    ]
    assert frontier.without_settings(points[3]["point"]) == points[2]["point"]
    picks = _setting_picks(frontier, points, head)
    marks = [False, True, False, False, False, True]
    assert picks == (points[3]["point"], points[7]["point"], points[4]["point"], marks)
    assert all("setting_chosen" not in p for p in points)


def test_runs_of_the_same_seeds_merge_with_each_baseline_once(frontier, tmp_path):
    """``--from-json`` of the committed seed-0 stage-3 frontier and the nearest rule's
    run of the same seed (``--nearest``): each (seed, point) once, the first file's
    baselines kept (the two runs' baselines are identical), both runs' 2DG variants there,
    and the file chosen on validation picked over both; the committed merge of the three
    seeds is what its points give."""
    import json

    res = ROOT / "experiments" / "results"
    a, b = res / "frontier_stage3_seed0.json", res / "frontier_nearest_seed0.json"
    if not (a.exists() and b.exists()):
        pytest.skip("the seed-0 frontiers are not committed")
    argv = ["--from-json", str(a), str(b), "--out", str(tmp_path), "--stem", "m"]
    assert frontier.main(argv) == 0
    merged = json.loads((tmp_path / "m.json").read_text())["points"]
    keys = [(p["seed"], p["point"]) for p in merged]
    assert len(keys) == len(set(keys))
    first = {p["point"]: p for p in json.loads(a.read_text())["points"]}
    second = {p["point"]: p for p in json.loads(b.read_text())["points"]}
    for name in ("deterministic float32", "ensemble", "laplace", "mean-field float32"):
        assert first[name]["nll"] == second[name]["nll"]
    names = {p["point"] for p in merged}
    assert {n for n in second if "nearest" in n} <= names
    chosen = next(
        p for p in merged if p["point"] == "2dg small, K and pruning chosen on validation"
    )
    assert chosen["chosen"] == "2dg K=32 nearest pruned in stage 3 SNR<0.5 zero small"
    path = res / "frontier_stage3_nearest.json"
    payload = json.loads(path.read_text())
    rows = frontier.summarise(frontier.with_chosen(payload["points"]))
    assert json.loads(json.dumps(rows)) == payload["summary"]


def test_the_rank1_baseline_run_repeats_the_committed_baselines(frontier):
    """``--methods deterministic mean_field rank1 --no-variants`` on seeds 0-2 (rank-1
    added to the committed LeNet-5 frontier): its deterministic and mean-field points are
    the committed runs' to the bit, seed by seed, so that the merge pairs rank-1 with the
    networks of its own seed; the merged frontier has rank-1 on every seed."""
    import json

    res = ROOT / "experiments" / "results"
    paths = [res / f"frontier_{n}.json" for n in ("rank1", "stage3_seed0", "stage3_seed12")]
    if not all(p.exists() for p in paths):
        pytest.skip("the rank-1 frontier run is not committed")
    new, *old = (json.loads(p.read_text())["points"] for p in paths)
    committed = {(q["seed"], q["point"]): q for part in old for q in part}
    keys = ("accuracy", "nll", "mean_ood_auroc", "val_nll", "file_bytes")
    repeated = [q for q in new if q["family"] in ("deterministic", "mean_field")]
    assert len(repeated) == 3 * 6
    for q in repeated:
        assert {k: q[k] for k in keys} == {k: committed[q["seed"], q["point"]][k] for k in keys}
    merged = json.loads((res / "frontier_stage3_nearest.json").read_text())
    rank1 = [q for q in merged["points"] if q["point"] == "rank-1"]
    assert sorted(q["seed"] for q in rank1) == [0, 1, 2]
    assert all(q["forwards_per_prediction"] == 4 * 30 for q in rank1)  # M = 4, 30 draws


def test_from_json_keeps_the_seeds_asked_for(frontier, tmp_path):
    """``--from-json ... --seeds 3 4``: a run of five seeds (the 60-epoch stage 3 on seeds
    0-4) merged into the frontier of two of them keeps only their points."""
    import json

    path = ROOT / "experiments" / "results" / "frontier_nearest_s3long.json"
    if not path.exists():
        pytest.skip("the five-seed run is not committed")
    assert json.loads(path.read_text())["seeds"] == [0, 1, 2, 3, 4]
    argv = ["--from-json", str(path), "--seeds", "3", "4", "--out", str(tmp_path), "--stem", "m"]
    assert frontier.main(argv) == 0
    merged = json.loads((tmp_path / "m.json").read_text())
    assert merged["seeds"] == [3, 4] and {p["seed"] for p in merged["points"]} == {3, 4}


@pytest.mark.parametrize(
    ("stem", "seeds"),
    [("frontier_lenet5_bayes", [0, 1, 2]), ("frontier_lenet5_bayes_heldout", [3, 4, 5, 6])],
)
def test_the_150_epoch_recipe_frontier_keeps_every_seeds_targets_beyond_30x(frontier, stem, seeds):
    """The LeNet-5 frontiers of the preset's 150-epoch stage 1 (seeds 0-2, and four more):
    the summary follows from the points, and the file chosen on each seed's validation
    split is >= 30x smaller than the float32 network and keeps that seed's targets on the
    test images (accuracy >= det - 0.5 pp, NLL <= det's, mean OOD AUROC >= the
    ensemble's)."""
    import json

    path = ROOT / "experiments" / "results" / f"{stem}.json"
    payload = json.loads(path.read_text())
    rows = frontier.summarise(frontier.with_chosen(payload["points"]))
    assert json.loads(json.dumps(rows)) == payload["summary"]
    by = _by_seed_point(frontier.with_chosen(payload["points"]))
    assert payload["seeds"] == seeds
    for seed in payload["seeds"]:
        det, ens = by[seed, "deterministic float32"], by[seed, "ensemble"]
        chosen = by[seed, "2dg small, K and pruning chosen on validation"]
        assert chosen["float32_ratio"] >= 30
        assert chosen["accuracy"] >= det["accuracy"] - 0.005
        assert chosen["nll"] <= det["nll"]
        assert chosen["mean_ood_auroc"] >= ens["mean_ood_auroc"]


def test_settle_epochs_and_the_resnet_nearest_per_layer_variants(frontier):
    """``--settle-epochs N`` lengthens the natural-gradient stage 1 by N epochs at learning
    rate 0 (valid settings); ``--arch resnet20 --per-layer --nearest`` runs 16 components
    a layer under the nearest rule, unpruned and pruned inside stage 3."""
    args = SimpleNamespace(
        methods=["deterministic", "mean_field", "2dg"],
        arch="resnet20",
        recipe=frontier.NATURAL_GRADIENT,
        root="data",
        quick=False,
        settle_epochs=40,
        per_layer=True,
        nearest=True,
    )
    settled = frontier.seed_settings(args, 0)["stage1"]
    plain = frontier.seed_settings(SimpleNamespace(**{**vars(args), "settle_epochs": 0}), 0)
    assert (
        settled["epochs"] == plain["stage1"]["epochs"] + 40 and settled["von_settle_epochs"] == 40
    )
    assert config_from_dict(frontier.seed_settings(args, 0)).stage1.von_settle_epochs == 40
    variants = frontier.variant_set(args)
    assert variants is frontier.RESNET_NEAREST_PER_LAYER_VARIANTS
    for over in variants.values():
        assert over["sharing"] == {
            "n_components": 16,
            "codebook": "per_layer",
            "assignment": "nearest",
        }
    assert [v.get("stage3", {}).get("prune_snr") for v in variants.values()] == [
        None,
        1.0,
        1.5,
        2.0,
        3.0,
        5.0,
        5.0,
    ]
    assert [v.get("stage3", {}).get("prune_ramp_epochs") for v in variants.values()][-1] == 10
    args.nearest = False
    assert frontier.variant_set(args) is frontier.RESNET_PER_LAYER_VARIANTS
    # --variants keeps the named ones, in the order given; an unknown name is refused
    args.nearest, name = True, "K=16 per layer nearest pruned in stage 3 SNR<2 zero"
    args.variants = [name]
    assert frontier.variant_set(args) == {name: frontier.RESNET_NEAREST_PER_LAYER_VARIANTS[name]}
    args.variants = ["K=16 per layer nearest pruned in stage 3 SNR<4 zero"]
    with pytest.raises(ValueError, match="SNR<4 zero'] are not variants"):
        frontier.variant_set(args)


def test_the_table_names_the_recipe_and_environment_its_points_were_trained_in(frontier):
    """A frontier's title names the recipe of its points (``recipe_label``: ``--recipe``
    and the settling epochs), not always the recommended one, and the environments they
    were trained in; points from before the stamp say "not recorded"."""
    args = SimpleNamespace(arch="resnet20", recipe=frontier.NATURAL_GRADIENT, settle_epochs=40)
    label = frontier.recipe_label(args)
    assert label == f"{frontier.NATURAL_GRADIENT}, 40 settling epochs"
    lenet = SimpleNamespace(arch="lenet5", recipe=None, settle_epochs=0)
    assert frontier.recipe_label(lenet) == "mnist-lenet5-bayes"
    env = {"torch": "2.0", "threads": 1, "cpu": "a CPU"}
    points = [{"recipe": label, "environment": env}]
    text = frontier.markdown([], {}, [0], "cmd", "resnet20", points)
    assert f"(recipe: {label})" in text.splitlines()[0]
    assert "Trained in: torch 2.0, 1 thread, a CPU." in text
    older = frontier.markdown([], {}, [0], "cmd", "resnet20", [*points, {}])
    assert older.splitlines()[0].endswith(f"(recipe: {label}; not recorded)")


def test_a_longer_stage3_under_pruning_lifts_every_score_and_still_misses_resnet20s_8x(frontier):
    """``--stage3-epochs 20`` against the CPU recipe's 6 on ResNet-20 seed 1 (issue 47's
    route; two runs of the same command but for it, at two threads): the baselines are
    the same to the bit, the pruned files keep their bytes, and the longer stage 3 lifts
    the plain and head files' accuracy, NLL and OOD AUROC, yet the head file still misses
    all three of the targets against the deterministic network and Laplace."""
    import json

    res = ROOT / "experiments" / "results"
    base, long = (
        json.loads((res / f"frontier_resnet20_head_s3{s}_seed1.json").read_text())
        for s in ("base", "long")
    )
    for payload in (base, long):
        rows = frontier.summarise(frontier.with_chosen(payload["points"]))
        assert json.loads(json.dumps(rows)) == payload["summary"]
    by = [{p["point"]: p for p in payload["points"]} for payload in (base, long)]
    for name in ("deterministic float32", "laplace", "mean-field float32"):
        assert by[0][name] == by[1][name], name
    variant = "K=16 per layer nearest pruned in stage 3 SNR<2 zero"
    for kind in ("2dg", "2dg + laplace head"):
        short = by[0][f"{kind} {variant} small"]
        longer = by[1][f"{kind} {variant}, 20 stage-3 epochs small"]
        assert short["file_bytes"] == longer["file_bytes"]
        assert longer["accuracy"] > short["accuracy"] and longer["nll"] < short["nll"]
        assert longer["mean_ood_auroc"] > short["mean_ood_auroc"]
    det, lap = by[1]["deterministic float32"], by[1]["laplace"]
    head = by[1][f"2dg + laplace head {variant}, 20 stage-3 epochs small"]
    assert head["float32_ratio"] >= 8
    assert head["accuracy"] < det["accuracy"] - 0.005 and head["nll"] > det["nll"]
    assert head["mean_ood_auroc"] < lap["mean_ood_auroc"]


def test_kronecker_triangles_shrink_the_head_file_and_buy_a_lower_threshold(frontier):
    """The head frontier of seed 1 rerun after the Laplace files started storing each
    Kronecker factor's upper triangle, with the thresholds 1 and 1.5 beside 2: every
    point the two runs share is the same to the bit but the Laplace and head files'
    bytes, about 8.4 KB fewer; at SNR < 1.5 the head file is still >= 8x smaller and
    closer to each target than at SNR < 2, yet misses all three; validation chose SNR < 1,
    below 8x.  Over three seeds the 8x head file misses the OOD target on every seed."""
    import json

    res = ROOT / "experiments" / "results"
    old, new = (
        json.loads((res / f"frontier_resnet20_head_{s}_seed1.json").read_text())
        for s in ("s3long", "packed")
    )
    rows = frontier.summarise(frontier.with_chosen(new["points"]))
    assert json.loads(json.dumps(rows)) == new["summary"]
    by = [{p["point"]: p for p in payload["points"]} for payload in (old, new)]
    sizes = ("file", "file_bytes", "bytes_per_weight", "float32_ratio")
    smaller = {}
    for name, point in by[0].items():
        mine, theirs = by[1][name], point
        assert {k: v for k, v in mine.items() if k not in sizes} == {
            k: v for k, v in theirs.items() if k not in sizes
        }, name
        if mine["file_bytes"] != theirs["file_bytes"]:
            smaller[name] = theirs["file_bytes"] - mine["file_bytes"]
    variant = "K=16 per layer nearest pruned in stage 3 SNR<{} zero, 20 stage-3 epochs small"
    assert set(smaller) == {"laplace", f"2dg + laplace head {variant.format(2)}"}
    assert all(8_000 < saved < 9_000 for saved in smaller.values())
    det, lap = by[1]["deterministic float32"], by[1]["laplace"]
    heads = {t: by[1][f"2dg + laplace head {variant.format(t)}"] for t in (1, 1.5, 2)}
    assert heads[1.5]["float32_ratio"] >= 8 > heads[1]["float32_ratio"]
    for worse, better in ((heads[2], heads[1.5]), (heads[1.5], heads[1])):
        assert better["nll"] < worse["nll"] and better["mean_ood_auroc"] > worse["mean_ood_auroc"]
    head = heads[1.5]
    assert head["accuracy"] < det["accuracy"] - 0.005 and head["nll"] > det["nll"]
    assert head["mean_ood_auroc"] < lap["mean_ood_auroc"]
    chosen = by[1]["2dg + laplace head small, K and pruning chosen on validation"]
    assert chosen["chosen"] == f"2dg + laplace head {variant.format(1)}"
    # three seeds: at SNR < 1.5 the head file is >= 8x and keeps accuracy and NLL on the
    # mean, but its OOD score, and even the least pruned head file's, is below Laplace's
    # on every seed
    merged, mean = _three_seed_means(frontier, "frontier_resnet20_head_packed")
    det, lap = mean["deterministic float32"], mean["laplace"]
    head = mean[f"2dg + laplace head {variant.format(1.5)}"]
    assert head["float32_ratio"] >= 8 and head["accuracy"] >= det["accuracy"] - 0.005
    assert head["nll"] <= det["nll"] and head["mean_ood_auroc"] < lap["mean_ood_auroc"]
    seeds = _by_seed_point(merged["points"])
    for seed in (0, 1, 2):
        laplace_ood = seeds[seed, "laplace"]["mean_ood_auroc"]
        for t in (1, 1.5):
            point = seeds[seed, f"2dg + laplace head {variant.format(t)}"]
            assert point["mean_ood_auroc"] < laplace_ood


def test_a_floored_residual_on_16_centres_lifts_the_8x_head_file_past_laplaces_ood(frontier):
    """``frontier_resnet20_head_gpf`` (three seeds): every point shared with the packed
    run is the same to the bit; at SNR < 1.5 the head file with the residual on 16 k-means
    centres, floored at the training features' 0.9-quantile, is >= 8x smaller than the
    float32 network and keeps accuracy, NLL and OOD >= Laplace's on the seeds' mean (the
    OOD score beats Laplace's on every seed); unfloored, its NLL breaks the target; the
    file chosen once on validation (SNR < 2) misses the NLL."""
    import json

    res = ROOT / "experiments" / "results"
    merged, mean = _three_seed_means(frontier, "frontier_resnet20_head_gpf")
    for seed in (0, 1, 2):
        old = json.loads((res / f"frontier_resnet20_head_packed_seed{seed}.json").read_text())
        mine = {p["point"]: p for p in merged["points"] if p["seed"] == seed}
        for p in old["points"]:
            if " chosen " not in p["point"] and p["point"] in mine:
                drop = ("file", "floor_chosen", "floor_once", "setting_chosen", "setting_once")
                new = {k: v for k, v in mine[p["point"]].items() if k not in drop}
                assert new == {k: v for k, v in p.items() if k != "file"}, p["point"]
    det, lap = mean["deterministic float32"], mean["laplace"]
    variant = "K=16 per layer nearest pruned in stage 3 SNR<1.5 zero, 20 stage-3 epochs small"
    gp = f"{frontier.HEAD_GP} on 16 centres{{}} {variant}"
    floored, plain = mean[gp.format(" floored at q=0.9")], mean[gp.format("")]
    assert floored["float32_ratio"] >= 8 and floored["accuracy"] >= det["accuracy"] - 0.005
    assert floored["nll"] <= det["nll"] and floored["mean_ood_auroc"] >= lap["mean_ood_auroc"]
    assert plain["nll"] > det["nll"]  # unfloored: the centres' own variance costs NLL
    by = _by_seed_point(merged["points"])
    for seed in (0, 1, 2):
        assert (
            by[seed, gp.format(" floored at q=0.9")]["mean_ood_auroc"]
            > (by[seed, "laplace"]["mean_ood_auroc"])
        )
    checks = merged["targets"]
    bound = next(v for k, v in checks.items() if k.startswith("smallest 2DG + Laplace head + GP"))
    assert bound["met"] and bound["value"].startswith(gp.format(" floored at q=0.9"))
    once = mean[f"{frontier.HEAD_GP} small, {frontier.ONCE}"]
    assert once["nll"] > det["nll"] and once["mean_ood_auroc"] >= lap["mean_ood_auroc"]


def test_head_files_around_the_mean_statistics_keep_resnet20s_targets_only_on_the_mean(
    frontier,
):
    """``frontier_resnet20_head_at_mean`` (``--head-norm-stats``, three seeds): the head
    file chosen once on the seeds' mean validation is >= 8x smaller than the float32
    network and keeps accuracy, NLL and OOD >= the stronger Laplace row on the seeds' mean;
    per seed its NLL is above the deterministic network's on seeds 1 and 2 (seed 0's
    deterministic network is the weak one), so the mean rests on one seed."""
    merged, mean = _three_seed_means(frontier, "frontier_resnet20_head_at_mean")
    det = mean["deterministic float32"]
    lap = max(mean["laplace"], mean[frontier.LAPLACE_AT_MEAN], key=lambda r: r["mean_ood_auroc"])
    once = mean[f"{frontier.HEAD} small, {frontier.ONCE}"]
    assert once["float32_ratio"] >= 8 and once["accuracy"] >= det["accuracy"] - 0.005
    assert once["nll"] <= det["nll"] and once["mean_ood_auroc"] >= lap["mean_ood_auroc"]
    key = next(
        k for k in merged["targets"] if k.startswith("the 2DG + Laplace head file chosen once")
    )
    assert merged["targets"][key]["met"]
    by = _by_seed_point(merged["points"])
    name = by[0, once["point"]]["chosen"]
    assert "SNR<2" in name
    nll = [by[s, name]["nll"] - by[s, "deterministic float32"]["nll"] for s in (0, 1, 2)]
    assert nll[0] < 0 < min(nll[1:])


def test_tuning_the_mean_network_lowers_its_validation_nll_and_leaves_the_rest(
    frontier, trained_mean_field, stage2_structure, digits
):
    from twodg_pyro.data import make_loader
    from twodg_pyro.guides import SharedGMMGuide
    from twodg_pyro.methods import GuidePosterior
    from twodg_pyro.sharing import prune_structure

    model, _ = trained_mean_field
    structure, rep = prune_structure(stage2_structure, 2.0, "zero")  # most weights
    guide = SharedGMMGuide(model, structure)
    body = GuidePosterior(model, guide)
    n = guide.n_pinned
    # the differentiable means are the means, and carry gradients to centres and outliers
    means = guide.mean_weights(differentiable=True)
    plain = guide.mean_weights()
    assert all(torch.equal(means[k].detach(), v) and not v.requires_grad for k, v in plain.items())
    sum(m.sum() for m in means.values()).backward()
    assert guide.centre_mu.grad.abs().sum() > 0 and guide.outlier_loc.grad.abs().sum() > 0
    guide.zero_grad()
    guide.draw()  # a draw with its graph, as stage 3 leaves the guide: copies leave it out
    before = {k: v.detach().clone() for k, v in guide.named_parameters()}
    val = frontier.data_tensors(make_loader(digits.val, 1000))
    train = make_loader(digits.train, 128)
    tuned, log = frontier.tune_mean(body, digits.train, val, train, 3, 1e-2, 0)
    nll = log["tune_val_nll"]
    assert len(nll) == 4 and log["tune_epoch"] > 0 and nll[log["tune_epoch"]] == min(nll) < nll[0]
    got = dict(tuned.guide.named_parameters())
    assert not torch.equal(got["centre_mu"], before["centre_mu"])
    assert not torch.equal(got["outlier_loc"], before["outlier_loc"])
    assert torch.all(got["centre_mu"][-n:] == 0) and rep.n_pruned > 0  # pruned stay removed
    for name in ("centre_raw", "outlier_rho"):  # the scales are the body's
        assert torch.equal(got[name], before[name]), name
    # the body given is untouched
    assert all(torch.equal(v, before[k]) for k, v in guide.named_parameters())


def test_tuning_the_head_files_mean_lowers_resnet20s_nll_on_every_seed_but_seed_2_misses(
    frontier,
):
    """``frontier_resnet20_head_tuned`` (``--head-tune-lr 1e-4 1e-3``, three seeds): the
    head file around the body with its mean network tuned at lr 1e-3 has a lower test and
    validation NLL than the untuned one on every seed, at the same bytes, beats the
    deterministic network's test NLL on seeds 0 and 1 and misses it on seed 2; the
    tuning chosen once on validation (``mark_settings``) is lr 1e-3, for both files."""
    merged, _ = _three_seed_means(frontier, "frontier_resnet20_head_tuned")
    by = _by_seed_point(merged["points"])
    variant = "K=16 per layer nearest pruned in stage 3 SNR<2 zero, 20 stage-3 epochs"
    plain = f"{frontier.HEAD} {variant} small"
    tuned = f"{frontier.HEAD} {variant}, {frontier.TUNED} lr=0.001 small"
    for s in (0, 1, 2):
        a, b = by[s, plain], by[s, tuned]
        assert b["nll"] < a["nll"] and b["val_nll"] < a["val_nll"]
        assert b["file_bytes"] == a["file_bytes"] and b["tune_epoch"] == 4
    beats = [by[s, tuned]["nll"] < by[s, "deterministic float32"]["nll"] for s in (0, 1, 2)]
    assert beats == [True, True, False]
    once = _chosen_once(frontier, merged)  # the tuning: chosen by validation NLL too
    gp = f"{frontier.HEAD_GP} on 16 centres floored at q=0.9 {variant}"
    assert once[f"{frontier.HEAD} small, {frontier.ONCE}"] == tuned
    assert (
        once[f"{frontier.HEAD_GP} small, {frontier.ONCE}"]
        == f"{gp}, {frontier.TUNED} lr=0.001 small"
    )


def test_eight_tuning_epochs_on_another_cpu_keep_the_gp_file_on_the_mean_not_per_seed(
    frontier,
):
    """``frontier_resnet20_head_tuned8`` (``--head-tune-lr 1e-3 3e-3 --head-tune-epochs
    8``, three seeds, another CPU model than ``frontier_resnet20_head_tuned``): the GP
    file chosen once on validation is a tuned one, >= 8x smaller than the float32 network,
    and keeps every target on the seeds' mean; per seed the tuned head file beats the
    deterministic network's test NLL on seed 0 only, and no seed kept its 8th epoch."""

    merged, mean = _three_seed_means(frontier, "frontier_resnet20_head_tuned8")
    det, lap = mean["deterministic float32"], mean["laplace"]
    gp = mean[f"{frontier.HEAD_GP} small, {frontier.ONCE}"]
    assert gp["float32_ratio"] >= 8 and gp["accuracy"] >= det["accuracy"] - 0.005
    assert gp["nll"] <= det["nll"] and gp["mean_ood_auroc"] >= lap["mean_ood_auroc"]
    head = mean[f"{frontier.HEAD} small, {frontier.ONCE}"]
    assert head["nll"] <= det["nll"] and head["mean_ood_auroc"] < lap["mean_ood_auroc"]
    once = _chosen_once(frontier, merged)
    assert f"{frontier.TUNED} lr=0.001" in once[f"{frontier.HEAD_GP} small, {frontier.ONCE}"]
    by = _by_seed_point(merged["points"])
    variant = "K=16 per layer nearest pruned in stage 3 SNR<2 zero, 20 stage-3 epochs"
    tuned = f"{frontier.HEAD} {variant}, {frontier.TUNED} lr=0.001 small"
    beats = [by[s, tuned]["nll"] < by[s, "deterministic float32"]["nll"] for s in (0, 1, 2)]
    assert beats == [True, False, False]
    epochs = [p["tune_epoch"] for p in merged["points"] if "tune_epoch" in p]
    assert len(epochs) >= 12 and max(epochs) < 8


def test_full_size_laplace_misses_the_per_seed_nll_bar_that_the_head_files_miss():
    """The per-seed bar (each seed's test NLL <= its own deterministic network's) is at
    the test split's noise on ResNet-20's seed 2, whose network is the strongest: in four
    of the five independent committed three-seed runs of the head files (each trained in
    another environment) the full-size last-layer Laplace misses it there, while on the
    validation split it beats the network in four of five; on seed 0, the weakest
    network, it always beats it."""
    import json

    test_gap, val_gap, seed0 = [], [], []
    for stem in ("head", "head_gpf", "head_tuned", "head_tuned8", "head_at_mean"):
        path = ROOT / "experiments" / "results" / f"frontier_resnet20_{stem}.json"
        by = _by_seed_point(json.loads(path.read_text())["points"])
        det, lap = by[2, "deterministic float32"], by[2, "laplace"]
        test_gap.append(lap["nll"] - det["nll"])
        val_gap.append(lap["val_nll"] - det["val_nll"])
        seed0.append(by[0, "laplace"]["nll"] < by[0, "deterministic float32"]["nll"])
    assert sum(g > 0 for g in test_gap) == 4 and sum(g < 0 for g in val_gap) == 4
    assert all(seed0) and max(test_gap) < 0.01


def test_pruning_at_snr_3_keeps_resnet20s_targets_at_11x_and_snr_5_loses_the_network(
    frontier,
):
    """``frontier_resnet20_snr`` (the SNR < 2 run ``frontier_resnet20_head_tuned`` merged
    with its SNR < 3 and SNR < 5 reruns, whose baselines repeat it to the bit): the GP file
    chosen once on validation is the tuned SNR < 3 one, 11x smaller than the float32
    network, and keeps every target on the seeds' mean; SNR < 5 prunes 80 % of the
    weights for a 15x head file whose network stage 3 does not bring back, so no file
    reaches the 16x moonshot with the targets.  Per seed the chosen file keeps the accuracy
    and misses the NLL on seeds 1 and 2."""
    merged, mean = _three_seed_means(frontier, "frontier_resnet20_snr")
    det, lap = mean["deterministic float32"], mean["laplace"]
    gp = mean[f"{frontier.HEAD_GP} small, {frontier.ONCE}"]
    assert 11 <= gp["float32_ratio"] < 12 and gp["accuracy"] >= det["accuracy"] - 0.005
    assert gp["nll"] <= det["nll"] and gp["mean_ood_auroc"] >= lap["mean_ood_auroc"]
    once = _chosen_once(frontier, merged)[f"{frontier.HEAD_GP} small, {frontier.ONCE}"]
    assert "SNR<3" in once and f"{frontier.TUNED} lr=0.001" in once
    by = _by_seed_point(merged["points"])
    det_of = [by[s, "deterministic float32"] for s in (0, 1, 2)]
    assert all(by[s, once]["accuracy"] >= d["accuracy"] - 0.005 for s, d in enumerate(det_of))
    assert [by[s, once]["nll"] <= d["nll"] for s, d in enumerate(det_of)] == [True, False, False]
    snr5 = "K=16 per layer nearest pruned in stage 3 SNR<5 zero, 20 stage-3 epochs"
    head5 = mean[f"{frontier.HEAD} {snr5}, {frontier.TUNED} lr=0.001 small"]
    assert head5["float32_ratio"] > 15 and head5["pruned_fraction"] > 0.8
    assert head5["accuracy"] < det["accuracy"] - 0.01 and head5["nll"] > det["nll"]
    assert mean[f"2dg {snr5} small"]["accuracy"] < 0.7
    checks = frontier.targets(list(mean.values()), "resnet20")  # the frontier's own rule
    moonshots = [v["met"] for k, v in checks.items() if k.startswith("moonshot")]
    assert len(moonshots) == 3 and not any(moonshots)
    kept = [v for k, v in checks.items() if k.startswith("smallest")]
    assert any(v["met"] and v["value"].startswith(once) for v in kept)


def test_a_pruning_ramp_lifts_the_pruned_2dg_network_but_not_the_deployed_files(frontier):
    """``frontier_resnet20_ramp`` (``frontier_resnet20_snr`` merged with its SNR < 5
    variant pruned over the first 10 of 20 stage-3 epochs, ``stage3.prune_ramp_epochs``,
    whose baselines repeat it to the bit): the ramp prunes the same weights as pruning at
    once and lifts the plain 2DG network's accuracy on the seeds' mean (by 17 pp on seed
    1), but the tuned head files, the ones the rules deploy, score as pruning at once does,
    so the file chosen once on validation is still the SNR < 3 one and no file reaches the
    16x moonshot with the targets."""
    merged, mean = _three_seed_means(frontier, "frontier_resnet20_ramp")
    det = mean["deterministic float32"]
    once = "K=16 per layer nearest pruned in stage 3 SNR<5 zero, 20 stage-3 epochs"
    ramp = once.replace("zero,", "zero, ramped over 10 epochs,")
    a, b = mean[f"2dg {ramp} small"], mean[f"2dg {once} small"]
    assert a["pruned_fraction"] == b["pruned_fraction"] > 0.8
    assert a["accuracy"] > b["accuracy"] + 0.05 and a["nll"] < b["nll"]
    by = _by_seed_point(merged["points"])
    gains = [
        by[s, f"2dg {ramp} small"]["accuracy"] - by[s, f"2dg {once} small"]["accuracy"]
        for s in (0, 1, 2)
    ]
    assert gains[1] > 0.15 and gains[2] < 0  # not on every seed
    for family in (frontier.HEAD, f"{frontier.HEAD_GP} on 16 centres floored at q=0.9"):
        a = mean[f"{family} {ramp}, {frontier.TUNED} lr=0.001 small"]
        b = mean[f"{family} {once}, {frontier.TUNED} lr=0.001 small"]
        assert abs(a["accuracy"] - b["accuracy"]) < 0.002 and abs(a["nll"] - b["nll"]) < 0.01
        assert a["accuracy"] < det["accuracy"] - 0.01 and a["nll"] > det["nll"]
    chosen = _chosen_once(frontier, merged)[f"{frontier.HEAD_GP} small, {frontier.ONCE}"]
    assert "SNR<3" in chosen
    checks = frontier.targets(list(mean.values()), "resnet20")
    assert not any(v["met"] for k, v in checks.items() if k.startswith("moonshot"))


def test_on_lenet5_a_pruning_ramp_scores_as_pruning_at_once(frontier):
    """``frontier_lenet5_ramp`` (the 150-epoch recipe at T = 1.5 and 60 stage-3 epochs,
    pruned at once and ramped over the first 30, seeds 0-2 in one environment): the
    same 95.8 % of the weights pruned, and the two files score alike (accuracy within
    0.1 pp, NLL within 0.003, OOD AUROC within 0.002), both 57x smaller than the float32
    network with its accuracy and NLL kept on the mean: at 60 epochs stage 3 recovers
    from pruning at once, and the ramp adds nothing."""
    merged, mean = _three_seed_means(frontier, "frontier_lenet5_ramp")
    det = mean["deterministic float32"]
    once = "2dg K=32 nearest pruned in stage 3 SNR<1.5 zero, 60 stage-3 epochs small"
    a, b = mean[once.replace("zero,", "zero, ramped over 30 epochs,")], mean[once]
    assert a["pruned_fraction"] == b["pruned_fraction"] > 0.95
    assert abs(a["accuracy"] - b["accuracy"]) < 0.001 and abs(a["nll"] - b["nll"]) < 0.003
    assert abs(a["mean_ood_auroc"] - b["mean_ood_auroc"]) < 0.002
    for r in (a, b):
        assert r["float32_ratio"] > 56 and r["accuracy"] >= det["accuracy"] - 0.005
        assert r["nll"] < det["nll"]
