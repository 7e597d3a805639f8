"""Priors and likelihoods describe themselves to files and settings: a new one is one class
(a ``kind``, and ``to_spec`` / ``from_spec`` when its defaults do not fit) that trains,
saves and loads without any file of the library edited; the library's own specs are
exactly those files have always held."""

from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import pyro.distributions as dist
import pytest
import torch

from twodg_pyro.bnn import BNNModel
from twodg_pyro.data import make_loader
from twodg_pyro.evaluation import seeded_predict
from twodg_pyro.guides import MeanFieldGuide
from twodg_pyro.infer import fit
from twodg_pyro.infer.fast_step import site_priors
from twodg_pyro.io import PriorNotStoredWarning, UnavailablePrior, load_model, save_model
from twodg_pyro.io.specs import likelihood_spec, prior_spec, rebuild_likelihood, rebuild_prior
from twodg_pyro.likelihoods import LIKELIHOODS, Categorical, Gaussian, Likelihood
from twodg_pyro.models import MLP
from twodg_pyro.pipeline.settings.build import build_prior
from twodg_pyro.pipeline.settings.config import PriorConfig
from twodg_pyro.priors import (
    PRIORS,
    CauchyPrior,
    LaplacePrior,
    LayerwiseNormalPrior,
    NormalPrior,
    PerSiteNormalPrior,
    PretrainedPrior,
    Prior,
    RegularizedHorseshoePrior,
    SitePrior,
)

SPEC = {"name": "mlp", "kwargs": {"in_features": 64, "hidden": [16], "num_classes": 10}}


@pytest.fixture(autouse=True)
def registries():
    """The registries as they were before the test: its classes leave no trace."""
    saved = [(r, dict(r)) for r in (PRIORS, LIKELIHOODS)]
    yield
    for registry, before in saved:
        registry.clear()
        registry.update(before)


def _same_value(a, b) -> bool:
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(map(_same_value, a, b))
    if isinstance(a, dist.Distribution):
        return type(a) is type(b) and _same_value(
            {k: getattr(a, k) for k in a.arg_constraints if k in a.__dict__},
            {k: getattr(b, k) for k in b.arg_constraints if k in b.__dict__},
        )
    return a == b


def _public(prior) -> dict:
    return {k: v for k, v in vars(prior).items() if not k.startswith("_")}


def test_a_prior_written_as_one_class_trains_saves_and_loads(digits, tmp_path):
    class StudentTPrior(Prior):
        """i.i.d. Student-t: all it needs is a kind; its settings are its attributes."""

        kind = "test_student_t"
        settled = True

        def __init__(self, df: float = 3.0, scale: float = 0.1):
            self.df, self.scale = float(df), float(scale)

        def site_distribution(self, site):
            return dist.StudentT(*map(self.constant, (self.df, 0.0, self.scale)))

    torch.manual_seed(0)
    n = len(digits.train)
    model = BNNModel(MLP(64, (16,), 10), prior=StudentTPrior(4.0, 0.2), likelihood=Categorical(n))
    guide = MeanFieldGuide(model)
    loader = make_loader(digits.train, 128, shuffle=True, seed=0)
    before = [p.detach().clone() for p in guide.parameters()]
    fit(model, guide, loader, epochs=2, lr=1e-2, progress=False)
    assert all(not torch.equal(a, p) for a, p in zip(before, guide.parameters(), strict=True))
    path = tmp_path / "student.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # stored: nothing to warn about
        save_model(path, model, guide, network=SPEC)
        m2, g2 = load_model(path)
    header = json.loads(torch.load(path, weights_only=True)["header"])
    assert header["prior"] == {"kind": "test_student_t", "df": 4.0, "scale": 0.2}
    assert type(m2.prior) is StudentTPrior and _public(m2.prior) == _public(model.prior)
    for site in model.sites:
        w = torch.randn(site.shape)
        assert torch.equal(
            model.prior_distribution(site).log_prob(w), m2.prior_distribution(site).log_prob(w)
        )
    pa = seeded_predict(model, guide, digits.test.tensors, 5, 3)
    pb = seeded_predict(m2, g2, digits.test.tensors, 5, 3)
    assert torch.equal(pa.mean, pb.mean)


