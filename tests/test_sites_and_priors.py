import math

import pyro.distributions as dist
import pytest
import torch
from conftest import TiedLinears
from torch import nn

from twodg_pyro.bnn import BNNModel
from twodg_pyro.likelihoods import Categorical, Gaussian
from twodg_pyro.nn import find_sites
from twodg_pyro.priors import LaplacePrior, LayerwiseNormalPrior, NormalPrior, SitePrior, as_prior


def small_cnn():
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)
    )


def test_sites_are_linear_and_conv_tensors_not_norm_layers():
    sites = find_sites(small_cnn())
    assert [s.name for s in sites] == ["0.weight", "0.bias", "4.weight", "4.bias"]
    assert sites[0].fan_in == 9 and sites[2].fan_in == 144
    assert sites[0].shape == torch.Size([4, 1, 3, 3])


def test_site_selection_by_name_and_type():
    net = small_cnn()
    assert [s.name for s in find_sites(net, include=["4.*"])] == ["4.weight", "4.bias"]
    assert [s.name for s in find_sites(net, layer_types=(nn.Conv2d,), bias=False)] == ["0.weight"]
    assert [s.name for s in find_sites(net, exclude=["*.bias"])] == ["0.weight", "4.weight"]


def test_norm_affine_parameters_are_bayesian_only_when_their_class_is_named(tmp_path):
    """Naming ``nn.BatchNorm2d`` makes its affine parameters sites of fan-in 1 (N(0, 1)
    under the layer-wise prior); a base class such as ``nn.Module`` does not select them;
    a model with them trains its scales, predicts with the running statistics and its
    model file reads back to the same draws."""
    import twodg_pyro as tp
    from twodg_pyro.evaluation import seeded_predict
    from twodg_pyro.nn.sites import DEFAULT_LAYER_TYPES

    types = (*DEFAULT_LAYER_TYPES, nn.BatchNorm2d)
    sites = find_sites(small_cnn(), layer_types=types)
    assert [s.name for s in sites] == [
        "0.weight",
        "0.bias",
        "1.weight",
        "1.bias",
        "4.weight",
        "4.bias",
    ]
    assert sites[2].fan_in == sites[3].fan_in == 1
    assert [s.name for s in find_sites(small_cnn(), layer_types=(nn.Module,))] == [
        "0.weight",
        "0.bias",
        "4.weight",
        "4.bias",
    ]
    prior = LayerwiseNormalPrior()(sites[2])
    assert torch.allclose(prior.base_dist.scale, torch.ones(4))
    torch.manual_seed(0)
    net = small_cnn()
    with torch.no_grad():
        net.train()(torch.randn(16, 1, 8, 8))  # running statistics other than the initial
    model = BNNModel(
        net,
        prior=LayerwiseNormalPrior(),
        likelihood=Categorical(64),
        layer_types=types,
        norm_stats="frozen",
    )
    guide = tp.MeanFieldGuide(model, init_scale=0.05)
    x, y = torch.randn(64, 1, 8, 8), torch.randint(0, 3, (64,))
    before = guide.scale("1.weight").clone()
    tp.fit(model, guide, [(x, y)], epochs=3, lr=1e-2, progress=False)
    assert not torch.equal(guide.scale("1.weight"), before)  # the affine scales train
    pred = seeded_predict(model, guide, x, num_samples=4, seed=0, keep_samples=True)
    tp.save_model(tmp_path / "m.pt", model, guide)
    model2, guide2 = tp.load_model(tmp_path / "m.pt", net=small_cnn())
    assert model2.site_names == model.site_names
    again = seeded_predict(model2, guide2, x, num_samples=4, seed=0, keep_samples=True)
    assert torch.equal(again.samples, pred.samples)


def test_network_without_linear_or_conv_is_a_clear_error():
    with pytest.raises(ValueError, match="Sequential has no Bayesian parameter"):
        BNNModel(nn.Sequential(nn.ReLU(), nn.BatchNorm1d(3)))


def test_a_tied_weight_is_a_clear_error_naming_both_names_and_the_way_out():
    """One tensor under two names (tied weights) can be one site only: the model names the
    second name, the first, and the exclude that builds it."""

    with pytest.raises(
        ValueError, match=r"'b.weight' is the parameter 'a.weight'.*exclude=\['b.weight'\]"
    ):
        BNNModel(TiedLinears(), likelihood=10)
    model = BNNModel(TiedLinears(), likelihood=10, exclude=["b.weight"])
    assert [s.name for s in model.sites] == ["a.weight", "a.bias", "b.bias"]


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_non_positive_prior_scale_is_rejected(bad):
    with pytest.raises(ValueError, match="scale must be a positive finite number"):
        NormalPrior(bad)
    with pytest.raises(ValueError, match="scale"):
        LaplacePrior(bad)


def test_prior_shapes_and_layerwise_scale():
    net = small_cnn()
    sites = find_sites(net)
    p = LayerwiseNormalPrior(gain=2.0)(sites[2])
    assert p.event_shape == sites[2].shape
    assert math.isclose(p.base_dist.scale.flatten()[0].item(), 2.0 / 12.0, rel_tol=1e-6)
    assert NormalPrior(0.1)(sites[0]).event_shape == torch.Size([4, 1, 3, 3])


def test_user_priors_per_site_and_function():
    sites = find_sites(small_cnn())
    by_name = SitePrior({"0.weight": dist.Normal(0.0, 0.5)}, default=dist.Laplace(0.0, 1.0))
    assert isinstance(by_name(sites[0]).base_dist, dist.Normal)
    assert isinstance(by_name(sites[1]).base_dist, dist.Laplace)
    fn = as_prior(lambda site: dist.StudentT(3.0, 0.0, 0.1))
    assert isinstance(fn(sites[2]).base_dist, dist.StudentT)
    assert isinstance(as_prior(0.3), NormalPrior) and as_prior(0.3).scale == 0.3
    with pytest.raises(KeyError, match="no distribution for site '0.bias'"):
        SitePrior({"0.weight": dist.Normal(0.0, 0.5)})(sites[1])


def test_model_runs_and_scales_likelihood_by_dataset_size():
    import pyro.poutine as poutine

    net = nn.Sequential(nn.Linear(5, 3))
    model = BNNModel(net, likelihood=Categorical(1000))
    x, y = torch.randn(10, 5), torch.randint(0, 3, (10,))
    tr = poutine.trace(model).get_trace(x, y)
    assert set(model.site_names) <= set(tr.nodes)
    assert tr.nodes["obs"]["scale"] == pytest.approx(100.0)


def test_gaussian_likelihood_regression_shapes():
    lik = Gaussian(50, scale=0.5)
    d = lik.distribution(torch.zeros(7, 1))
    assert d.batch_shape == torch.Size([7])
    with pytest.raises(ValueError, match="scale must be positive"):
        Gaussian(50, scale=-1.0)
