"""Regression (issue 45): mean-field, 2DG, NUTS and a deterministic (MAP) network on
scikit-learn's diabetes data and on a 1-D problem with a gap.

    OMP_NUM_THREADS=1 python experiments/regression.py            # the committed run
    OMP_NUM_THREADS=1 python experiments/regression.py --quick    # a check that it runs

One recipe, fixed before the run, for every seed (``--seeds``: the split, the network's
initialisation and every draw):

* **diabetes** (:func:`~twodg_pyro.data.load_diabetes_split`: 354 training, 88 held-out
  patients, standardised): an MLP 10-50-1 (601 weights) under the layer-wise prior
  N(0, 1/fan_in), a Gaussian likelihood whose noise the MAP learns
  (``learn_scale=True``); mean-field by SVI on the true ELBO on the MAP's noise (chosen
  on validation, ``--select-noise``; 1,000 epochs, batch 128, Adam 1e-2); the 2DG BNN
  from it (8 components, quantile outliers, 300 stage-3 epochs, merge and Mahalanobis
  hooks every 50); the deterministic network: the MAP of the same model (Pyro's
  ``AutoDelta``, the same epochs), noise learnt with it; NUTS (2 chains of 200 warm-up
  and 200 kept iterations, tree depth <= 5) on the same model with the noise fixed at the
  MAP's (:func:`~twodg_pyro.methods.mcmc.run_mcmc` samples the weights).  Every method is
  a :class:`~twodg_pyro.methods.TrainedMethod` and predicts through it (a guide's 200
  seeded draws, the chains' 400 kept ones).  Metrics on the held-out patients: RMSE, the
  Gaussian NLL and the coverage of the central 50 / 90 / 95 % intervals of the
  moment-matched predictive (:func:`~twodg_pyro.metrics.regression_metrics`); and the
  trainable parameters of each (guide and noise).
* **the gap** (:func:`~twodg_pyro.data.load_gap1d_split`: 80 inputs in [-1.5, -0.5] and
  [0.5, 1.5], y = sin 3x + 0.1 noise): an MLP 1-32-32-1 (1,153 weights) of tanh units,
  the same prior and methods, 2DG in the ``tied`` tying, full batches; the MAP (3,000
  epochs) learns the noise from 0.1; mean-field and 2DG run, as NUTS does, on the MAP's
  noise (fixed), the mean-field means started at the MAP's weights and its scales at
  0.01, 30,000 epochs at Adam 1e-2 then 60,000 at 1e-3 (converged: :func:`convergence`,
  recorded per fit), still the untempered ELBO.
  The epistemic standard deviation (the noise left out) averaged over 49 inputs inside
  the gap against its average on the 80 training inputs.

How the recipe was chosen, on the training data only (seed 0 unless said), before the
committed run:

* the gap, with a learnt noise, the variational fits left ``sin 3x`` to the noise
  (sigma about 1.1, the targets' own spread) from a fresh network and from the MAP's
  weights alike (scales 1e-3 or 1e-2, Adam 1e-2 or 1e-3 on the means, prior scale 0.5,
  1 or 3): it is the true ELBO's optimum, not a stall: the flat fit's -ELBO is about 115
  (KL about 1, NLL 113) and a fit that follows the data, trained on the MAP's noise, costs
  about 275 nats of KL for its 160 nats of likelihood (-ELBO 230 to 380 over the last
  epochs).  On the MAP's noise the mean-field fit follows the data (training RMSE 0.135)
  and its KL moved 0.5 % over the last 1,000 epochs; its spread in the gap is 0.60x that
  on the data (2DG from it: 0.56x), so the 1.5x target was expected to be missed.
* diabetes: with 16 components 2DG kept 65 / 73 / 47 trainable parameters on seeds 0-2
  (most of them outliers from components below ``n_min``).  Tried on one seed: K = 8,
  ``n_min = 1``, no gradient outliers (29, 43, 41 trainable); K = 8, the widest margin,
  then on seeds 0-2 under the rule fixed before the run (>= 20x on every seed, 2DG's
  training NLL within 5 % of mean-field's): 33 / 31 / 35 trainable (36x to 39x), training
  NLL within 2.5 %.
* diabetes' noise, after the first committed run (its 2DG 90 % coverage was 0.958, above
  the 0.95 asked, on a learnt noise of 0.82 against the MAP's 0.65): chosen on a
  validation split of each seed's non-test patients (``--select-noise``; the test
  patients unused): the MAP's noise had the lower validation NLL for mean-field and 2DG
  on every seed.
* the gap's mean-field schedule, after the first committed run (6,000 epochs at 1e-2,
  3,000 at 1e-3; mean-field's gap ratio 1.495): its fit had not converged.  Traced once on
  seeds 0-2 (the training loss and each site's scales only): the first layer's scales
  (32 of the 1,153 weights) grew through a further 20,000 epochs at 1e-3 while the
  -ELBO fell (302 to 277 on seed 0), stalled at 1e-2 at 0.2-0.3 whatever the length, and
  settled only after 30,000 epochs at 1e-2 and 40,000-50,000 at 1e-3 (geometric mean
  0.52-0.58, -ELBO flat to 0.5 %).  The recipe takes 30,000 + 60,000 and records each
  fit's convergence.  2DG's stage 3 from the converged fit had no trend over 300, 1,000
  or 3,000 epochs (seed 0: its -ELBO by tenths within 277-297 at every length, the
  spread of its draws; a one-off trace): it stays at 300.
* the gap's settings, each after the gap target was missed, on a validation split of
  the gap problem's training inputs (:func:`select_gap`, one study at a time, each
  option on its own loader), scored by the validation NLL of mean-field and 2DG (the
  gap's spread recorded, not chosen on):

  - the activation (``--select-activation --seeds 0 1 2 3 4``,
    ``regression_activation.md``): tanh (-0.679 against ReLU's -0.614).  The first,
    unconverged schedule's study had chosen tanh; the converged one's, on seeds 0-2
    with one loader shared by its options, ReLU, a tie (-0.695 against -0.717 once the
    order of the options no longer moved the fits); two more seeds break it
    (``--activation relu``: the rejected option, ``regression_relu.md``);
  - the prior's gain (``--select-prior --activation tanh``,
    ``regression_prior_tanh.md``; under ReLU ``regression_prior_relu.md``): N(0,
    gain^2/fan_in) at gain 1, 2 and 3; a wider prior widens mean-field's gap ratio,
    but 2DG's 8 components fit the wider posteriors badly: gain 1 stays;
  - 2DG's tying (``--select-tying``, ``regression_tying.md``): ``tied`` (one draw per
    component, so the weights that share one move together: a posterior that is not
    factorised), -0.494 against the paper's ``representative`` (-0.328) and
    ``stochastic`` (-0.299); diabetes keeps ``representative``
    (``--tying representative``: the paper's on both problems,
    ``regression_representative.md``; ``--tying stochastic``,
    ``regression_stochastic.md``; ``--tying tied``, ``regression_tied.md``).

Writes ``experiments/results/regression.json`` / ``.md`` and ``regression_gap.png`` (the
predictive of each method over the gap problem, seed 0); the checks against the issue's
targets are computed from the table's own numbers (``tests/test_regression_results.py``).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from functools import partial
from pathlib import Path

import pyro
import torch
from common import check, command, setup
from pyro.infer.autoguide import AutoDelta

import twodg_pyro as tp
from twodg_pyro.data import load_dataset, load_diabetes_split, load_gap1d_split
from twodg_pyro.evaluation import prediction_metrics
from twodg_pyro.files import atomic_write_text, jsonable
from twodg_pyro.infer.callbacks import site_median_scales
from twodg_pyro.methods import GuidePosterior, TrainedMethod
from twodg_pyro.methods.mcmc import run_mcmc
from twodg_pyro.models import MLP
from twodg_pyro.pipeline.methods.mean_field import largest_site_change

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ("deterministic", "mean_field", "2dg", "mcmc")
#: ``--quick`` divides every epoch and iteration count by this (each kept at least 1; NUTS's
#: at least 2): a check that the script runs end to end, whose numbers mean nothing
QUICK = 500


def scaled(count: int, scale: int) -> int:
    """``count`` epochs divided by ``scale`` (``--quick``), at least one."""
    return max(1, count // scale)


#: the recipe, per problem (``--quick`` divides the epochs and iterations)
RECIPES = {
    # mean-field and 2DG on the MAP's noise: chosen on a validation split of the non-test
    # patients (--select-noise, regression_noise_selection.md: NLL 1.101 / 1.113 against
    # 1.144 / 1.184 on a learnt noise, which the variational fits inflated to 0.84)
    "diabetes": {
        "hidden": (50,),
        "batch": 128,
        "mf_epochs": 1000,
        "stage3_epochs": 300,
        "variational_noise": "map",
    },
    # the learnt noise starts at 0.1 (standard units): from 1, the targets' own spread, the
    # prior's pull won at once and every fit, the MAP's too, stayed flat (sigma 1.000,
    # test RMSE 1.03; the data's noise is 0.139), and NUTS took that MAP's noise.
    # Mean-field and 2DG: with a learnt noise the true ELBO's optimum is the flat function
    # (sigma about 1.1, -ELBO about 115 on seed 0, even started from the MAP): a fit that
    # follows the data costs about 275 nats of KL for its 160 nats of likelihood, so
    # mean-field and 2DG run, as NUTS does, on the MAP's noise (fixed), their means started
    # at the MAP's weights, their scales at 0.01, 30,000 epochs at Adam 1e-2 then 60,000 at
    # 1e-3: run to convergence.  The first recipe's 6,000 + 3,000 stopped while the first
    # layer's scales still grew (geometric mean 0.17 against 0.52-0.58 settled, seeds 0-2),
    # though the KL moved 0.5 % over its last 1,000 epochs and the median scale of all
    # weights stood still; at 1e-2 alone they stall at 0.2-0.3 (the noise of the means)
    "gap1d": {
        "hidden": (32, 32),
        # chosen on a validation split of the training inputs (--select-activation,
        # regression_activation.md, five seeds): the mean validation NLL of mean-field +
        # 2DG is -0.679 for tanh against -0.614 for ReLU.  On seeds 0-2 alone it was a tie
        # (-0.717 against -0.695; the three-seed study, whose options shared one loader,
        # had chosen ReLU), and seed 3 decides most of it (ReLU's 2DG at 0.013 there).
        # The first schedule's study, unconverged, had chosen tanh too.
        "activation": "tanh",
        # chosen on the validation split as the activation was (--select-prior
        # --activation tanh, regression_prior_tanh.md): gain 1 (-0.717 for mean-field +
        # 2DG) against 2 (0.515) and 3 (4.047); the wider priors widen mean-field's gap
        # ratio (1.60x, 1.84x on validation) but 2DG's 8 components no longer fit its
        # posterior (validation NLL 0.93, 4.49).  Under ReLU too (regression_prior_relu.md)
        "prior_gain": 1.0,
        # chosen on the validation split as the activation was (--select-tying,
        # regression_tying.md): 2DG's validation NLL is -0.494 tied against -0.328
        # representative (the paper's) and -0.299 stochastic; mean-field is the same in
        # each.  Diabetes keeps the paper's representative tying (studied on the gap only)
        "tying": "tied",
        "batch": 80,
        "map_epochs": 3000,
        "mf_epochs": 30000,
        "mf_decay_epochs": 60000,
        "stage3_epochs": 300,
        "noise_init": 0.1,
        "variational_noise": "map",
        "mf_from_map": True,
        "mf_init_scale": 0.01,
    },
}
SHARING = {
    "outlier_rule": "quantile",
    "mu_quantile": 0.995,
    "grad_percentile": 0.005,
    "n_components": 8,
    "n_min": 5,
}
#: NUTS: Pyro's sampler costs about 8 ms a leapfrog step here whatever the network, and
#: deeper trees saturate on these posteriors: 31 steps an iteration at most
NUTS = {"num_chains": 2, "warmup_steps": 200, "num_samples": 200, "max_tree_depth": 5}
DRAWS = 200
#: the 2DG BNN's tying (``--tying``): the paper's ``representative``; ``tied`` shares one
#: draw per component, a posterior whose weights are correlated (not factorised)
TYINGS = ("representative", "stochastic", "tied")
TARGETS = {"nll_within": 0.05, "coverage_90": (0.85, 0.95), "ratio": 20.0, "gap_ratio": 1.5}


def new_model(
    split, recipe: dict, seed: int, noise: tp.Gaussian | None = None, noise_init: float = 1.0
) -> tp.BNNModel:
    """The problem's BNN: the recipe's MLP (``hidden``, ``activation``, default ReLU),
    N(0, gain^2/fan_in) (``prior_gain``, default 1), a learnt Gaussian noise starting at
    ``noise_init`` (or the given likelihood)."""
    pyro.clear_param_store()  # AutoDelta keeps its values there
    torch.manual_seed(seed)
    pyro.set_rng_seed(seed)
    net = MLP(split.input_shape[0], recipe["hidden"], 1, recipe.get("activation", "relu"))
    lik = noise or tp.Gaussian(len(split.train), scale=noise_init, learn_scale=True)
    prior = tp.LayerwiseNormalPrior(recipe.get("prior_gain", 1.0))
    return tp.BNNModel(net, prior=prior, likelihood=lik)


def trainable(model, guide) -> int:
    """Trainable parameters: the guide's and the model's (the learnt noise)."""
    return sum(p.numel() for m in (guide, model) for p in m.parameters() if p.requires_grad)


def map_noise_model(split, recipe: dict, seed: int, det) -> tp.BNNModel:
    """The problem's BNN with its noise fixed at the MAP network ``det``'s (NUTS's model,
    and the variational fits' with ``variational_noise = "map"``)."""
    noise = tp.Gaussian(len(split.train), det.likelihood.scale)
    return new_model(split, recipe, seed, noise)


def fit_map(split, recipe: dict, seed: int, loader, scale: int = 1):
    """The deterministic network: the MAP of the problem's model (Pyro's ``AutoDelta``),
    its noise learnt with it; ``(model, guide, seconds)``."""
    det = new_model(split, recipe, seed, noise_init=recipe.get("noise_init", 1.0))
    t0 = time.perf_counter()
    delta = AutoDelta(det)
    map_epochs = scaled(recipe.get("map_epochs", recipe["mf_epochs"]), scale)
    tp.fit(det, delta, loader, epochs=map_epochs, lr=1e-2, progress=False)
    return det, delta, time.perf_counter() - t0


def fit_variational(split, recipe: dict, seed: int, loader, scale, det, delta, noise=None):
    """Mean-field (on a learnt noise, or the MAP's with ``variational_noise = "map"``;
    from a fresh network or the MAP's weights), then 2DG from it in the recipe's
    ``tying`` (default ``representative``):
    ``{"mean_field": (trained, seconds, convergence), "2dg": (...)}`` (:func:`convergence`
    of each fit).  ``noise`` (``"learnt"`` / ``"map"``) overrides the recipe's."""
    mf_epochs, s3_epochs = (
        scaled(recipe["mf_epochs"], scale),
        scaled(recipe["stage3_epochs"], scale),
    )
    every = max(1, s3_epochs // 6)
    on_map = (noise or recipe.get("variational_noise", "learnt")) == "map"
    if on_map:
        model = map_noise_model(split, recipe, seed, det)
    else:
        model = new_model(split, recipe, seed, noise_init=recipe.get("noise_init", 1.0))
    if recipe.get("mf_from_map"):
        means = {k: v.detach().clone() for k, v in delta.median().items()}
        guide = tp.MeanFieldGuide(model, init_scale=recipe["mf_init_scale"], init_loc=means)
    else:
        guide = tp.MeanFieldGuide(model)
    t0 = time.perf_counter()
    phases = [(mf_epochs, 1e-2)]
    if recipe.get("mf_decay_epochs"):  # then a tenth of the learning rate
        phases.append((scaled(recipe["mf_decay_epochs"], scale), 1e-3))
    for epochs, lr in phases[:-1]:
        tp.fit(model, guide, loader, epochs=epochs, lr=lr, progress=False)
    # the last phase in two calls, its last tenth apart, for the convergence record
    epochs, lr = phases[-1]
    head = epochs - max(1, epochs // 10)
    state = tp.fit(model, guide, loader, epochs=head, lr=lr, progress=False)
    before = site_median_scales(guide)
    state = tp.fit(model, guide, loader, epochs=epochs, lr=lr, progress=False, state=state)
    mf_seconds = time.perf_counter() - t0
    mf_record = convergence(state.history, site_median_scales(guide), before)
    t0 = time.perf_counter()
    model2 = copy.deepcopy(model)
    structure, _ = tp.build_sharing(model2, guide, loader, tp.SharingConfig(**SHARING))
    shared = tp.SharedGMMGuide(model2, structure, tying=recipe.get("tying", "representative"))
    hooks = [
        tp.MergeHook(tau_d=1e-2, data=loader, every=every, until_fixed_point=False),
        tp.MahalanobisHook(every=every, until_fixed_point=False),
    ]
    s3 = tp.fit(model2, shared, loader, epochs=s3_epochs, lr=1e-2, callbacks=hooks, progress=False)
    return {
        "mean_field": (GuidePosterior(model, guide), mf_seconds, mf_record),
        "2dg": (GuidePosterior(model2, shared), time.perf_counter() - t0, convergence(s3.history)),
    }


def convergence(history: list[dict], after: dict | None = None, before: dict | None = None):
    """Whether a fit settled: the relative change of its mean loss (the -ELBO) between
    the last two tenths of its epochs; that difference over its standard error
    (``loss_z``: below 3 or so, no trend beyond the noise of the draws); and, given each
    site's median scale at the start of the last tenth (``before``) and at the end
    (``after``), the largest relative change of a site's median scale and that ``site``.
    Each site on its own: the gap network's first layer (32 of its 1,153 weights)
    drifted for tens of thousands of epochs while the median over all weights stood
    still."""
    tenth = max(1, len(history) // 10)
    last = torch.tensor([h["loss"] for h in history[-tenth:]], dtype=torch.float64)
    earlier = history[-2 * tenth : -tenth] or history[:1]
    prev = torch.tensor([h["loss"] for h in earlier], dtype=torch.float64)
    diff = float(last.mean() - prev.mean())
    # the difference over its standard error: a trend, or the noise of the draws
    se = math.sqrt(sum(float(v.var()) / len(v) for v in (last, prev) if len(v) > 1))
    out = {
        "loss_change": abs(diff / float(prev.mean())),
        "loss_z": abs(diff) / se if se > 0 else None,  # one epoch a tenth: no spread
        "over_epochs": tenth,
    }
    if before and after:
        site, out["site_scale_change"] = largest_site_change(before, after)
        out["site"] = site
    return out


def select_noise(seeds: list[int], quick: bool) -> dict:
    """Diabetes' noise for mean-field and 2DG chosen on a validation split (20 % of all
    patients, carved from the non-test ones; the test patients play no part): the learnt
    noise against the MAP's, each scored by the Gaussian NLL and interval coverage of the
    validation patients; ``{seed: {noise: {method: metrics}}}``."""
    recipe, scale = RECIPES["diabetes"], QUICK if quick else 1
    out: dict = {}
    for seed in seeds:
        split = load_diabetes_split(val_fraction=0.2, test_fraction=0.2, seed=seed)
        loader = tp.make_loader(split.train, recipe["batch"], shuffle=True, seed=seed)
        det, delta, _ = fit_map(split, recipe, seed, loader, scale)
        out[seed] = {}
        for noise in ("learnt", "map"):
            fits = fit_variational(split, recipe, seed, loader, scale, det, delta, noise)
            out[seed][noise] = {
                m: {
                    **prediction_metrics(t.predict(split.val.tensors, DRAWS, seed)),
                    "noise_scale": t.likelihood.scale,
                }
                for m, (t, *_) in fits.items()
            }
            print(seed, noise, {m: round(r["nll"], 3) for m, r in out[seed][noise].items()})
    return out


def gap_spread(trained: TrainedMethod, split, seed: int) -> dict:
    """The gap problem's epistemic standard deviation, averaged on the training inputs
    and in the gap (``DRAWS`` draws seeded with ``seed``), and their ratio."""
    on_data, in_gap = (
        trained.predict(d, DRAWS, seed).epistemic_std.mean()
        for d in (split.train.tensors, split.info["gap_x"])
    )
    return {
        "epistemic_on_data": float(on_data),
        "epistemic_in_gap": float(in_gap),
        "gap_ratio": float(in_gap / on_data),
    }


def validation_choice(runs: dict, options: tuple[str, ...]) -> tuple[dict, str]:
    """The studies' rule: ``{(option, method): mean validation NLL}`` over the seeds of
    ``runs`` (``{seed: {option: {method: metrics}}}``) and the option whose mean-field and
    2DG NLLs sum lowest."""
    means = {
        (o, m): mean_sd([runs[s][o][m]["nll"] for s in runs])["mean"]
        for o in options
        for m in ("mean_field", "2dg")
    }
    return means, min(options, key=lambda o: means[o, "mean_field"] + means[o, "2dg"])


#: the gap problem's settings chosen on a validation split, one at a time in this order
#: (each study runs the recipe otherwise, the settings studied after it at their first
#: option: :func:`select_gap`): recipe key -> (its name in the tables, options)
GAP_STUDIES = {
    "activation": ("activation", ("relu", "tanh")),
    # the prior's gain (LayerwiseNormalPrior: N(0, gain^2 / fan_in)): studied after the
    # gap target was missed again, when a probe on seed 0 saw the gain move the
    # mean-field gap ratio (the ratio is recorded, not chosen on); gain 1 stays under
    # tanh and ReLU alike (regression_prior_tanh.md, regression_prior_relu.md)
    "prior_gain": ("prior gain", (1.0, 2.0, 3.0)),
    # the 2DG BNN's tying (TYINGS), mean-field the same in each: its validation NLL alone
    # decides; studied after the gap target was missed under the chosen activation
    "tying": ("tying", TYINGS),
}


def option_label(option) -> str:
    """An option as the study's records and tables name it (``relu``, ``2``)."""
    return option if isinstance(option, str) else f"{option:g}"


def select_gap(key: str, seeds: list[int], quick: bool) -> dict:
    """The gap problem's ``key`` (:data:`GAP_STUDIES`: the activation, ReLU against tanh;
    the prior's gain; 2DG's tying) chosen on a validation split (the last 20 % of its 80 training
    inputs; the test inputs and the gap play no part): the MAP, mean-field and 2DG of
    each option, scored by the validation Gaussian NLL; the gap's spread ratio recorded
    beside it, not chosen on; ``{seed: {option: {method: metrics}}}``.

    Each option of a seed trains on its own loader, shuffled from the seed, so an
    option's fits do not depend on the options run before it (with one loader shared,
    the order of the one batch moved the rounding and the long fits amplified it: seed
    2's 2DG by 0.16 in validation NLL, by the order of the options alone).

    The studies were made in :data:`GAP_STUDIES`' order, and each holds the settings
    studied after it at their first option, the value they had when it was made (the
    activation study runs gain 1 and the representative tying), so a committed study
    reproduces whatever the later studies chose."""
    scale = QUICK if quick else 1
    split = load_gap1d_split(val_fraction=0.2)
    order = list(GAP_STUDIES)
    later = {k: GAP_STUDIES[k][1][0] for k in order[order.index(key) + 1 :]}
    out: dict = {}
    for seed in seeds:
        out[seed] = {}
        for option in GAP_STUDIES[key][1]:
            recipe = dict(RECIPES["gap1d"], **later, **{key: option})
            loader = tp.make_loader(split.train, recipe["batch"], shuffle=True, seed=seed)
            det, delta, _ = fit_map(split, recipe, seed, loader, scale)
            fits = fit_variational(split, recipe, seed, loader, scale, det, delta)
            runs = out[seed][option_label(option)] = {}
            for m, (t, *_) in fits.items():
                runs[m] = {
                    **prediction_metrics(t.predict(split.val.tensors, DRAWS, seed)),
                    "gap_ratio": gap_spread(t, split, seed)["gap_ratio"],
                }
            print(seed, option_label(option), {m: round(r["nll"], 3) for m, r in runs.items()})
    return out


def gap_study_markdown(key: str, payload: dict) -> str:
    """A gap study's table and its choice (the lower mean validation NLL)."""
    runs, (name, options) = payload["runs"], GAP_STUDIES[key]
    lines = [
        f"# Regression: the gap problem's {name}, chosen on validation",
        "",
        f"`{payload['command']}`. The last 16 of the 80 training inputs are the validation "
        "set; the MAP network learns the noise; mean-field and 2DG (the recipe otherwise) "
        "train on the MAP's. Means over seeds of the validation NLL, and the epistemic "
        "spread in the gap over that on the training inputs (recorded, not chosen on).",
        "",
        f"| {name} | method | validation Gaussian NLL | gap ratio |",
        "|---|---|---|---|",
    ]
    means, chosen = validation_choice(runs, tuple(map(option_label, options)))
    for option, m in means:
        ratio = mean_sd([runs[s][option][m]["gap_ratio"] for s in runs])
        nll = means[option, m]
        lines.append(f"| {option} | {m} | {nll:.3f} | {ratio['mean']:.2f} ± {ratio['sd']:.2f} |")
    lines += ["", f"Chosen (lower validation NLL, mean-field and 2DG together): **{chosen}**."]
    return "\n".join(lines) + "\n"


def selection_markdown(payload: dict) -> str:
    """The noise study's table and its choice (the lower mean validation NLL)."""
    runs, lines = payload["runs"], []
    lines += [
        "# Regression: diabetes' noise for mean-field and 2DG, chosen on validation",
        "",
        f"`{payload['command']}`. Each seed's non-test patients split again: 20 % of all "
        "patients for validation, the rest for training; the MAP network learns the noise; "
        "mean-field and 2DG (the recipe otherwise) train on a learnt noise or on the "
        "MAP's. Means over seeds of the validation patients' scores.",
        "",
        "| noise | method | Gaussian NLL | 50 % cov. | 90 % cov. | noise sigma |",
        "|---|---|---|---|---|---|",
    ]
    means, chosen = validation_choice(runs, ("learnt", "map"))
    for noise, m in means:
        recs = [runs[s][noise][m] for s in runs]
        row = {k: mean_sd([r[k] for r in recs])["mean"] for k in recs[0]}
        lines.append(
            f"| {noise} | {m} | {row['nll']:.3f} | {row['coverage_50']:.3f} "
            f"| {row['coverage_90']:.3f} | {row['noise_scale']:.3f} |"
        )
    lines += ["", f"Chosen (lower validation NLL, mean-field and 2DG together): **{chosen}**."]
    return "\n".join(lines) + "\n"


def run_problem(name: str, seed: int, quick: bool) -> dict:
    """Every method on one problem and seed: ``{method: record}`` with each method's
    predictions on the test set (diabetes) or its epistemic spread (the gap)."""
    recipe = RECIPES[name]
    scale = QUICK if quick else 1
    split = load_dataset(name, seed=seed) if name == "diabetes" else load_dataset(name)
    x, y = split.train.tensors
    x_test, y_test = split.test.tensors
    loader = tp.make_loader(split.train, recipe["batch"], shuffle=True, seed=seed)
    out: dict = {}

    def record(method, trained: TrainedMethod, seconds: float, n_trainable: int | None = None):
        """The method's metrics on the test set (and the gap's spread), every prediction
        through the protocol: ``DRAWS`` draws seeded with the run's seed (the chains: all
        their kept draws)."""

        def pred(data):
            return trained.predict(data, DRAWS, seed)

        rec = {**prediction_metrics(pred((x_test, y_test))), "seconds": round(seconds, 1)}
        rec["noise_scale"] = trained.likelihood.scale
        rec["draws"] = trained.num_draws(DRAWS)
        if n_trainable is not None:  # NUTS trains nothing
            rec["trainable"] = n_trainable
        if name == "gap1d" and method != "deterministic":  # a MAP has no epistemic spread
            rec.update(gap_spread(trained, split, seed))
            rec["curve"] = pred(split.info["grid_x"])
        out[method] = rec

    det, delta, seconds = fit_map(split, recipe, seed, loader, scale)
    record("deterministic", GuidePosterior(det, delta), seconds, trainable(det, delta))
    fits = fit_variational(split, recipe, seed, loader, scale, det, delta)
    for method, (trained, seconds, settled) in fits.items():
        record(method, trained, seconds, trainable(trained.model, trained.guide))
        out[method]["convergence"] = settled
    out["2dg"]["counts"] = fits["2dg"][0].guide.structure().counts()
    # NUTS on the same model, the noise fixed at the MAP's
    fixed = map_noise_model(split, recipe, seed, det)
    nuts = {k: max(2, v // scale) if k != "num_chains" else v for k, v in NUTS.items()}
    t0 = time.perf_counter()
    posterior = run_mcmc(fixed, (x, y), seed=seed, **nuts)
    record("mcmc", posterior, time.perf_counter() - t0)
    out["mcmc"]["divergences"] = int(posterior.sample_stats["diverging"].sum())
    return out


def mean_sd(values: list[float]) -> dict:
    t = torch.tensor(values, dtype=torch.float64)
    return {"mean": float(t.mean()), "sd": float(t.std()) if len(values) > 1 else 0.0}


def summarise(runs: dict) -> dict:
    """``{problem: {method: {field: {mean, sd}}}}`` over the seeds."""
    fields = {
        "diabetes": (
            "rmse",
            "nll",
            "coverage_50",
            "coverage_90",
            "coverage_95",
            "trainable",
            "noise_scale",
        ),
        "gap1d": ("rmse", "noise_scale", "epistemic_on_data", "epistemic_in_gap", "gap_ratio"),
    }
    table = {}
    for problem, per_seed in runs.items():
        table[problem] = {}
        for method in METHODS:
            recs = [r[method] for r in per_seed.values()]
            table[problem][method] = {
                f: mean_sd([r[f] for r in recs]) for f in fields[problem] if f in recs[0]
            }
            table[problem][method]["seconds"] = mean_sd([r["seconds"] for r in recs])
    return table


def checks(table: dict) -> dict:
    """The issue's targets, from the table's means (the gap's ``>= 1.5``, fixed before the
    run, is stricter than the issue's "larger in the gap than on the data")."""
    d, g = table["diabetes"], table["gap1d"]
    mf_nll, dg_nll = d["mean_field"]["nll"]["mean"], d["2dg"]["nll"]["mean"]
    rel = (dg_nll - mf_nll) / abs(mf_nll)
    cov = d["2dg"]["coverage_90"]["mean"]
    ratio = d["mean_field"]["trainable"]["mean"] / d["2dg"]["trainable"]["mean"]
    within, (low, high) = TARGETS["nll_within"], TARGETS["coverage_90"]
    out = {
        "diabetes: 2DG NLL within 5 % of mean-field": check(
            rel, f"|rel| <= {within}", abs(rel) <= within
        ),
        "diabetes: 2DG 90 % coverage in [0.85, 0.95]": check(
            cov, f"in [{low}, {high}]", low <= cov <= high
        ),
        "diabetes: mean-field / 2DG trainable >= 20": check(
            ratio, f">= {TARGETS['ratio']:g}", ratio >= TARGETS["ratio"]
        ),
    }
    for m in ("mean_field", "2dg", "mcmc"):
        r = g[m]["gap_ratio"]["mean"]
        out[f"gap: {m} epistemic std in the gap / on the data >= 1.5"] = check(
            r, f">= {TARGETS['gap_ratio']:g}", r >= TARGETS["gap_ratio"]
        )
    return out


def convergence_text(runs: dict) -> str:
    """One sentence on how far the variational fits of ``runs`` (``{seed: {method:
    record}}``) still moved at their end: the largest change over the seeds."""
    parts = []
    for m in ("mean_field", "2dg"):
        recs = [r[m]["convergence"] for r in runs.values() if "convergence" in r[m]]
        if not recs:
            continue
        text = f"{m} -ELBO {100 * max(c['loss_change'] for c in recs):.2f} %"
        if all(c["loss_z"] is not None for c in recs):
            text += f" ({max(c['loss_z'] for c in recs):.1f} standard errors)"
        if all("site_scale_change" in c for c in recs):
            worst = max(recs, key=lambda c: c["site_scale_change"])
            text += (
                f", every site's median scale within {100 * worst['site_scale_change']:.2f} % "
                f"(`{worst['site']}`)"
            )
        parts.append(text)
    return (
        "Convergence (the last tenth of each fit's epochs against the tenth before, the "
        "largest over the seeds): " + "; ".join(parts) + "."
    )


def tying_text(recipes: dict) -> str:
    """The 2DG BNN's tying of each problem, as the table's header states it (one word
    when the problems share it)."""
    tyings = {p: r.get("tying", "representative") for p, r in recipes.items()}
    if len(set(tyings.values())) == 1:
        return next(iter(tyings.values()))
    return ", ".join(f"{t} ({'the gap' if p == 'gap1d' else p})" for p, t in tyings.items())


def markdown(payload: dict) -> str:
    t, lines = payload["table"], []
    seeds = ", ".join(map(str, payload["seeds"]))
    lines += [
        "# Regression: diabetes and the 1-D gap",
        "",
        f"`{payload['command']}` (seeds {seeds}; mean ± sd over the seeds; "
        f"{payload['seconds'] / 60:.0f} min). Recipe: `experiments/regression.py`; the 2DG "
        f"BNN's tying: {tying_text(payload['recipes'])}.",
        "",
        "## diabetes (88 held-out patients, standardised targets)",
        "",
        "| method | RMSE | Gaussian NLL | 50 % cov. | 90 % cov. | 95 % cov. | trainable |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in METHODS:
        r = t["diabetes"][m]
        cells = [f"{r[f]['mean']:.3f} ± {r[f]['sd']:.3f}" for f in ("rmse", "nll")]
        cells += [f"{r[f]['mean']:.3f}" for f in ("coverage_50", "coverage_90", "coverage_95")]
        cells.append(f"{r['trainable']['mean']:,.0f}" if "trainable" in r else "-")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    per_seed = [
        r["mean_field"]["trainable"] / r["2dg"]["trainable"]
        for r in payload["runs"]["diabetes"].values()
    ]
    noise = ", ".join(f"{m} {t['diabetes'][m]['noise_scale']['mean']:.3f}" for m in METHODS)
    ratios = ", ".join(f"{v:.1f}x" for v in per_seed)
    lines += [
        "",
        "The deterministic row is the MAP network (its noise learnt with it); mean-field, "
        "2DG and `mcmc` (NUTS) run on the same model with the noise fixed at the MAP's "
        "(chosen on validation for the variational fits: regression_noise_selection.md; "
        "NUTS's draws are not trained: no trainable count). Coverage: the share of "
        "held-out targets inside the central interval of the moment-matched predictive "
        "N(mean, std^2). Mean-field / 2DG "
        f"trainable parameters per seed: {ratios}. Noise sigma (standard units): {noise}. "
        + convergence_text(payload["runs"]["diabetes"]),
        "",
        "## the 1-D gap (epistemic standard deviation, the noise left out)",
        "",
        "| method | on the training inputs | in the gap | ratio | noise sigma | test RMSE |",
        "|---|---|---|---|---|---|",
    ]
    for m in METHODS:
        r = t["gap1d"][m]
        cells = ["-", "-", "-"]  # a MAP has no epistemic spread
        if "gap_ratio" in r:
            cells = [
                f"{r['epistemic_on_data']['mean']:.3f}",
                f"{r['epistemic_in_gap']['mean']:.3f}",
                f"{r['gap_ratio']['mean']:.2f} ± {r['gap_ratio']['sd']:.2f}",
            ]
        cells += [f"{r['noise_scale']['mean']:.3f}", f"{r['rmse']['mean']:.3f}"]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"The data's noise is {payload['gap_noise']:.3f} in standard units (0.1 over the "
        "targets' standard deviation). Mean-field and 2DG run, as NUTS does, on the MAP's "
        "noise (fixed), their means started at the MAP's weights: with a learnt noise the "
        "true ELBO's optimum is the flat function (sigma about 1.1, test RMSE about 1.03; "
        "see the recipe). The predictive of each: "
        f"`{payload.get('stem', 'regression')}_gap.png`. Ratio per seed: "
        + "; ".join(
            f"{m} "
            + ", ".join(f"{r[m]['gap_ratio']:.2f}" for r in payload["runs"]["gap1d"].values())
            for m in METHODS[1:]
        )
        + ". "
        + convergence_text(payload["runs"]["gap1d"]),
    ]
    lines += ["", "## the issue's targets", "", "| target | value | met |", "|---|---|---|"]
    for name, c in payload["checks"].items():
        lines.append(f"| {name} | {c['value']:.3f} | {'yes' if c['met'] else 'no'} |")
    missed = [name for name, c in payload["checks"].items() if not c["met"]]
    lines += [
        "",
        "Values: the relative NLL difference (2DG - mean-field) / |mean-field|, the mean "
        "coverage, the ratio of trainable parameters, the ratio of the mean epistemic "
        "standard deviations (the gap's 1.5, fixed before the run, is stricter than the "
        "issue's 'larger in the gap than on the data').",
        "",
        "**Missed:** " + "; ".join(missed) + "." if missed else "Every target is met.",
    ]
    return "\n".join(lines) + "\n"


def plot(curves: dict, split, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mean, std = float(split.info["input_mean"]), float(split.info["input_std"])
    grid = split.info["grid_x"][:, 0] * std + mean
    x, y = split.train.tensors
    fig, axes = plt.subplots(1, len(curves), figsize=(4 * len(curves), 3), sharey=True)
    for ax, (method, p) in zip(axes, curves.items(), strict=True):
        ax.scatter(x[:, 0] * std + mean, y, s=6, c="k")
        ax.plot(grid, p.mean, c="C0")
        for sd, alpha in ((p.std, 0.2), (p.epistemic_std, 0.4)):
            ax.fill_between(grid, p.mean - 2 * sd, p.mean + 2 * sd, color="C0", alpha=alpha)
        ax.set_title(method)
        ax.set_ylim(-3.5, 3.5)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument(
        "--quick", action="store_true", help="a check that it runs: QUICK times fewer steps"
    )
    p.add_argument("--out", default=str(RESULTS), help="folder of the results")
    p.add_argument("--stem", default=None, help="output name (default: regression)")
    p.add_argument(
        "--activation",
        choices=("relu", "tanh"),
        default=None,
        help="the gap network's activation instead of the recipe's (validation's choice)",
    )
    p.add_argument(
        "--tying",
        choices=TYINGS,
        default=None,
        help="the 2DG BNN's tying on both problems instead of the recipe's",
    )
    p.add_argument(
        "--select-noise",
        action="store_true",
        help="diabetes' noise (learnt or the MAP's) chosen on a validation split",
    )
    p.add_argument(
        "--select-activation",
        action="store_true",
        help="the gap problem's activation (ReLU or tanh) chosen on a validation split",
    )
    p.add_argument(
        "--select-prior",
        action="store_true",
        help="the gap problem's prior gain (1, 2 or 3) chosen on a validation split",
    )
    p.add_argument(
        "--select-tying",
        action="store_true",
        help="the gap problem's 2DG tying chosen on a validation split",
    )
    args = p.parse_args(argv)
    setup(threads=1)
    if args.activation:
        RECIPES["gap1d"]["activation"] = args.activation
    if args.tying:
        for recipe in RECIPES.values():
            recipe["tying"] = args.tying
    studies = {
        "select_noise": ("regression_noise_selection", select_noise, selection_markdown),
        **{
            f"select_{flag}": (stem, partial(select_gap, key), partial(gap_study_markdown, key))
            for flag, key, stem in (
                ("activation", "activation", "regression_activation"),
                ("prior", "prior_gain", "regression_prior"),
                ("tying", "tying", "regression_tying"),
            )
        },
    }
    for flag, (default_stem, study, text) in studies.items():
        if not getattr(args, flag):
            continue
        stem = args.stem or default_stem
        payload = {"command": command("regression.py", argv), "runs": study(args.seeds, args.quick)}
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / f"{stem}.json", json.dumps(jsonable(payload), indent=2))
        atomic_write_text(out / f"{stem}.md", text(payload))
        print(text(payload))
        return 0
    stem = args.stem or ("regression_quick" if args.quick else "regression")
    t0 = time.perf_counter()
    runs = {"diabetes": {}, "gap1d": {}}
    for seed in args.seeds:
        for problem in runs:
            runs[problem][seed] = run_problem(problem, seed, args.quick)
            print(problem, seed, {m: r.get("nll") for m, r in runs[problem][seed].items()})
    first = runs["gap1d"][args.seeds[0]]
    curves = {m: first[m].pop("curve") for m in ("mean_field", "2dg", "mcmc")}
    for per_seed in runs["gap1d"].values():
        for rec in per_seed.values():
            rec.pop("curve", None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plot(curves, load_dataset("gap1d"), out / f"{stem}_gap.png")
    table = summarise(runs)
    gap = load_dataset("gap1d")
    payload = {
        "command": command("regression.py", argv),
        "quick": args.quick,
        "seeds": args.seeds,
        "recipes": RECIPES,
        "sharing": SHARING,
        "nuts": NUTS,
        "draws": DRAWS,
        "gap_noise": gap.info["noise"] / gap.info["target_std"],
        "runs": runs,
        "table": table,
        "checks": checks(table),
        "seconds": time.perf_counter() - t0,
        "stem": stem,
    }
    atomic_write_text(out / f"{stem}.json", json.dumps(jsonable(payload), indent=2))
    atomic_write_text(out / f"{stem}.md", markdown(payload))
    print(markdown(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
