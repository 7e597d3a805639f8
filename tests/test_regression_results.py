"""The committed regression table (``python experiments/regression.py``, issue 45): every
method on both problems and seeds, a summary that is the mean of its runs, and the
issue's targets checked from the table's own numbers, each met or recorded as missed.

The targets' outcome is pinned as committed (:data:`COMMITTED_OUTCOME`): a rerun that
changes one changes this test and the markdown's "Missed" line together."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

RESULTS = Path(__file__).resolve().parents[1] / "experiments" / "results"
METHODS = ("deterministic", "mean_field", "2dg", "mcmc")
NLL = "diabetes: 2DG NLL within 5 % of mean-field"
COVERAGE = "diabetes: 2DG 90 % coverage in [0.85, 0.95]"
RATIO = "diabetes: mean-field / 2DG trainable >= 20"


def gap(method: str) -> str:
    return f"gap: {method} epistemic std in the gap / on the data >= 1.5"


#: What the committed run met.  On diabetes, with mean-field and 2DG on the MAP's noise
#: (chosen on validation: regression_noise_selection.md), the NLL (2DG 0.2 % above
#: mean-field), the 90 % coverage (0.886; 0.958 on a learnt noise before) and the ratio of
#: trainable parameters (33.4x, 37.6x, 40.1x: 8 components).  On the gap, with the fits
#: run to convergence, the activation (tanh: regression_activation.md, five seeds) and
#: 2DG's tying (tied: regression_tying.md) chosen on validation, NUTS has 4.2x the spread
#: in the gap, mean-field 1.61x and 2DG 1.62x on the mean of the seeds (2DG by seed 1.02,
#: 1.12, 2.71).  With ReLU (regression_relu.md) 0.58x and 0.61x; with the paper's
#: representative tying (regression_representative.md) 2DG misses.
COMMITTED_OUTCOME = {
    NLL: True,
    COVERAGE: True,
    RATIO: True,
    gap("mean_field"): True,
    gap("2dg"): True,
    gap("mcmc"): True,
}


@pytest.fixture(scope="module")
def committed():
    return json.loads((RESULTS / "regression.json").read_text())


def test_every_method_ran_on_both_problems_and_every_seed(committed):
    assert not committed["quick"] and committed["seeds"] == [0, 1, 2]
    assert committed["command"] == "python experiments/regression.py"
    for problem in ("diabetes", "gap1d"):
        for seed in map(str, committed["seeds"]):
            assert set(committed["runs"][problem][seed]) == set(METHODS), (problem, seed)
    for seed in map(str, committed["seeds"]):
        for method, r in committed["runs"]["diabetes"][seed].items():
            assert r["rmse"] > 0 and all(0 <= r[f"coverage_{p}"] <= 1 for p in (50, 90, 95))
            assert r["coverage_50"] <= r["coverage_90"] <= r["coverage_95"], method
        runs = committed["runs"]["gap1d"][seed]
        for method in METHODS[1:]:
            r = runs[method]
            assert r["gap_ratio"] == pytest.approx(r["epistemic_in_gap"] / r["epistemic_on_data"])
        # NUTS ran on the MAP's noise, with its kept draws, without a divergence
        for problem in ("diabetes", "gap1d"):
            rec = committed["runs"][problem][seed]
            assert rec["mcmc"]["noise_scale"] == rec["deterministic"]["noise_scale"]
            assert rec["mcmc"]["draws"] == 400 and rec["mean_field"]["draws"] == 200
            assert rec["mcmc"]["divergences"] == 0


def test_the_table_is_the_mean_of_the_runs(committed):
    for problem, table in committed["table"].items():
        for method, fields in table.items():
            for name, stat in fields.items():
                values = [r[method][name] for r in committed["runs"][problem].values()]
                assert stat["mean"] == pytest.approx(sum(values) / len(values)), (method, name)


def test_the_targets_follow_from_the_numbers_met_or_recorded_as_missed(committed):
    d, g = committed["table"]["diabetes"], committed["table"]["gap1d"]
    mf, dg = d["mean_field"], d["2dg"]
    rel = (dg["nll"]["mean"] - mf["nll"]["mean"]) / abs(mf["nll"]["mean"])
    ratio = mf["trainable"]["mean"] / dg["trainable"]["mean"]
    cov = dg["coverage_90"]["mean"]
    expected = {
        NLL: (rel, abs(rel) <= 0.05),
        COVERAGE: (cov, 0.85 <= cov <= 0.95),
        RATIO: (ratio, ratio >= 20),
    }
    for m in ("mean_field", "2dg", "mcmc"):
        r = g[m]["gap_ratio"]["mean"]
        expected[gap(m)] = (r, r >= 1.5)
    checks = committed["checks"]
    assert set(checks) == set(expected) == set(COMMITTED_OUTCOME)
    md = (RESULTS / "regression.md").read_text()
    for name, (value, met) in expected.items():
        assert math.isclose(checks[name]["value"], value, rel_tol=1e-9), name
        assert checks[name]["met"] == met == COMMITTED_OUTCOME[name], name
        assert f"| {name} | {value:.3f} | {'yes' if met else 'no'} |" in md, name
    missed = [name for name, met in COMMITTED_OUTCOME.items() if not met]
    assert ("**Missed:** " + "; ".join(missed) + "." if missed else "Every target is met.") in md


@pytest.mark.parametrize(
    "stem", ["regression", "regression_relu", "regression_tied", "regression_representative",
             "regression_stochastic", "regression_seed34"],
)  # fmt: skip
def test_each_committed_table_is_its_records_markdown(stem):
    """Every committed table is what ``regression.py`` writes from its record, the gap's
    ratio per seed included (the target is on the mean of the seeds)."""
    import regression as R

    payload = json.loads((RESULTS / f"{stem}.json").read_text())
    md = (RESULTS / f"{stem}.md").read_text()
    assert R.markdown(payload) == md
    ratios = [f"{r['2dg']['gap_ratio']:.2f}" for r in payload["runs"]["gap1d"].values()]
    assert "2dg " + ", ".join(ratios) in md


def test_the_markdown_states_what_the_misses_rest_on(committed):
    """The ratio of trainable parameters per seed; on the gap every Bayesian method ran on
    the MAP's noise (mean-field and 2DG as NUTS: with a learnt noise their true-ELBO
    optimum is the flat function) and the variational fits follow the data (test RMSE
    near the noise, not near the targets' spread of 1): the markdown says both, from the
    runs."""
    md = (RESULTS / "regression.md").read_text()
    per_seed = [
        r["mean_field"]["trainable"] / r["2dg"]["trainable"]
        for r in committed["runs"]["diabetes"].values()
    ]
    assert "trainable parameters per seed: " + ", ".join(f"{v:.1f}x" for v in per_seed) in md
    g = committed["table"]["gap1d"]
    assert committed["gap_noise"] == pytest.approx(0.139, abs=1e-3)
    assert committed["recipes"]["gap1d"]["variational_noise"] == "map"
    for runs in committed["runs"]["gap1d"].values():
        for m in METHODS[1:]:
            assert runs[m]["noise_scale"] == runs["deterministic"]["noise_scale"], m
    section = md.split("## the 1-D gap")[1].split("## the issue's targets")[0]
    assert "on the MAP's noise (fixed)" in section
    for m in METHODS:
        sigma = g[m]["noise_scale"]["mean"]
        assert sigma == pytest.approx(committed["gap_noise"], rel=0.1), m
        # the flat fit of a learnt noise had a test RMSE of 1.03; 2DG's sharing keeps less
        # of the fit (0.43) than mean-field (0.15), the MAP and NUTS (0.17)
        bound = 0.5 if m == "2dg" else 2 * committed["gap_noise"]
        assert g[m]["rmse"]["mean"] < bound, m
        line = next(row for row in section.splitlines() if row.startswith(f"| {m} |"))
        assert f"| {g[m]['noise_scale']['mean']:.3f} |" in line, m
    assert (RESULTS / "regression_gap.png").stat().st_size > 0


@pytest.mark.parametrize("stem", ["regression", "regression_relu"])
def test_the_committed_variational_fits_converged(stem):
    """Every variational fit of the committed runs (the recipe's tanh and the rejected
    ReLU) ended without a trend in its -ELBO beyond the noise of its draws (the last two
    tenths of its epochs within 3 standard errors), the gap's mean-field after its
    30,000 + 60,000 epochs."""
    payload = json.loads((RESULTS / f"{stem}.json").read_text())
    assert payload["recipes"]["gap1d"]["mf_epochs"] == 30000
    assert payload["recipes"]["gap1d"]["mf_decay_epochs"] == 60000
    activation = "relu" if stem.endswith("relu") else "tanh"
    assert payload["recipes"]["gap1d"]["activation"] == activation
    for problem, per_seed in payload["runs"].items():
        for seed, runs in per_seed.items():
            for m in ("mean_field", "2dg"):
                assert runs[m]["convergence"]["loss_z"] < 3, (problem, seed, m)
    # the gap's small first layer settled too (the median over all weights hid its drift)
    for runs in payload["runs"]["gap1d"].values():
        assert runs["mean_field"]["convergence"]["site_scale_change"] < 0.1


def test_convergence_compares_the_last_two_tenths_and_each_site_on_its_own():
    """:func:`regression.convergence`: the -ELBO's change between the last two tenths of
    a history, and the largest change of a site's median scale (a small site that drifts
    counts, however many weights stand still)."""
    from regression import convergence

    history = [{"loss": 100.0}] * 80 + [{"loss": 110.0}] * 10 + [{"loss": 99.0}] * 10
    got = convergence(history)
    assert got["over_epochs"] == 10 and got["loss_change"] == pytest.approx(0.1)
    assert got["loss_z"] is None  # constant tenths: no spread to measure the change by
    assert "site_scale_change" not in got
    before, after = {"big": 0.2, "small": 0.16}, {"big": 0.2, "small": 0.2}
    assert convergence(history, after, before)["site_scale_change"] == pytest.approx(0.25)
    # noise alone is a small multiple of its standard error; a steady trend of one noise
    # sd per tenth of the epochs is many
    g = torch.Generator().manual_seed(0)
    noise = (torch.randn(1000, generator=g) * 10 + 300).tolist()
    trend = [v - 0.1 * i for i, v in enumerate(noise)]
    assert convergence([{"loss": v} for v in noise])["loss_z"] < 3
    assert convergence([{"loss": v} for v in trend])["loss_z"] > 3
    # both tenths in float64 (float32 would round 1e6 + 1e-3 to 1e6: no change at all)
    fine = [{"loss": 1e6 + 1e-3}] * 18 + [{"loss": 1e6}] * 2
    assert convergence(fine)["loss_change"] == pytest.approx(1e-9, rel=1e-3)


def test_a_low_rank_gaussian_still_misses_the_gap(tmp_path):
    """``gap_lowrank.py``: Pyro's rank-10 plus diagonal Gaussian, beside its mean-field
    ``AutoNormal``, on the gap with ``regression.py``'s recipe and its own spread and
    convergence records: dependence between all the weights does not widen the spread
    between the clusters of data (every seed under 1.5x, as NUTS is not); and the
    script's quick run writes the same fields."""
    import gap_lowrank

    for stem, guide in (("gap_lowrank", "AutoLowRankMultivariateNormal"),
                        ("gap_lowrank_autonormal", "AutoNormal")):  # fmt: skip
        doc = json.loads((RESULTS / f"{stem}.json").read_text())
        recs = doc["records"]
        assert [r["seed"] for r in recs] == [0, 1, 2] and {r["guide"] for r in recs} == {guide}
        for r in recs:
            # regression.gap_spread's ratio, of its float32 means
            ratio = torch.tensor(r["epistemic_in_gap"]) / torch.tensor(r["epistemic_on_data"])
            assert r["gap_ratio"] == float(ratio)
            assert set(r["convergence"]) >= {"loss_change", "loss_z", "over_epochs"}
            assert 0 < r["gap_ratio"] < 1.5, (stem, r["seed"])
        assert gap_lowrank.markdown(doc) == (RESULTS / f"{stem}.md").read_text()
    gap_lowrank.main(
        ["--seeds", "0", "--guides", "lowrank", "--quick", "--out", str(tmp_path), "--stem", "q"]
    )
    (rec,) = json.loads((tmp_path / "q.json").read_text())["records"]
    assert rec["rank"] == 10 and rec["epistemic_on_data"] > 0 and rec["epistemic_in_gap"] > 0


