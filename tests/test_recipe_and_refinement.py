"""The real-image recipe (pretrained prior, KL weight, SGD pretraining, presets) and
refinement hooks that keep the model intact."""

import json

import pytest
import torch
from test_shared_gmm_guide import make
from torch import nn

from twodg_pyro.baselines import train_deterministic
from twodg_pyro.baselines.deterministic import _epoch_lr
from twodg_pyro.bnn import BNNModel
from twodg_pyro.cli import main
from twodg_pyro.data import make_loader
from twodg_pyro.guides import MeanFieldGuide, SharedGMMGuide
from twodg_pyro.infer import DecomposedELBO, fit
from twodg_pyro.io import load_2dg, save_2dg
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.metrics import accuracy
from twodg_pyro.pipeline import ConfigError, config_from_dict
from twodg_pyro.pipeline.settings.presets import PRESETS, preset
from twodg_pyro.prediction import predict
from twodg_pyro.priors import PretrainedPrior
from twodg_pyro.sharing import MahalanobisHook, MergeHook


def _kl_normal(m1, s1, m2, s2):
    return torch.log(s2 / s1) + (s1**2 + (m1 - m2) ** 2) / (2 * s2**2) - 0.5


# ---------------------------------------------------------------- pretrained prior
def test_pretrained_prior_is_centred_at_the_network_and_validated():
    net = nn.Linear(3, 2)
    prior = PretrainedPrior.from_network(net, scale=0.1, delta=0.5)
    model = BNNModel(net, prior=prior, likelihood=Categorical(10))
    site = model.sites[0]
    d = model.prior_distribution(site)
    torch.testing.assert_close(d.base_dist.loc, net.weight.detach())
    torch.testing.assert_close(d.base_dist.scale, 0.1 + 0.5 * net.weight.detach().abs())
    with pytest.raises(ValueError, match="scale"):
        PretrainedPrior.from_network(net, scale=0.0)
    with pytest.raises(ValueError, match="delta"):
        PretrainedPrior.from_network(net, delta=-1.0)
    with pytest.raises(ValueError, match="NaN"):
        PretrainedPrior({"weight": torch.tensor([float("nan")])})
    with pytest.raises(KeyError, match="no centre"):
        PretrainedPrior({}).site_distribution(site)


def test_mean_field_kl_under_the_pretrained_prior_is_its_closed_form():
    net = nn.Linear(3, 2)
    model = BNNModel(net, prior=PretrainedPrior.from_network(net, 0.2), likelihood=Categorical(5))
    guide = MeanFieldGuide(model, init_scale=0.05)
    with torch.no_grad():
        guide.locs["weight"].add_(0.3)
    terms = DecomposedELBO().loss_terms(model, guide, torch.randn(4, 3), torch.randint(0, 2, (4,)))
    expected = sum(
        _kl_normal(guide.loc(s), guide.scale(s), model.initial_values()[s], torch.tensor(0.2)).sum()
        for s in model.site_names
    )
    assert terms["kl"].item() == pytest.approx(expected.item(), rel=1e-5)


def test_shared_gmm_kl_under_a_per_weight_normal_prior_is_exact():
    """Representative tying, a different Normal prior per weight: the closed form
    sum_i sum_k r_ik KL(N(m_k0, m_k1^2) || N(l_i, s_i^2)), against its definition."""
    model, s = make()
    torch.manual_seed(3)
    centres = {
        n: torch.randn(shape) * 0.3
        for n, shape in zip(
            model.site_names, [p.shape for p in model.initial_values().values()], strict=True
        )
    }
    prior = PretrainedPrior(centres, scale=0.1, delta=0.2)
    model = BNNModel(model.net, prior=prior, likelihood=Categorical(100))
    guide = SharedGMMGuide(model, s, "representative")
    terms = DecomposedELBO().loss_terms(model, guide, torch.randn(5, 3), torch.randint(0, 2, (5,)))
    loc = torch.cat([centres[n].reshape(-1) for n in model.site_names])
    scale = 0.1 + 0.2 * loc.abs()
    m0, m1 = s.means[:, 0], s.means[:, 1]
    kl_plain = _kl_normal(
        m0[s.plain_component], m1[s.plain_component], loc[s.plain_index], scale[s.plain_index]
    )
    li, si = loc[s.ellipse_index, None], scale[s.ellipse_index, None]
    c = s.ellipse_components
    kl_ell = (s.ellipse_alphas * _kl_normal(m0[c], m1[c], li, si)).sum()
    assert terms["kl_inlier"].item() == pytest.approx((kl_plain.sum() + kl_ell).item(), rel=1e-5)
    kl_out = _kl_normal(
        s.outlier_loc, s.outlier_scale, loc[s.outlier_index], scale[s.outlier_index]
    )
    assert terms["kl_outlier"].item() == pytest.approx(kl_out.sum().item(), rel=1e-5)


