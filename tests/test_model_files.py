"""Model files for every method (``save_model`` / ``load_model``): round trips of the
mean-field, 2DG, rank-1 and SSVI BNNs, their priors, a new guide type registered in one
call, refused guides, damaged files, and the compact files through the same loader."""

from __future__ import annotations

import json
import warnings

import pyro.distributions as dist
import pytest
import torch

from twodg_pyro.bnn import BNNModel
from twodg_pyro.cli import main
from twodg_pyro.data import make_loader
from twodg_pyro.evaluation import seeded_predict
from twodg_pyro.guides import (
    CauchyPrior,
    MeanFieldGuide,
    Rank1BNNModel,
    Rank1Guide,
    SharedGMMGuide,
    SSVIGuide,
    rank1_prior,
)
from twodg_pyro.infer import fit
from twodg_pyro.io import (
    PriorNotStoredWarning,
    UnavailablePrior,
    export_compact,
    load_model,
    model_format,
    read_model_header,
    register_guide_file,
    save_2dg,
    save_model,
)
from twodg_pyro.io.model_format import guide_table
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.models import MLP
from twodg_pyro.priors import (
    LaplacePrior,
    LayerwiseNormalPrior,
    NormalPrior,
    PretrainedPrior,
    SitePrior,
)

SPEC = {"name": "mlp", "kwargs": {"in_features": 64, "hidden": [16], "num_classes": 10}}


@pytest.fixture(scope="module")
def loader(digits):
    return make_loader(digits.train, 128, shuffle=True, seed=0)


def _mlp(seed: int = 0) -> MLP:
    torch.manual_seed(seed)
    return MLP(64, (16,), 10)


def _same_predictions(a, b, data, seed: int = 7) -> None:
    pa = seeded_predict(*a, data, 10, seed)
    pb = seeded_predict(*b, data, 10, seed)
    assert torch.equal(pa.mean, pb.mean)


def _trained(kind: str, digits, loader):
    n = len(digits.train)
    if kind == "rank1":
        model = Rank1BNNModel(
            _mlp(), prior=rank1_prior("cauchy", 0.5), likelihood=Categorical(n), components=3
        )
        guide = Rank1Guide(model)
    else:
        model = BNNModel(_mlp(), prior=LaplacePrior(0.3), likelihood=Categorical(n))
        guide = SSVIGuide(model, density=0.2) if kind == "ssvi" else MeanFieldGuide(model)
    fit(model, guide, loader, epochs=2, lr=1e-2, progress=False)
    return model, guide