@pytest.mark.parametrize(("stem", "key"), [("regression_activation", "activation"),
                                           ("regression_prior_tanh", "prior_gain"),
                                           ("regression_tying", "tying")])  # fmt: skip
def test_the_gap_studies_chose_the_recipe_on_validation(stem, key):
    """Each study of the gap problem's settings (``--select-activation``,
    ``--select-prior``, ``--select-tying``): its markdown is its record's, and its
    choice, the lower mean validation NLL of mean-field and 2DG together, is the
    recipe's."""
    import regression as R

    payload = json.loads((RESULTS / f"{stem}.json").read_text())
    assert R.gap_study_markdown(key, payload) == (RESULTS / f"{stem}.md").read_text()
    labels = tuple(map(R.option_label, R.GAP_STUDIES[key][1]))
    assert all(tuple(per_seed) == labels for per_seed in payload["runs"].values())
    _, chosen = R.validation_choice(payload["runs"], labels)
    assert chosen == R.option_label(R.RECIPES["gap1d"][key])


def test_under_relu_a_wider_prior_widens_the_gap_but_validation_keeps_gain_1():
    """``--select-prior --activation relu`` (regression_prior_relu.md), the study made
    when the recipe ran ReLU and missed the gap: its gain-1 runs are the activation
    study's ReLU runs to the bit (the same recipe and seeds); mean-field's gap ratio grows
    with the gain, but 2DG's validation NLL grows with it by far more, so gain 1 stays."""
    prior = json.loads((RESULTS / "regression_prior_relu.json").read_text())["runs"]
    activation = json.loads((RESULTS / "regression_activation.json").read_text())["runs"]
    for seed, runs in prior.items():
        assert runs["1"] == activation[seed]["relu"], seed
    mean = {
        (g, m, k): sum(prior[s][g][m][k] for s in prior) / len(prior)
        for g in ("1", "2", "3")
        for m in ("mean_field", "2dg")
        for k in ("nll", "gap_ratio")
    }
    assert mean["1", "mean_field", "gap_ratio"] < mean["2", "mean_field", "gap_ratio"]
    assert mean["2", "mean_field", "gap_ratio"] < 1.5 <= mean["3", "mean_field", "gap_ratio"]
    for g in ("2", "3"):
        assert mean[g, "2dg", "nll"] > mean["1", "2dg", "nll"] + 1