def test_a_prior_with_tensors_stores_them_beside_its_spec(tmp_path):
    class ScaledNormalPrior(Prior):
        """N(0, s_site^2) with a stored scale tensor per site: its own to_spec/from_spec."""

        kind = "test_scaled_normal"

        def __init__(self, scales: dict[str, torch.Tensor]):
            self.scales = dict(scales)

        def site_distribution(self, site):
            return dist.Normal(torch.zeros(()), self.scales[site.name])

        def to_spec(self, model=None):
            return {"kind": self.kind, "sites": sorted(self.scales)}, dict(self.scales)

        @classmethod
        def from_spec(cls, spec, net, tensors, where):
            return cls({k: tensors[k] for k in spec["sites"]})

    net = MLP(64, (16,), 10)
    scales = {k: torch.rand(p.shape) + 0.1 for k, p in net.named_parameters()}
    model = BNNModel(net, prior=ScaledNormalPrior(scales), likelihood=Categorical(100))
    path = save_model(tmp_path / "scaled.pt", model, MeanFieldGuide(model), network=SPEC)
    m2, _ = load_model(path)
    assert type(m2.prior) is ScaledNormalPrior and _same_value(m2.prior.scales, scales)


def test_every_library_prior_round_trips_to_the_specs_files_hold():
    torch.manual_seed(0)
    net = MLP(6, (5,), 3)
    model = BNNModel(net, prior=1.0, likelihood=Categorical(10))
    shifted = {k: v.detach() + 0.5 for k, v in net.named_parameters()}
    priors = {  # the exact JSON files have always held
        '{"kind": "NormalPrior", "loc": 0.1, "scale": 0.3}': NormalPrior(0.3, loc=0.1),
        '{"kind": "LaplacePrior", "loc": 0.0, "scale": 0.2}': LaplacePrior(0.2),
        '{"kind": "CauchyPrior", "loc": 1.0, "scale": 0.5}': CauchyPrior(0.5),
        '{"kind": "RegularizedHorseshoePrior", "global_scale": 0.05, "slab_scale": 1.5}': (
            RegularizedHorseshoePrior(0.05, 1.5)
        ),
        '{"kind": "LayerwiseNormalPrior", "gain": 1.5, "bias_scale": null}': (
            LayerwiseNormalPrior(1.5)
        ),
        '{"kind": "PretrainedPrior", "scale": 0.05, "delta": 0.1, "centres": "network"}': (
            PretrainedPrior.from_network(net, 0.05, 0.1)
        ),
        '{"kind": "PretrainedPrior", "scale": 0.1, "delta": 0.0, "centres": "stored"}': (
            PretrainedPrior(shifted, 0.1)
        ),
        '{"kind": "PerSiteNormalPrior", "scales": '
        '{"layers.0.weight": 0.3, "layers.0.bias": 0.1}}': (
            PerSiteNormalPrior({"layers.0.weight": 0.3, "layers.0.bias": 0.1})
        ),
        '{"kind": "distribution", "type": "Normal", "params": {"loc": 0.0, "scale": 2.0}}': (
            SitePrior(dist.Normal(0.0, 2.0))
        ),
        '{"kind": "per_site", "sites": {"layers.0.weight": {"type": "Laplace", "params": '
        '{"loc": 0.0, "scale": 0.5}}}, "default": null}': SitePrior(
            {"layers.0.weight": dist.Laplace(0.0, 0.5)}
        ),
        '{"kind": "custom", "repr": "lambda"}': UnavailablePrior("lambda", "old.pt"),
    }
    covered = set()
    for text, prior in priors.items():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            spec, tensors = prior_spec(prior, model)
            assert json.dumps(spec) == text
            again = rebuild_prior(json.loads(text), net, "old.pt", tensors, warn=False)
        assert type(again) is type(prior) and _same_value(_public(again), _public(prior))
        assert _same_value(prior_spec(again, model), (spec, tensors))
        covered |= {type(prior).kind, *type(prior).aliases}
    library = {k for k, c in PRIORS.items() if c.__module__.startswith("twodg_pyro.")}
    assert covered == library  # a new library prior joins this test
    assert {"normal", "laplace", "layerwise", "pretrained"} <= set(PRIORS)  # the settings names


