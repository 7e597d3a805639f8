"""Rank-1 BNN: layer math, batch-ensemble routing, prediction over components, priors."""

import pyro
import pyro.poutine as poutine
import pytest
import torch
import torch.nn.functional as F
from pyro.distributions.kl import kl_divergence
from torch import nn

from twodg_pyro.data import make_loader
from twodg_pyro.guide import BNNGuide, GuideSample
from twodg_pyro.guides import CauchyPrior, Rank1BNNModel, Rank1Guide, rank1_prior
from twodg_pyro.guides.rank1 import rank1_kl_annealing
from twodg_pyro.infer import DecomposedELBO, fit
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.metrics import classification_metrics
from twodg_pyro.models import MLP, LeNet5
from twodg_pyro.nn.rank1 import find_rank1_layers, rank1_factors, rank1_weight
from twodg_pyro.pipeline import ConfigError, RunConfig, config_from_dict
from twodg_pyro.pipeline.settings.config import Rank1Config
from twodg_pyro.prediction import predict


# ---------------------------------------------------------------- layer math
@pytest.mark.parametrize(
    "module, shape",
    [
        (nn.Linear(7, 5), (6, 7)),
        (nn.Linear(256, 300), (50, 256)),
        (nn.Conv2d(1, 6, 5, padding=2), (9, 1, 8, 8)),
        (nn.Conv2d(16, 32, 3, padding=1), (8, 16, 12, 12)),
        (nn.Conv2d(4, 6, 3, padding=1, groups=2), (6, 4, 8, 8)),
    ],
)
def test_unit_factors_reproduce_linear_and_conv2d_exactly(module, shape):
    x = torch.randn(shape)
    net = nn.Sequential(module)
    expected = net(x)
    n_in, n_out = (
        (module.in_features, module.out_features)
        if isinstance(module, nn.Linear)
        else (module.in_channels, module.out_channels)
    )
    b = shape[0]
    for r, s in (
        (torch.ones(n_out), torch.ones(n_in)),  # shared factors
        (torch.ones(b, n_out), torch.ones(b, n_in)),  # one pair per example
    ):
        with rank1_factors(net, {"0": (r, s)}):
            got = net(x)
        assert torch.equal(got, expected)  # bit for bit
    assert "forward" not in module.__dict__  # the network is left as it was
    assert torch.equal(net(x), expected)


def test_rank1_model_with_unit_factors_is_the_deterministic_lenet():
    net = LeNet5(num_classes=10, in_channels=1, input_size=8)
    model = Rank1BNNModel(net, likelihood=100, components=3)
    x = torch.randn(9, 1, 8, 8)
    ones = {s.name: torch.ones(s.shape) for s in model.sites}
    assignment = model.route(9)
    assert torch.equal(model.routed_forward(ones, x, assignment), net(x))
    assert [layer.module_name for layer in model.layers] == ["conv1", "conv2", "fc1", "fc2", "fc3"]
    assert model.sites[0].name == "conv1.r" and model.sites[0].shape == (3, 6)
    assert model.sites[1].name == "conv1.s" and model.sites[1].shape == (3, 1)


def test_factors_are_the_elementwise_product_with_r_s_transpose():
    torch.manual_seed(1)
    lin = nn.Linear(7, 5)
    r, s, x = torch.randn(5), torch.randn(7), torch.randn(4, 7)
    with rank1_factors(nn.Sequential(lin), {"0": (r, s)}):
        got = lin(x)
    w = rank1_weight(lin.weight, r, s)
    torch.testing.assert_close(w, lin.weight * torch.outer(r, s))
    torch.testing.assert_close(got, F.linear(x, w, lin.bias))
    conv = nn.Conv2d(4, 6, 3, padding=1, groups=2)
    r, s, xc = torch.randn(6), torch.randn(4), torch.randn(3, 4, 5, 5)
    with rank1_factors(nn.Sequential(conv), {"0": (r, s)}):
        got = conv(xc)
    w = rank1_weight(conv.weight, r, s, groups=2)
    # output channel 4 belongs to group 1, whose input channels are 2 and 3
    torch.testing.assert_close(w[4, 1], conv.weight[4, 1] * r[4] * s[3])
    torch.testing.assert_close(got, F.conv2d(xc, w, conv.bias, padding=1, groups=2))