def test_the_renyi_bound_widens_the_spread_everywhere_and_still_misses_the_gap(tmp_path):
    """``gap_lowrank.py --alpha 0.5``: Pyro's ``RenyiELBO`` (mass-covering) on
    ``AutoNormal`` under the gap recipe: on every seed a wider spread on the data than the
    ELBO's ``AutoNormal`` fit and in the gap alike, so the ratio stays under 1.5x
    (gap_renyi.md); the script's quick run records its alpha and particles."""
    import gap_lowrank

    doc = json.loads((RESULTS / "gap_renyi.json").read_text())
    elbo = json.loads((RESULTS / "gap_lowrank_autonormal.json").read_text())["records"]
    assert [r["seed"] for r in doc["records"]] == [r["seed"] for r in elbo] == [0, 1, 2]
    for r, e in zip(doc["records"], elbo, strict=True):
        assert (r["guide"], r["alpha"], r["particles"]) == ("AutoNormal", 0.5, 16)
        assert r["epistemic_on_data"] > 2 * e["epistemic_on_data"]
        assert r["epistemic_in_gap"] > e["epistemic_in_gap"]
        assert 0 < r["gap_ratio"] < 1.5 and r["convergence"]["loss_change"] < 0.01
    assert gap_lowrank.markdown(doc) == (RESULTS / "gap_renyi.md").read_text()
    argv = ["--seeds", "0", "--guides", "normal", "--alpha", "0", "--particles", "4", "--quick"]
    gap_lowrank.main([*argv, "--out", str(tmp_path), "--stem", "q"])
    (rec,) = json.loads((tmp_path / "q.json").read_text())["records"]
    assert (rec["alpha"], rec["particles"], rec["rank"]) == (0.0, 4, 0)
    assert rec["epistemic_on_data"] > 0 and rec["epistemic_in_gap"] > 0