def test_pretrained_prior_survives_a_model_file(tmp_path):
    model, s = make()
    model = BNNModel(
        model.net,
        prior=PretrainedPrior.from_network(model.net, 0.05, 0.1),
        likelihood=Categorical(100),
    )
    guide = SharedGMMGuide(model, s)
    save_2dg(tmp_path / "m.pt", model, guide)
    model2, _ = load_2dg(
        tmp_path / "m.pt", net=nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    )
    assert isinstance(model2.prior, PretrainedPrior)
    assert (model2.prior.scale, model2.prior.delta) == (0.05, 0.1)
    for site in model.sites:
        torch.testing.assert_close(model2.prior.values[site.name], model.prior.values[site.name])


# ---------------------------------------------------------------- KL weight, recipe
def test_kl_weight_tempers_the_loss_and_is_reported(tmp_path):
    elbo = DecomposedELBO(beta=0.01)
    terms = {"nll": torch.tensor(10.0), "kl": torch.tensor(1000.0)}
    assert elbo.combine(terms).item() == pytest.approx(20.0)
    cfg = {
        "methods": ["mean_field", "2dg"],
        "progress": False,
        "stage1": {"epochs": 2, "kl_weight": 0.1, "deterministic_epochs": 1},
        "sharing": {"outlier_rule": "quantile", "n_components": 8, "grad_percentile": 0.0},
        "stage3": {"epochs": 1},
        "diagnostics": {"enabled": False},  # the table is what this test reads
    }
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg))
    assert main(["train", "--config", str(path), "--out", str(tmp_path / "run")]) == 0
    payload = json.loads((tmp_path / "run" / "results.json").read_text())
    rec = {r["method"]: r for r in payload["records"]}
    assert rec["mean_field"]["kl_weight"] == 0.1
    assert "kl_weight" not in rec["2dg"]  # stage 3 kept the true bound
    assert "| KL weight |" in (tmp_path / "run" / "results.md").read_text().splitlines()[0]


def test_sgd_schedule_warms_up_and_steps():
    lrs = [_epoch_lr(0.1, e, 2, (3, 5), 0.5) for e in range(7)]
    assert lrs == pytest.approx([0.05, 0.1, 0.1, 0.05, 0.05, 0.025, 0.025])


def test_sgd_recipe_trains_a_network(digits):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    loader = make_loader(digits.train, 128, shuffle=True, seed=0)
    x, y = digits.test.tensors
    train_deterministic(
        net,
        loader,
        8,
        lr=0.1,
        optimizer="sgd",
        weight_decay=5e-4,
        warmup_epochs=2,
        milestones=(6,),
        gamma=0.5,
        progress=False,
    )
    assert accuracy(net(x).softmax(-1), y) > 0.9
    with pytest.raises(ValueError, match="optimizer"):
        train_deterministic(net, loader, 1, optimizer="rmsprop")


@pytest.mark.parametrize(
    "section, key, value",
    [
        ("stage1", "kl_weight", 0.0),
        ("stage3", "kl_weight", -1.0),
        ("stage1", "deterministic_optimizer", "rmsprop"),
        ("stage1", "deterministic_milestones", [3, -1]),
        ("stage1", "deterministic_weight_decay", -5e-4),
        ("prior", "kind", "moped"),
        ("prior", "delta", -0.1),
    ],
)
def test_recipe_settings_are_validated(section, key, value):
    with pytest.raises(ConfigError, match=f"{section}.{key}"):
        config_from_dict({section: {key: value}})


def test_presets_are_valid_and_cite_the_paper_recipe():
    for name in PRESETS:
        config_from_dict(preset(name))
    cfg = config_from_dict(preset("cifar10-resnet20"))
    assert (cfg.stage1.lr_loc, cfg.stage1.lr_scale, cfg.stage3.lr_centre) == (1e-4, 1e-3, 1e-5)
    assert cfg.stage1.deterministic_optimizer == "sgd" and cfg.stage1.deterministic_lr == 0.1
    assert cfg.network.pretrain_epochs == cfg.stage1.deterministic_epochs == 250
    assert cfg.stage3.merge_every and cfg.stage3.reassign_every


def test_train_preset_with_config_overrides_and_missing_data(tmp_path, capsys):
    # the preset's data folder is missing: a one-line error naming it, exit code 2
    code = main(["train", "--preset", "mnist-lenet5", "--root", str(tmp_path / "nowhere")])
    assert code == 2
    assert "nowhere" in capsys.readouterr().err
    assert main(["train", "--preset", "no-such-preset"]) == 2