# ---------------------------------------------------------------- routing and prediction
def _distinct_factors(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {s.name: 1 + 0.5 * torch.randn(s.shape, generator=g) for s in model.sites}


def _component_output(model, factors, m, x):
    shared = {layer: (factors[r][m], factors[s][m]) for layer, (r, s) in model.factor_sites.items()}
    with rank1_factors(model.net, shared):
        return model.net(x)


def test_routing_sends_example_i_to_component_i_mod_m():
    torch.manual_seed(0)
    model = Rank1BNNModel(MLP(6, (8,), 3), likelihood=50, components=3)
    factors = _distinct_factors(model)
    x, y = torch.randn(7, 6), torch.randint(0, 3, (7,))
    assert model.route(7).tolist() == [0, 1, 2, 0, 1, 2, 0]
    trace = poutine.trace(poutine.condition(model, data=factors)).get_trace(x, y)
    logits = trace.nodes["obs"]["fn"].logits
    for i in range(7):
        expected = _component_output(model, factors, i % 3, x[i : i + 1])[0]
        torch.testing.assert_close(logits[i], expected.log_softmax(-1))
        # and no other component gives these outputs
        other = _component_output(model, factors, (i + 1) % 3, x[i : i + 1])[0]
        assert not torch.allclose(logits[i], other.log_softmax(-1))
    assert trace.nodes["obs"]["scale"] == pytest.approx(50 / 7)


def test_tile_routing_sends_every_example_to_every_component():
    model = Rank1BNNModel(MLP(6, (8,), 3), likelihood=50, components=2, routing="tile")
    factors = _distinct_factors(model)
    x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))
    trace = poutine.trace(poutine.condition(model, data=factors)).get_trace(x, y)
    site = trace.nodes["obs"]
    assert site["value"].tolist() == y.tolist() * 2
    assert site["scale"] == pytest.approx(50 / 10)  # average over components
    for m in range(2):
        expected = _component_output(model, factors, m, x).log_softmax(-1)
        torch.testing.assert_close(site["fn"].logits[5 * m : 5 * (m + 1)], expected)


class _FixedGuide(BNNGuide):
    """Returns the same factors for every sample: predict must average the components."""

    def __init__(self, factors):
        super().__init__()
        self.factors = factors

    def draw(self, num_samples=None):
        return GuideSample({k: v.expand(num_samples, *v.shape) for k, v in self.factors.items()})