def test_under_tanh_the_gain_stays_1_and_the_studies_share_their_runs():
    """``--select-prior --activation tanh`` (regression_prior_tanh.md), the prior study on
    the recipe's activation: the gains above 1 break 2DG (its mean validation NLL above
    0.5) and gain 1 is chosen; its gain-1 runs are the activation study's tanh runs to
    the bit (the same recipe and seeds, and each option on its own loader, so the order
    in which a study runs its options no longer moves them)."""
    import regression as R

    # its markdown and its choice against the recipe: the gap studies' parametrized test
    doc = json.loads((RESULTS / "regression_prior_tanh.json").read_text())
    assert "--activation tanh" in doc["command"]
    gains = tuple(map(R.option_label, R.GAP_STUDIES["prior_gain"][1]))
    means, chosen = R.validation_choice(doc["runs"], gains)
    assert chosen == "1" and all(means[g, "2dg"] > 0.5 for g in gains[1:])
    activation = json.loads((RESULTS / "regression_activation.json").read_text())["runs"]
    for seed, runs in doc["runs"].items():
        assert runs["1"] == activation[seed]["tanh"], seed
    # the studies made before the tying study ran the representative tying, as the tying
    # study's first option does (select_gap holds later studies' settings at their first)
    tying = json.loads((RESULTS / "regression_tying.json").read_text())["runs"]
    for seed, runs in tying.items():
        assert runs["representative"] == activation[seed]["tanh"], seed