def test_specs_that_are_not_what_a_prior_writes_are_refused():
    net = MLP(6, (5,), 3)
    with pytest.raises(ValueError, match="f.pt.*is not what a NormalPrior writes"):
        rebuild_prior({"kind": "NormalPrior", "loc": 0.0}, net, "f.pt")  # no scale
    with pytest.raises(TypeError):
        rebuild_prior({"kind": "LaplacePrior", "loc": 0.0, "scale": 1.0, "df": 2}, net, "f.pt")
    with pytest.raises(ValueError, match="stored centres are missing"):
        rebuild_prior({"kind": "PretrainedPrior", "scale": 0.1, "delta": 0.0, "centres": "stored"},
                      net, "f.pt")  # fmt: skip
    with pytest.warns(PriorNotStoredWarning, match="f.pt.*could not be stored.*NoSuchPrior"):
        prior = rebuild_prior({"kind": "NoSuchPrior", "x": 1}, net, "f.pt")
    assert isinstance(prior, UnavailablePrior)


def test_a_subclass_without_its_own_kind_is_not_stored_as_its_parent():
    class Wider(NormalPrior):
        def site_distribution(self, site):
            return dist.Normal(self.constant(self.loc), self.constant(2 * self.scale))

    model = BNNModel(MLP(6, (5,), 3), prior=Wider(0.5), likelihood=Categorical(10))
    assert Wider.kind is None and not Wider.settled and NormalPrior.settled
    with pytest.warns(PriorNotStoredWarning, match="cannot be stored"):
        spec, _ = prior_spec(model.prior, model)
    assert spec["kind"] == "custom"
    # settled is each class's own promise: the fast step asks Wider at every step
    assert site_priors(model) is not site_priors(model)
    plain = BNNModel(MLP(6, (5,), 3), prior=NormalPrior(0.5), likelihood=Categorical(10))
    assert site_priors(plain) is site_priors(plain)


def test_a_kind_or_setting_taken_is_a_clear_error():
    taken = "'NormalPrior' is taken by twodg_pyro.priors.iid.NormalPrior"
    with pytest.raises(TypeError, match=taken):

        class Mine(Prior):
            kind = "NormalPrior"

            def site_distribution(self, site):
                return dist.Normal(0.0, 1.0)

    with pytest.raises(TypeError, match="prior kind 'laplace' is taken by .*LaplacePrior"):

        class Other(Prior):
            kind = "test_other"
            aliases = ("laplace",)

            def site_distribution(self, site):
                return dist.Laplace(0.0, 1.0)

    with pytest.raises(TypeError, match="likelihood kind 'Gaussian' is taken"):

        class MyGaussian(Gaussian):
            kind = "Gaussian"


def test_build_prior_looks_the_setting_up():
    net = MLP(6, (5,), 3)
    for kind in ("normal", "laplace", "layerwise", "pretrained"):
        prior = build_prior(PriorConfig(kind=kind, scale=0.5, delta=0.1), net)
        assert kind in type(prior).aliases
    assert build_prior(PriorConfig(kind="layerwise", scale=0.5)).gain == 0.5
    with pytest.raises(ValueError, match="'pretrained' needs the network"):
        build_prior(PriorConfig(kind="pretrained"))

    class HalfCauchy(CauchyPrior):  # a user's prior is built from settings by Python
        kind = "test_cauchy"

    prior = build_prior(SimpleNamespace(kind="test_cauchy", scale=0.3, delta=0.0), net)
    assert type(prior) is HalfCauchy and prior.scale == 0.3
    with pytest.raises(ValueError, match="unknown prior 'nope'"):
        build_prior(SimpleNamespace(kind="nope", scale=1.0, delta=0.0), net)