def test_prediction_averages_all_components_and_samples():
    torch.manual_seed(0)
    model = Rank1BNNModel(MLP(6, (8,), 3), likelihood=50, components=4)
    factors = _distinct_factors(model)
    x, y = torch.randn(11, 6), torch.randint(0, 3, (11,))
    per_component = torch.stack(
        [_component_output(model, factors, m, x).softmax(-1) for m in range(4)]
    )
    assert model.network_forward(factors, x).shape == (4, 11, 3)
    pred = predict(model, _FixedGuide(factors), (x, y), num_samples=3, keep_samples=True)
    torch.testing.assert_close(pred.mean, per_component.mean(0))
    assert pred.samples.shape == (12, 11, 3)
    torch.testing.assert_close(pred.samples[4:8], per_component)
    # a real guide: the average over samples and components of the softmax
    guide = Rank1Guide(model, init_scale=0.1, seed=0)
    torch.manual_seed(5)
    pred = predict(model, guide, x, num_samples=5, sample_chunk=2, keep_samples=True)
    torch.manual_seed(5)
    manual = []
    for chunk in (2, 2, 1):
        draws = guide.sample_weights(chunk)
        for j in range(chunk):
            w = {k: v[j] for k, v in draws.items()}
            manual += [_component_output(model, w, m, x).softmax(-1) for m in range(4)]
    torch.testing.assert_close(pred.mean, torch.stack(manual).mean(0), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("sample_chunk", [4, 8, 9])
def test_prediction_splits_a_chunk_of_draws_by_forward_passes(sample_chunk):
    """sample_chunk bounds the forward passes (draws x 4 components) evaluated at once,
    never the draws: every split gives the draws and predictions of one pass per chunk."""
    torch.manual_seed(0)
    model = Rank1BNNModel(MLP(6, (8,), 3), likelihood=50, components=4)
    guide = Rank1Guide(model, init_scale=0.1, seed=0)
    x = torch.randn(7, 6)
    torch.manual_seed(2)
    pred = predict(model, guide, x, num_samples=9, sample_chunk=sample_chunk, keep_samples=True)
    torch.manual_seed(2)
    manual, done = [], 0
    while done < 9:
        s = min(sample_chunk, 9 - done)
        draws = guide.sample_weights(s)
        out = torch.vmap(model.network_forward, in_dims=(0, None))(draws, x)
        manual.append(out.flatten(0, 1).softmax(-1))
        done += s
    torch.testing.assert_close(pred.samples, torch.cat(manual), atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------- guide, priors, KL
def test_guide_initialisation_and_per_component_kl():
    model = Rank1BNNModel(MLP(6, (8,), 3), prior=rank1_prior("normal", 0.5), likelihood=50)
    guide = Rank1Guide(model, seed=3)
    for site in model.sites:
        loc = guide.loc(site.name)
        assert loc.shape == (4, site.shape[1])
        assert set(loc.unique().tolist()) <= {-1.0, 1.0}
        torch.testing.assert_close(guide.scale(site.name), torch.full(loc.shape, 1e-3))
    ones = Rank1Guide(model, init_mean="ones")
    assert all(torch.equal(ones.loc(s.name), torch.ones(s.shape)) for s in model.sites)
    site = model.sites[0]
    prior_fn = model.prior(site)
    assert float(prior_fn.mean.mean()) == 1.0  # factor priors are centred at 1
    q = guide.site_distribution(site)
    per_component = kl_divergence(q.base_dist, prior_fn.base_dist).sum(-1)
    kl = guide.site_kl(site.name, prior_fn, q.sample())["kl"]
    torch.testing.assert_close(kl, per_component.sum())
    # the ELBO scales it by the site's 1/M: the per-component average
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    guide_trace = poutine.trace(guide).get_trace(x, y)
    assert guide_trace.nodes[site.name]["scale"] == pytest.approx(1 / 4)
    terms = DecomposedELBO().loss_terms(model, guide, x, y)
    expected = sum(
        kl_divergence(guide.site_distribution(s).base_dist, model.prior(s).base_dist).sum() / 4
        for s in model.sites
    )
    torch.testing.assert_close(terms["kl"], expected)
    n = guide.num_trainable()
    assert n == 2 * 4 * (6 + 8 + 8 + 3) == 2 * model.num_weights


def test_cauchy_prior_trains(digits):
    torch.manual_seed(0)
    pyro.set_rng_seed(0)
    model = Rank1BNNModel(
        MLP(64, (32,), 10),
        prior=rank1_prior("cauchy", 1.0),
        likelihood=Categorical(len(digits.train)),
        components=4,
    )
    assert isinstance(model.prior, CauchyPrior)
    guide = Rank1Guide(model, seed=0)
    epochs = 15
    annealing = rank1_kl_annealing(epochs)
    assert annealing.warmup_epochs == 10
    state = fit(
        model,
        guide,
        make_loader(digits.train, 128, shuffle=True, seed=0),
        epochs=epochs,
        lr=1e-2,
        elbo=DecomposedELBO(),
        callbacks=[annealing],
        progress=False,
    )
    first, last = state.history[0], state.history[-1]
    assert last["nll"] < 0.5 * first["nll"]
    assert last["beta"] == 1.0 and torch.isfinite(torch.tensor(last["kl"]))
    x, y = digits.test.tensors
    pred = predict(model, guide, (x, y), num_samples=10)
    accuracy = classification_metrics(pred.mean, pred.targets)["accuracy"]
    assert accuracy > 0.85, accuracy  # chance is 0.1


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("bad", [0, -2, 2.5, True])
def test_fewer_than_one_component_is_a_clear_error(bad):
    with pytest.raises(ValueError, match=rf"M must be an integer >= 1, got {bad!r}"):
        Rank1BNNModel(MLP(6, (8,), 3), components=bad)


def test_rank1_settings_are_validated():
    with pytest.raises(ConfigError, match=r"rank1.components = 0: M \(mixture components\)"):
        Rank1Config(components=0)
    with pytest.raises(ConfigError, match=r"rank1.prior = 'laplace'"):
        config_from_dict({"rank1": {"prior": "laplace"}})
    with pytest.raises(ValueError, match="unknown rank-1 prior 'student'"):
        rank1_prior("student")
    with pytest.raises(ValueError, match="unknown routing 'random'"):
        Rank1BNNModel(MLP(6, (8,), 3), routing="random")
    with pytest.raises(ValueError, match="ConvTranspose2d"):
        find_rank1_layers(nn.Sequential(nn.ConvTranspose2d(2, 2, 3)), (nn.ConvTranspose2d,))
    with pytest.raises(ValueError, match="unknown init_mean 'zeros'"):
        Rank1Guide(Rank1BNNModel(MLP(6, (8,), 3)), init_mean="zeros")
    assert RunConfig().rank1.components == 4


def test_pipeline_rows_for_rank1_and_ssvi(tmp_path):
    from twodg_pyro.pipeline import read_results, run

    cfg = config_from_dict(
        {
            "methods": ["rank1", "ssvi"],
            "progress": False,
            "num_samples": 4,
            "network": {"hidden": [16]},
            "rank1": {"epochs": 2, "components": 2},
            "ssvi": {"epochs": 2, "update_every": 1, "density": 0.2},
            # SSVI trains on stage 1's tempered ELBO; rank-1 keeps its own (KL weight 1)
            "stage1": {"kl_weight": 0.1},
            "diagnostics": {"enabled": False},  # the rows are what this test reads
        }
    )
    art = run(cfg, tmp_path)
    records = {r["method"]: r for r in read_results(tmp_path)["records"]}
    assert set(records) == {"rank1", "ssvi"} and len(art.records) == 2
    for r in records.values():
        for key in ("accuracy", "nll", "ece", "brier", "trainable_params", "size_mb"):
            assert key in r, (r["method"], key)
        assert r["size_mb"] == pytest.approx(r["trainable_params"] * 4 / 1e6)
        assert r["accuracy"] > 0.2
    n_w = 64 * 16 + 16 + 16 * 10 + 10
    assert records["rank1"]["trainable_params"] == n_w + 2 * 2 * (64 + 16 + 16 + 10)
    s = sum(round(0.2 * n) for n in (64 * 16, 16, 16 * 10, 10))
    assert records["ssvi"]["trainable_params"] == 2 * s == 2 * records["ssvi"]["active"]
    assert records["ssvi"]["kl_weight"] == 0.1 and "kl_weight" not in records["rank1"]
    # the factor prior N(1, 0.1^2) of the rank-1 authors' deep residual networks, stated
    assert records["rank1"]["prior_scale"] == 0.1 and records["rank1"]["prior"] == "normal"


def test_ssvi_counts_only_active_inputs_in_a_fan_in_prior(tmp_path):
    """Under the layer-wise prior SSVI at density d takes N(0, g^2 / (d fan_in)): the
    dense rule shrank each layer's pre-activations by d and SSVI collapsed to chance."""
    from twodg_pyro.pipeline import run
    from twodg_pyro.priors import LayerwiseNormalPrior

    cfg = config_from_dict(
        {
            "methods": ["ssvi"],
            "progress": False,
            "num_samples": 2,
            "network": {"hidden": [16]},
            "prior": {"kind": "layerwise", "scale": 1.5},
            "ssvi": {"epochs": 1, "density": 0.25},
            "diagnostics": {"enabled": False},
        }
    )
    prior = run(cfg).trained["ssvi"].model.prior
    assert isinstance(prior, LayerwiseNormalPrior)
    assert prior.gain == pytest.approx(1.5 / 0.5)
