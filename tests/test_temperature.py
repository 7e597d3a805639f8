"""The KL temperature tied to the data and network sizes (``kl_weight = "data_size"``):
its reference value on LeNet-5, what it gives a ResNet-20, its cap, its errors, and the
pipeline resolving it on a real run."""

from __future__ import annotations

import pytest

from twodg_pyro.bnn import BNNModel
from twodg_pyro.infer import data_size_kl_weight, resolve_kl_weight
from twodg_pyro.infer.temperature import REFERENCE
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.models import build_network


def _model(name: str, n_data: int, **kw) -> BNNModel:
    net = build_network(name, num_classes=10, **kw)
    return BNNModel(net, likelihood=Categorical(n_data))


def test_lenet5_on_the_mnist_subset_keeps_the_reference_and_a_resnet20_gets_less():
    lenet = _model("lenet5", 3600)
    assert lenet.num_weights == REFERENCE[2]  # the reference is this very network
    assert resolve_kl_weight("data_size", lenet) == pytest.approx(0.1, rel=1e-12)
    resnet = _model("resnet20", 3600, in_channels=1)
    beta = resolve_kl_weight("data_size", resnet)
    # beta P / N is the same for both networks
    assert beta * resnet.num_weights == pytest.approx(0.1 * lenet.num_weights)
    assert 0.02 < beta < 0.025


def test_more_data_tempers_less_up_to_the_true_elbo():
    assert data_size_kl_weight(7200, 61706) == pytest.approx(0.2)
    assert data_size_kl_weight(36000, 61706) == pytest.approx(1.0)
    assert data_size_kl_weight(10**7, 61706) == 1.0  # capped: never above the true bound
    assert data_size_kl_weight(3600, 61706, reference=(0.5, 3600, 61706)) == pytest.approx(0.5)


@pytest.mark.parametrize(
    "args, match",
    [((0, 10), "n_data"), ((10, 0), "n_weights"), ((10.5, 10), "n_data")],
)
def test_bad_sizes_are_named(args, match):
    with pytest.raises(ValueError, match=match):
        data_size_kl_weight(*args)


@pytest.mark.parametrize("value", [0, -1.0, "data", True, None])
def test_bad_values_are_refused(value):
    with pytest.raises(ValueError, match="kl_weight"):
        resolve_kl_weight(value, _model("lenet5", 10))


def test_numbers_pass_through():
    assert resolve_kl_weight(0.3, _model("lenet5", 10)) == 0.3


def test_a_multiple_of_the_rule_is_that_multiple_of_its_beta():
    """``"data_size * m"`` (the natural-gradient presets' m = 0.3): m times the rule's
    beta, the same float as the product written out (the experiments computed it so)."""
    lenet = _model("lenet5", 3600)
    beta = resolve_kl_weight("data_size", lenet)
    for text in ("data_size * 0.3", "data_size*0.3", " data_size *  0.3 "):
        assert resolve_kl_weight(text, lenet) == 0.3 * beta
    assert resolve_kl_weight("data_size * 0.3", lenet) == pytest.approx(0.03, rel=1e-12)
    assert resolve_kl_weight("data_size * 1", lenet) == beta


@pytest.mark.parametrize(
    "value",
    [
        "data_size * 0",
        "data_size * -1",
        "data_size * x",
        "data_size * nan",
        "data_size * inf",
        "0.3 * data_size",
    ],
)
def test_bad_multiples_are_refused_by_the_settings_and_the_resolver(value):
    from twodg_pyro.pipeline import ConfigError, config_from_dict

    with pytest.raises(ConfigError, match=r"stage1\.kl_weight.*data_size \* m"):
        config_from_dict({"stage1": {"kl_weight": value}})
    with pytest.raises(ValueError, match="kl_weight"):
        resolve_kl_weight(value, _model("lenet5", 10))


def test_the_settings_take_the_rule_and_name_a_bad_value():
    from twodg_pyro.pipeline import ConfigError, config_from_dict

    cfg = config_from_dict({"stage1": {"kl_weight": "data_size"}, "stage3": {"kl_weight": 0.5}})
    assert cfg.stage1.kl_weight == "data_size"
    with pytest.raises(ConfigError, match=r"stage3\.kl_weight.*data_size"):
        config_from_dict({"stage3": {"kl_weight": "datasize"}})
    with pytest.raises(ConfigError, match=r"stage1\.kl_weight"):
        config_from_dict({"stage1": {"kl_weight": -0.1}})


@pytest.mark.parametrize("recipe", ["data_size", "the -von presets'"])
def test_a_digits_run_records_the_beta_the_rule_gave(recipe):
    """The main job's MLP on the bundled digits with the rule in both stages: the records
    state the resolved beta (N and P of this network), which the closed form gives; 512
    hidden units make it below 1 (16 would give the true ELBO, the cap).  With the
    natural-gradient presets' stages (``VON_RECIPE``: variational online Newton, 0.3 times
    the rule) the records state 0.3 times it."""
    from twodg_pyro.pipeline import config_from_dict, run
    from twodg_pyro.pipeline.settings.config import merge_settings
    from twodg_pyro.pipeline.settings.presets import VON_RECIPE

    settings = {
        "methods": ["mean_field", "2dg"],
        "network": {"hidden": [512]},
        "stage1": {"epochs": 2, "deterministic_epochs": 1, "kl_weight": "data_size"},
        "sharing": {"n_components": 8, "n_min": 2},
        "stage3": {"epochs": 1, "kl_weight": "data_size"},
        "progress": False,
        "diagnostics": {"enabled": False},
    }
    multiple = 1.0 if recipe == "data_size" else 0.3
    if multiple != 1.0:
        settings = merge_settings(settings, VON_RECIPE)
    cfg = config_from_dict(settings)
    assert cfg.stage1.trainer == ("svi" if multiple == 1.0 else "von")
    art = run(cfg)
    model = art.trained["mean_field"].model
    expected = multiple * data_size_kl_weight(model.likelihood.dataset_size, model.num_weights)
    assert model.num_weights == 64 * 512 + 512 + 512 * 10 + 10
    assert 0 < expected < 1  # a tempered posterior: 1 would leave no kl_weight field
    by = {r["method"]: r for r in art.records}
    assert by["mean_field"]["kl_weight"] == pytest.approx(expected)
    assert by["2dg"]["kl_weight"] == pytest.approx(expected)


def test_every_von_preset_is_its_bayes_preset_under_the_natural_gradient_recipe():
    from twodg_pyro.pipeline import config_from_dict
    from twodg_pyro.pipeline.settings.presets import (
        PRESETS,
        VON_OVERRIDES,
        VON_RECIPE,
        merge_settings,
        preset,
    )

    names = sorted(n for n in PRESETS if n.endswith("-von"))
    assert names == [
        "cifar10-resnet18-von",
        "cifar10-resnet20-von",
        "mnist-lenet5-von",
        "mnist-resnet20-von",
    ]
    for name in names:
        bayes = preset(name.removesuffix("-von") + "-bayes")
        # beyond the recipe, only the stated overrides: LeNet-5's fused step
        override = VON_OVERRIDES.get(name.removesuffix("-von"), {})
        assert preset(name) == merge_settings(merge_settings(bayes, VON_RECIPE), override)
        cfg = config_from_dict(preset(name))
        assert cfg.fused_kl == (name == "mnist-lenet5-von")
        assert (cfg.stage1.trainer, cfg.network.norm_stats) == ("von", "frozen")
        assert cfg.stage1.kl_weight == cfg.stage3.kl_weight == "data_size * 0.3"