@pytest.mark.parametrize("kind", ["mean_field", "rank1", "ssvi"])
def test_every_method_round_trips(kind, digits, loader, tmp_path):
    model, guide = _trained(kind, digits, loader)
    path = save_model(tmp_path / f"model_{kind}.pt", model, guide, network=SPEC)
    header = read_model_header(path)
    assert header["kind"] == "twodg_pyro.BNN" and header["method"] == kind
    assert header["site_names"] == model.site_names
    m2, g2 = load_model(path)
    assert type(m2) is type(model) and type(g2) is type(guide)
    assert type(m2.prior) is type(model.prior)
    for (k, v), (k2, v2) in zip(guide.state_dict().items(), g2.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(v, v2)
    _same_predictions((model, guide), (m2, g2), digits.test.tensors)
    if kind == "ssvi":  # the subspace comes back, not the constructor's random one
        for s in guide.sites:
            assert torch.equal(g2.active_indices(s.name), guide.active_indices(s.name))
    if kind == "rank1":  # the shared weights W are trained: they come from the file
        assert isinstance(m2.prior, CauchyPrior) and m2.prior.scale == 0.5
        assert m2.components == 3
        torch.testing.assert_close(m2.net.layers[0].weight, model.net.layers[0].weight)


def test_2dg_through_the_same_api(trained_mean_field, stage2_structure, digits, tmp_path):
    model, _ = trained_mean_field
    guide = SharedGMMGuide(model, stage2_structure, tying="stochastic")
    spec = {"name": "mlp", "kwargs": {"in_features": 64, "hidden": [128], "num_classes": 10}}
    path = save_model(tmp_path / "model_2dg.pt", model, guide, network=spec)
    assert read_model_header(path)["kind"] == "twodg_pyro.SharedGMMBNN"
    m2, g2 = load_model(path)
    assert isinstance(g2, SharedGMMGuide) and g2.tying == "stochastic"
    _same_predictions((model, guide), (m2, g2), digits.test.tensors)
    # the compact file loads through load_model too
    export_compact(tmp_path / "m.2dgz", model, guide, network=spec)
    m3, g3 = load_model(tmp_path / "m.2dgz")
    assert isinstance(g3, SharedGMMGuide) and g3.tying == "stochastic"


def test_a_new_guide_type_is_one_registration(digits, loader, tmp_path, monkeypatch):
    """A guide type of its own (here a mean-field subclass with a constructor argument)
    is refused until registered, then round-trips through save_model / load_model with
    its argument, its type and its state; a registered method name is not taken over."""
    monkeypatch.setattr(model_format, "_GUIDE_FILES", dict(model_format._GUIDE_FILES))

    class TemperedMeanField(MeanFieldGuide):
        method = "tempered_mean_field"

        def __init__(self, model, temperature: float = 1.0):
            super().__init__(model, init_scale=0.05)
            self.temperature = temperature

    model = BNNModel(_mlp(), prior=LaplacePrior(0.3), likelihood=Categorical(len(digits.train)))
    guide = TemperedMeanField(model, temperature=0.5)
    fit(model, guide, loader, epochs=1, lr=1e-2, progress=False)
    path = tmp_path / "model_tempered.pt"
    with pytest.raises(
        TypeError, match=r"got TemperedMeanField: register it with .*register_guide"
    ):
        save_model(path, model, guide, network=SPEC)  # exactly its type: not as a MeanFieldGuide
    assert not path.exists()

    entry = register_guide_file(
        TemperedMeanField,
        "tempered_mean_field",
        lambda g: (guide_table(g, temperature=g.temperature), {}),
    )
    assert entry.guide_cls is TemperedMeanField and entry.model_cls is BNNModel
    save_model(path, model, guide, network=SPEC)
    header = read_model_header(path)
    assert header["kind"] == "twodg_pyro.BNN" and header["method"] == "tempered_mean_field"
    assert header["guide"] == {"class": "TemperedMeanField", "kwargs": {"temperature": 0.5}}
    m2, g2 = load_model(path)
    assert type(g2) is TemperedMeanField and g2.temperature == 0.5
    for (k, v), (k2, v2) in zip(guide.state_dict().items(), g2.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(v, v2)
    _same_predictions((model, guide), (m2, g2), digits.test.tensors)
    with pytest.raises(ValueError, match="method 'mean_field' is MeanFieldGuide's"):
        register_guide_file(TemperedMeanField, "mean_field")
    with pytest.raises(TypeError, match="a TemperedMeanField goes with a BNNModel"):
        rank1 = Rank1BNNModel(_mlp(), likelihood=Categorical(10), components=2)
        save_model(tmp_path / "x.pt", rank1, guide)
    del model_format._GUIDE_FILES[TemperedMeanField]  # a method this process does not know
    known = r"\['mean_field', 'rank1', 'ssvi'\]"
    with pytest.raises(ValueError, match=f"method = 'tempered_mean_field' is not one of {known}"):
        load_model(path)
    entry = register_guide_file(TemperedMeanField)  # the method the class declares
    assert entry.method == "tempered_mean_field"
    del model_format._GUIDE_FILES[TemperedMeanField]

    class Nameless(MeanFieldGuide):
        method = None

    with pytest.raises(ValueError, match="Nameless declares no method"):
        register_guide_file(Nameless)


def test_library_priors_round_trip(digits, tmp_path):
    n = len(digits.train)
    net = _mlp()
    centres = {k: v.detach() + 0.5 for k, v in net.named_parameters()}
    priors = [
        NormalPrior(0.3, loc=0.1),
        LaplacePrior(0.2),
        LayerwiseNormalPrior(1.5, bias_scale=0.7),
        PretrainedPrior.from_network(net, 0.05, 0.1),  # centred at the network's values
        PretrainedPrior(centres, 0.1),  # other centres: stored beside the network
        dist.StudentT(3.0, 0.0, 0.1),
        {"layers.0.weight": dist.Laplace(0.0, 0.2), "default": None},
    ]
    for i, prior in enumerate(priors):
        if isinstance(prior, dict):
            prior = SitePrior({"layers.0.weight": dist.Laplace(0.0, 0.2)}, dist.Normal(0.0, 2.0))
        model = BNNModel(_mlp(), prior=prior, likelihood=Categorical(n))
        guide = MeanFieldGuide(model)
        path = tmp_path / f"p{i}.pt"
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a storable prior warns about nothing
            save_model(path, model, guide, network=SPEC)
            m2, _ = load_model(path)
        for site in model.sites:
            w = torch.randn(site.shape) * 0.3
            a = model.prior_distribution(site).log_prob(w)
            b = m2.prior_distribution(site).log_prob(w)
            torch.testing.assert_close(a, b, msg=f"prior {i}, site {site.name}")


def test_a_prior_that_cannot_be_stored_is_never_silently_replaced(digits, loader, tmp_path):
    model = BNNModel(
        _mlp(),
        prior=lambda site: dist.StudentT(3.0, 0.0, 0.1),
        likelihood=Categorical(len(digits.train)),
    )
    guide = MeanFieldGuide(model)
    path = tmp_path / "m.pt"
    with pytest.warns(PriorNotStoredWarning, match="cannot be stored"):
        save_model(path, model, guide, network=SPEC)
    assert read_model_header(path)["prior"]["kind"] == "custom"
    with pytest.warns(PriorNotStoredWarning, match="could not be stored"):
        m2, g2 = load_model(path)
    assert isinstance(m2.prior, UnavailablePrior)
    _same_predictions((model, guide), (m2, g2), digits.test.tensors)  # prediction works
    with pytest.raises(ValueError, match="was not stored in the file.*prior="):
        m2.prior_distribution(m2.sites[0])
    with pytest.raises(ValueError, match="was not stored"):  # training needs it
        fit(m2, g2, loader, epochs=1, lr=1e-2, progress=False)
    m3, _ = load_model(path, prior=lambda site: dist.StudentT(3.0, 0.0, 0.1))
    w = torch.zeros(m3.sites[0].shape)
    assert torch.isfinite(m3.prior_distribution(m3.sites[0]).log_prob(w))


def test_autoguides_and_other_guides_are_refused(digits, tmp_path):
    from pyro.infer.autoguide import AutoNormal

    model = BNNModel(_mlp(), prior=1.0, likelihood=Categorical(len(digits.train)))
    with pytest.raises(TypeError, match="autoguide .*AutoNormal.*param_store.*MeanFieldGuide"):
        save_model(tmp_path / "a.pt", model, AutoNormal(model))
    with pytest.raises(TypeError, match="save_model stores"):
        save_model(tmp_path / "b.pt", model, torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="use twodg_pyro.io.save_model"):
        save_2dg(tmp_path / "c.pt", model, MeanFieldGuide(model))
    assert not list(tmp_path.iterdir())


def test_damaged_and_foreign_files_are_named(digits, loader, tmp_path):
    model, guide = _trained("mean_field", digits, loader)
    path = save_model(tmp_path / "m.pt", model, guide, network=SPEC)
    payload = torch.load(path, weights_only=True)
    key = next(k for k in payload if k.startswith("guide/"))
    payload[key] = payload[key] + 1e-3  # changed content, old checksum
    torch.save(payload, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="bad.pt.*checksum"):
        load_model(tmp_path / "bad.pt")
    torch.save({"header": json.dumps({"kind": "something.else"})}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="other.pt.*not a twodg_pyro model file"):
        load_model(tmp_path / "other.pt")
    (tmp_path / "trunc.pt").write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match="trunc.pt"):
        load_model(tmp_path / "trunc.pt")


def test_evaluate_and_diagnose_accept_every_method(digits, loader, tmp_path, capsys):
    for kind in ("mean_field", "rank1", "ssvi"):
        model, guide = _trained(kind, digits, loader)
        path = save_model(tmp_path / f"model_{kind}.pt", model, guide, network=SPEC)
        assert main(["evaluate", str(path), "--num-samples", "5", "--seed", "2"]) == 0
        out = json.loads(capsys.readouterr().out)
        ref = seeded_predict(model, guide, digits.test.tensors, 5, 2)
        from twodg_pyro.metrics import classification_metrics

        assert out["method"] == kind
        assert out["accuracy"] == classification_metrics(ref.mean, ref.targets)["accuracy"]
        folder = tmp_path / f"diag_{kind}"
        args = ["diagnose", str(path), "--out", str(folder), "--num-samples", "6"]
        assert main(args + ["--khat-samples", "30", "--max-examples", "150"]) == 0, kind
        report = json.loads((folder / "diagnostics.json").read_text())
        assert report["errors"] == {} and report["method"] == kind
        assert (folder / f"inference_data_{kind}.nc").is_file()
        capsys.readouterr()