def test_likelihoods_round_trip_and_a_new_one_is_one_class():
    class Tempered(Categorical):
        """Categorical at temperature T: logits / T."""

        kind = "test_tempered"

        def __init__(self, dataset_size: int, temperature: float = 1.0):
            super().__init__(dataset_size)
            self.temperature = float(temperature)

        def distribution(self, output):
            return super().distribution(output / self.temperature)

    for lik, text in [
        (Categorical(10), '{"kind": "Categorical", "dataset_size": 10}'),
        (Gaussian(7, 0.25), '{"kind": "Gaussian", "dataset_size": 7, "scale": 0.25}'),
        (Tempered(5, 2.0), '{"kind": "test_tempered", "dataset_size": 5, "temperature": 2.0}'),
    ]:
        assert json.dumps(likelihood_spec(lik)) == text
        again = rebuild_likelihood(json.loads(text))
        assert type(again) is type(lik) and vars(again) == vars(lik)
    with pytest.raises(
        ValueError,
        match="Poisson.*is not Categorical, Gaussian, HeteroscedasticGaussian or test_tempered",
    ):
        rebuild_likelihood({"kind": "Poisson", "dataset_size": 100})
    with pytest.raises(ValueError, match="is not what a Gaussian writes"):
        rebuild_likelihood({"kind": "Gaussian", "dataset_size": 100})  # no scale

    class Unregistered(Categorical):
        pass

    assert Unregistered.kind is None and issubclass(Unregistered, Likelihood)
    assert likelihood_spec(Unregistered(3))["kind"] == "Unregistered"  # refused on loading


def test_the_rank1_model_lives_in_the_model_layer():
    import twodg_pyro.guides as guides
    import twodg_pyro.rank1_bnn as rank1_model
    from twodg_pyro.guides.rank1 import CauchyPrior as C
    from twodg_pyro.guides.rank1 import Rank1BNNModel, Rank1PriorKind, Routing

    assert Rank1BNNModel is guides.Rank1BNNModel is rank1_model.Rank1BNNModel
    assert C is CauchyPrior is guides.CauchyPrior
    assert Rank1PriorKind is rank1_model.Rank1PriorKind and Routing is rank1_model.Routing


def test_a_settings_file_names_a_users_prior(tmp_path):
    """``prior.kind`` accepts any registered prior (a user's class defined in Python): the
    settings check it by the registry, not a fixed list, and the run builds it by its
    ``from_settings``; an unknown name is refused naming the field, and a prior that
    settings cannot build (``SitePrior``) says what to do instead."""
    from twodg_pyro.pipeline import load_config
    from twodg_pyro.settings import ConfigError

    class SettingsStudentT(Prior):
        kind = "test_settings_student_t"
        settled = True

        def __init__(self, scale: float = 1.0):
            self.scale = float(scale)

        def site_distribution(self, site):
            return dist.StudentT(*map(self.constant, (3.0, 0.0, self.scale)))

    path = tmp_path / "run.toml"
    path.write_text('[prior]\nkind = "test_settings_student_t"\nscale = 0.25\n')
    cfg = load_config(path)
    prior = build_prior(cfg.prior, MLP(6, (5,), 3))
    assert type(prior) is SettingsStudentT and prior.scale == 0.25
    path.write_text('[prior]\nkind = "nope"\n')
    with pytest.raises(ConfigError, match="prior.kind = 'nope': must name a registered prior"):
        load_config(path)
    with pytest.raises(ValueError, match="build a SitePrior in Python"):
        SitePrior.from_settings(1.0, 0.0, MLP(6, (5,), 3))


@pytest.mark.parametrize("kind", ["custom", "distribution", "per_site"])
def test_the_library_refuses_a_prior_that_settings_cannot_build(kind):
    """``custom`` (the stand-in of a prior a file could not store: registered once
    ``twodg_pyro.io`` is imported, as it is here) and the distributions' priors pass no
    settings check, in Python as on the CLI: refused on entry, naming the field, not
    by a TypeError of ``run``."""
    from twodg_pyro.pipeline import config_from_dict
    from twodg_pyro.settings import ConfigError

    assert kind in PRIORS  # registered, so only the check keeps it out
    with pytest.raises(ConfigError, match=f"prior.kind = '{kind}': must name a registered"):
        config_from_dict({"prior": {"kind": kind}})
    assert config_from_dict({"prior": {"kind": "laplace"}}).prior.kind == "laplace"