def test_five_seeds_choose_tanh_which_the_recipe_follows():
    """``--select-activation --seeds 0 1 2 3 4`` (regression_activation.md): tanh has the
    lower mean validation NLL of mean-field and 2DG together, and so the recipe's; on
    seeds 0-2 alone the two were within 0.03 (a tie), and seed 3 decides most of it
    (ReLU's 2DG above 0 there)."""
    import regression as R

    runs = json.loads((RESULTS / "regression_activation.json").read_text())["runs"]
    assert list(runs) == ["0", "1", "2", "3", "4"]
    means, chosen = R.validation_choice(runs, ("relu", "tanh"))
    assert chosen == "tanh" == R.RECIPES["gap1d"]["activation"]
    first = {s: runs[s] for s in ("0", "1", "2")}
    three, _ = R.validation_choice(first, ("relu", "tanh"))
    cell = {a: three[a, "mean_field"] + three[a, "2dg"] for a in ("relu", "tanh")}
    assert abs(cell["relu"] - cell["tanh"]) < 0.03
    assert runs["3"]["relu"]["2dg"]["nll"] > 0 > runs["3"]["tanh"]["2dg"]["nll"]


def test_each_option_of_a_study_trains_on_its_own_loader(tmp_path):
    """``--select-tying --quick``: the tying touches only 2DG, so with a loader per option
    (not one shared, whose shuffles an option would inherit from the options before it)
    every option's MAP and mean-field fits are the same to the bit, and the record names
    the options in :data:`GAP_STUDIES`' order."""
    import regression as R

    argv = ["--select-tying", "--quick", "--seeds", "0", "--out", str(tmp_path), "--stem", "q"]
    assert R.main(argv) == 0
    runs = json.loads((tmp_path / "q.json").read_text())["runs"]["0"]
    assert tuple(runs) == R.TYINGS
    first = runs[R.TYINGS[0]]["mean_field"]
    assert all(runs[t]["mean_field"] == first for t in R.TYINGS[1:])
    assert len({runs[t]["2dg"]["nll"] for t in R.TYINGS}) == len(R.TYINGS)
    assert (
        R.gap_study_markdown("tying", json.loads((tmp_path / "q.json").read_text()))
        == (tmp_path / "q.md").read_text()
    )


def assert_same_runs(variant: dict, base: dict, problem: str, methods) -> None:
    """A variant run's ``methods`` on ``problem`` are the committed run's to the bit (the
    same recipe and seeds), but for their timings; their convergence records to float
    rounding."""
    for seed, runs in variant["runs"][problem].items():
        for m in methods:
            got, want = (
                {k: v for k, v in r[m].items() if k not in ("seconds", "convergence")}
                for r in (runs, base["runs"][problem][seed])
            )
            assert got == want, (problem, seed, m)
            got, want = (
                dict(r[m].get("convergence", {})) for r in (runs, base["runs"][problem][seed])
            )
            assert got.pop("site", None) == want.pop("site", None)
            assert got == pytest.approx(want, rel=1e-5), (problem, seed, m)