# ---------------------------------------------------------------- refinement hooks
def test_points_ride_with_their_components():
    model, s = make()
    guide = SharedGMMGuide(model, s)
    torch.testing.assert_close(guide.current_points(), s.inlier_points)
    with torch.no_grad():
        guide.centre_mu.add_(torch.tensor([0.1, -0.2, 0.3]))
    moved = guide.current_points()
    n_plain = s.plain_index.numel()
    shift = torch.tensor([0.1, -0.2, 0.3])
    torch.testing.assert_close(
        moved[:n_plain, 0] - s.inlier_points[:n_plain, 0], shift[s.plain_component]
    )
    alpha_shift = (s.ellipse_alphas * shift[s.ellipse_components]).sum(1)
    torch.testing.assert_close(moved[n_plain:, 0] - s.inlier_points[n_plain:, 0], alpha_shift)
    # files keep the points as set and the centres they were set at; a reassignment
    # resynchronises them
    torch.testing.assert_close(guide.structure().inlier_points, s.inlier_points)
    torch.testing.assert_close(guide.structure(current_points=True).inlier_points, moved)
    guide.load_structure(guide.structure(current_points=True), components=False)
    torch.testing.assert_close(guide.inlier_points, moved)
    torch.testing.assert_close(guide.current_points(), moved)
    # an old state dict without the anchor loads, its points where they were
    state = guide.state_dict()
    del state["anchor_centres"]
    fresh = SharedGMMGuide(model, guide.structure())
    fresh.load_state_dict(state)
    torch.testing.assert_close(fresh.current_points(), guide.inlier_points)


def _stage3_accuracy(model, structure, digits, hooks, epochs=12, tying="representative"):
    torch.manual_seed(0)
    guide = SharedGMMGuide(model, structure, tying)
    loader = make_loader(digits.train, 128, shuffle=True, seed=0)
    fit(model, guide, loader, epochs, lr=1e-2, callbacks=hooks, progress=False)
    torch.manual_seed(0)
    pred = predict(model, guide, digits.test.tensors, 30)
    return accuracy(pred.mean, pred.targets), guide


@pytest.mark.parametrize("tying", ["representative", "stochastic"])
def test_refinement_hooks_every_few_epochs_keep_accuracy(
    trained_mean_field, stage2_structure, digits, tying
):
    """Both hooks every 3 epochs: within 1 pp of the run without them, and the
    Mahalanobis check no longer turns the inliers into ellipse weights (it did: the
    stage-1 points stayed behind while the trained centres moved, and the stochastic
    tying's trained covariances, its posterior's spread, were taken for the points')."""
    model, _ = trained_mean_field
    base, _ = _stage3_accuracy(model, stage2_structure, digits, [], tying=tying)
    hooks = [
        MergeHook(tau_d=0.01, every=3, until_fixed_point=False),
        MahalanobisHook(every=3, until_fixed_point=False),
    ]
    acc, guide = _stage3_accuracy(model, stage2_structure, digits, hooks, tying=tying)
    assert acc >= base - 0.01
    assert len(hooks[1].log) == 4
    assert guide.structure().n_ellipses <= 2 * stage2_structure.n_ellipses + 20


def test_merged_point_spread_is_the_second_moment_of_the_merged_clouds():
    from twodg_pyro.sharing.refine import merge_point_covariances

    g = torch.Generator().manual_seed(0)
    clouds = [
        torch.randn(n, 2, generator=g, dtype=torch.float64) * sd + c
        for n, sd, c in ((40, 0.3, 1.0), (25, 0.1, -0.5), (30, 0.2, 2.0))
    ]
    means = torch.stack([x.mean(0) for x in clouds])
    covs = torch.stack([torch.cov(x.T, correction=0) for x in clouds])
    counts = torch.tensor([40.0, 25.0, 30.0], dtype=torch.float64)
    mapping = torch.tensor([0, 0, 1])
    new_means = torch.tensor([[0.3, 0.1], [2.0, 0.0]], dtype=torch.float64)
    got = merge_point_covariances(covs, means, counts, mapping, new_means)
    merged = torch.cat(clouds[:2]) - new_means[0]
    torch.testing.assert_close(got[0], merged.T @ merged / merged.shape[0])
    d = clouds[2] - new_means[1]
    torch.testing.assert_close(got[1], d.T @ d / d.shape[0])


def test_stage3_trains_its_own_copy_of_the_network_state(tmp_path):
    """BatchNorm statistics trained in stage 3 belong to the 2DG model: the mean-field
    model (and the INT8 rows built from it) keep predicting as evaluated."""
    from twodg_pyro.pipeline import run

    cfg = config_from_dict(
        {
            "methods": ["mean_field", "2dg"],
            "progress": False,
            "network": {"arch": "resnet20"},
            "stage1": {"epochs": 1},
            "sharing": {"outlier_rule": "quantile", "n_components": 8, "grad_percentile": 0.0},
            "stage3": {"epochs": 1},
            "diagnostics": {"enabled": False},
        }
    )
    art = run(cfg)
    mf_net, tdg_net = art.trained["mean_field"].model.net, art.trained["2dg"].model.net
    assert mf_net is not tdg_net
    bn = [n for n, _ in mf_net.named_buffers() if n.endswith("running_mean")]
    mf_buf, tdg_buf = dict(mf_net.named_buffers()), dict(tdg_net.named_buffers())
    assert any(not torch.equal(mf_buf[n], tdg_buf[n]) for n in bn)