def tying_variant(tying: str) -> dict:
    """The committed ``--tying TYING --stem regression_TYING`` run, checked to be that."""
    doc = json.loads((RESULTS / f"regression_{tying}.json").read_text())
    assert (
        doc["command"]
        == f"python experiments/regression.py --tying {tying} --stem regression_{tying}"
    )
    assert all(r["tying"] == tying for r in doc["recipes"].values())
    assert f"the 2DG BNN's tying: {tying}." in (RESULTS / f"regression_{tying}.md").read_text()
    return doc


def test_the_tied_tying_on_both_problems_keeps_diabetes_targets(committed):
    """``--tying tied`` on both problems: on the gap it is the recipe, so its gap runs are
    the committed table's to the bit; on diabetes (where the recipe keeps the paper's
    representative tying) it keeps the three targets, at fewer than the recipe's 33x
    (one value per component drawn, more outliers kept) (regression_tied.md)."""
    import regression as R

    tied = tying_variant("tied")
    recipe = {p: r.get("tying", "representative") for p, r in R.RECIPES.items()}
    assert recipe == {"diabetes": "representative", "gap1d": "tied"}
    assert_same_runs(tied, committed, "gap1d", METHODS)
    assert_same_runs(tied, committed, "diabetes", ("deterministic", "mean_field", "mcmc"))
    checks = tied["checks"]
    assert checks[NLL]["met"] and checks[COVERAGE]["met"] and checks[RATIO]["met"]
    assert checks[RATIO]["value"] < committed["checks"][RATIO]["value"]


def test_the_papers_representative_tying_misses_the_gap(committed):
    """``--tying representative``: the paper's tying on both problems. Diabetes is the
    committed table's to the bit; on the gap only 2DG differs, and its ratio misses 1.5
    (mean-field's, the same run, meets it) (regression_representative.md)."""
    rep = tying_variant("representative")
    assert_same_runs(rep, committed, "diabetes", METHODS)
    assert_same_runs(rep, committed, "gap1d", ("deterministic", "mean_field", "mcmc"))
    checks = rep["checks"]
    assert checks[gap("mean_field")]["met"] and not checks[gap("2dg")]["met"]
    assert checks[gap("2dg")]["value"] < committed["checks"][gap("2dg")]["value"]


def test_the_stochastic_tying_misses_the_gap(committed):
    """``--tying stochastic`` (every draw takes each inlier weight from the whole mixture:
    a mixture posterior per weight, still independent across weights): the other
    methods' runs are the committed run's to the bit, diabetes keeps its three targets,
    and the gap's 2DG ratio misses 1.5 (regression_stochastic.md)."""
    stoch = tying_variant("stochastic")
    for problem in ("diabetes", "gap1d"):
        assert_same_runs(stoch, committed, problem, ("deterministic", "mean_field", "mcmc"))
    checks = stoch["checks"]
    assert checks[NLL]["met"] and checks[COVERAGE]["met"] and checks[RATIO]["met"]
    assert not checks[gap("2dg")]["met"]


def test_two_held_out_seeds_miss_two_targets_by_a_little_and_five_seeds_meet_all(committed):
    """``--seeds 3 4 --stem regression_seed34``, after the recipe was fixed: on these two
    seeds mean-field's gap ratio (1.47) and 2DG's diabetes coverage (0.835) miss; over
    the five seeds every target holds on the mean (the table's rule): the committed
    outcome rests on margins, which the docs state."""
    import regression as R

    held = json.loads((RESULTS / "regression_seed34.json").read_text())
    assert (
        held["command"] == "python experiments/regression.py --seeds 3 4 --stem regression_seed34"
    )
    assert held["recipes"] == committed["recipes"]
    assert {n for n, c in held["checks"].items() if not c["met"]} == {COVERAGE, gap("mean_field")}
    runs = {p: {**committed["runs"][p], **held["runs"][p]} for p in committed["runs"]}
    assert all(len(per_seed) == 5 for per_seed in runs.values())
    checks = R.checks(R.summarise(runs))
    assert all(c["met"] for c in checks.values()), checks
