"""Compact model files: round trips on digits and ResNet-20, damaged files, the CLI."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from twodg_pyro.baselines import quantize_mean_field, quantized_size_mb
from twodg_pyro.cli import main
from twodg_pyro.guides import MeanFieldGuide, SharedGMMGuide
from twodg_pyro.io import save_2dg
from twodg_pyro.io.compact import (
    COMPACT_MAGIC,
    FAITHFUL_OPTIONS,
    compact_summary,
    export_compact,
    export_int8_mean_field,
    is_compact_file,
    load_compact,
    read_compact,
    resolve_model_file,
)
from twodg_pyro.io.model_file import load_model_file
from twodg_pyro.models import MLP
from twodg_pyro.pipeline.outputs.saved_models import evaluate_model_file

SPEC = {"name": "mlp", "kwargs": {"in_features": 64, "hidden": [128], "num_classes": 10}}


# ---------------------------------------------------------------------------- round trips
@pytest.fixture(scope="module")
def shared_models(trained_mean_field, stage2_structure):
    """The digits stage-2 structure under each tying (untrained stage 3: the centres of
    stage 2 are a valid, trained-like model), plus the mean-field model."""
    model, _ = trained_mean_field
    return {
        t: SharedGMMGuide(model, stage2_structure, tying=t)
        for t in ("representative", "stochastic", "tied")
    }


def _metrics(path):
    m = evaluate_model_file(path, num_samples=30, seed=0)
    return m["accuracy"], m["nll"], m["ece"]


INT8_OUTLIERS = {"outlier_mu_bits": 8, "outlier_sigma_bits": 4}  # the baseline's scheme


@pytest.mark.parametrize(
    ("tying", "options"),
    [
        ("representative", {}),
        ("stochastic", {}),
        ("tied", {}),
        ("representative", INT8_OUTLIERS),
        ("stochastic", INT8_OUTLIERS),
    ],
)
def test_compact_round_trip_predicts_like_the_full_model(
    trained_mean_field, shared_models, tying, options, tmp_path
):
    model, _ = trained_mean_field
    guide = shared_models[tying]
    full, small = tmp_path / "model_2dg.pt", tmp_path / "model.2dgz"
    save_2dg(full, model, guide, network=SPEC)
    rep = export_compact(small, model, guide, network=SPEC, **options)
    assert rep["total"] == small.stat().st_size < full.stat().st_size / 20
    # three Cholesky parameters per component, at float16 unless an entry falls outside
    # float16's normal range (then float32: tiny off-diagonals keep their precision)
    if tying == "representative":
        assert rep["covariances"] == 0 and rep["cov_dtype"] is None
    else:
        itemsize = {"float16": 2, "float32": 4}[rep["cov_dtype"]]
        assert rep["covariances"] == 3 * itemsize * guide.n_components
    # the index is within 5% of the empirical entropy of the assignment given the layer
    assert rep["index_bits_per_weight"] <= 1.05 * rep["index_entropy_bits_per_site"]
    assert rep["index_bits_per_weight"] <= 1.05 * rep["index_entropy_bits"]

    m2, g2 = load_compact(small)
    assert isinstance(g2, SharedGMMGuide) and g2.tying == tying
    s, s2 = guide.structure(), g2.structure()
    for name in (
        "outlier_index",
        "plain_index",
        "plain_component",
        "ellipse_index",
        "ellipse_components",
    ):
        assert torch.equal(getattr(s, name), getattr(s2, name)), name
    assert (s.ellipse_alphas - s2.ellipse_alphas).abs().max() <= 1 / 255
    torch.testing.assert_close(s2.means, s.means, rtol=1e-3, atol=1e-7)
    mu_bits = options.get("outlier_mu_bits", 16)
    step = s.outlier_loc.abs().max() / (2 ** (mu_bits - 1) - 1)  # bounds every layer's step
    assert (s.outlier_loc - s2.outlier_loc).abs().max() <= step / 2 + 1e-6
    sigma_bits = options.get("outlier_sigma_bits", 16)
    log_s = s.outlier_scale.log()
    half_step = (log_s.max() - log_s.min()) / (2 * (2**sigma_bits - 1))  # bounds every layer's
    assert (s2.outlier_scale.log() - log_s).abs().max() <= half_step + 1e-5
    if tying != "representative":
        torch.testing.assert_close(g2.chol_log_diag, guide.chol_log_diag, rtol=1e-3, atol=1e-3)

    acc, nll, ece = _metrics(full)
    acc2, nll2, ece2 = _metrics(small)
    assert abs(acc - acc2) <= 0.001 and abs(nll - nll2) <= 0.01 and abs(ece - ece2) <= 0.005


def test_float32_centres_are_stored_exactly(trained_mean_field, shared_models, tmp_path):
    model, _ = trained_mean_field
    guide = shared_models["stochastic"]
    path = tmp_path / "m.2dgz"
    rep = export_compact(path, model, guide, network=SPEC, centre_dtype="float32")
    assert rep["centre_dtype"] == "float32" and rep["centres"] == 8 * guide.n_components
    _, g2 = load_compact(path)
    assert torch.equal(g2.centre_mu, guide.centre_mu)
    assert torch.equal(g2.chol_log_diag, guide.chol_log_diag)
    assert torch.equal(g2.chol_off, guide.chol_off)
    torch.testing.assert_close(g2.centre_sigma(), guide.centre_sigma(), rtol=1e-6, atol=0)


def test_float16_falls_back_to_float32_for_values_it_cannot_hold(
    trained_mean_field, stage2_structure, tmp_path
):
    model, _ = trained_mean_field
    s = stage2_structure
    tiny = s.means.clone()
    tiny[0, 1] = 1e-6  # a centre sigma below float16's normal range
    from dataclasses import replace

    guide = SharedGMMGuide(model, replace(s, means=tiny))
    rep = export_compact(tmp_path / "m.2dgz", model, guide, network=SPEC)
    assert rep["centre_dtype"] == "float32"
    _, g2 = load_compact(tmp_path / "m.2dgz")
    torch.testing.assert_close(g2.centres(), guide.centres(), rtol=1e-5, atol=1e-9)


def test_int8_mean_field_file_matches_the_quantiser_and_its_size(trained_mean_field, tmp_path):
    model, guide = trained_mean_field
    n_w, n_sites = model.num_weights, len(model.sites)
    for bits in (1, 2, 4):
        path = tmp_path / f"mf{bits}.2dgz"
        sizes = export_int8_mean_field(path, model, guide, bits, network=SPEC)
        # bytes on disk = the baseline's size formula + the container (header, checksum)
        payload = sizes["params"] + sizes["mu"] + sizes["sigma"]
        assert payload == round(quantized_size_mb(n_w, n_sites, bits) * 1e6)
        assert sizes["total"] == path.stat().st_size == payload + sizes["header"] + sizes["net"]
        m2, g2 = load_compact(path)
        assert isinstance(g2, MeanFieldGuide)
        q = quantize_mean_field(guide, bits)
        for site in guide.sites:
            assert torch.equal(g2.loc(site.name), q.loc(site.name))
            torch.testing.assert_close(g2.scale(site.name), q.scale(site.name))
    with pytest.raises(ValueError, match="sigma_bits must be 1, 2, 4 or 8"):
        export_int8_mean_field(tmp_path / "x.2dgz", model, guide, 3)


# ---------------------------------------------------------------------------- bad files
@pytest.fixture
def compact_file(trained_mean_field, shared_models, tmp_path):
    model, _ = trained_mean_field
    path = tmp_path / "model.2dgz"
    export_compact(path, model, shared_models["representative"], network=SPEC)
    return path


def test_damaged_compact_files_are_rejected_by_name(compact_file, tmp_path):
    data = compact_file.read_bytes()
    cases = {
        "truncated": (data[: len(data) // 2], "is truncated"),
        "one byte short": (data[:-1], "is truncated"),
        "extended": (data + b"\0", "longer than its content"),
        "flipped payload byte": (
            data[: len(data) - 100] + bytes([data[-100] ^ 1]) + data[len(data) - 99 :],
            "SHA-256",
        ),
        "flipped header byte": (data[:20] + bytes([data[20] ^ 0x10]) + data[21:], "SHA-256"),
        "no magic": (b"PK" + data[2:], "not a compact"),
        "empty": (b"", "not a compact"),
        "other version": (data[:8] + struct.pack("<H", 2) + data[10:], "format version 2"),
    }
    for name, (blob, message) in cases.items():
        bad = tmp_path / f"{name.replace(' ', '_')}.2dgz"
        bad.write_bytes(blob)
        with pytest.raises(ValueError, match=message) as err:
            load_compact(bad)
        assert str(bad) in str(err.value), name
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_compact(tmp_path / "missing.2dgz")


def test_wrong_network_and_options_are_clear_errors(
    trained_mean_field, shared_models, compact_file, tmp_path
):
    with pytest.raises(ValueError, match="does not match the one saved in") as err:
        load_compact(compact_file, net=MLP(64, (32,), 10))
    assert str(compact_file) in str(err.value)
    model, _ = trained_mean_field
    guide = shared_models["representative"]
    for kwargs, message in (
        ({"outlier_sigma_bits": 0}, "outlier_sigma_bits must be an integer in"),
        ({"alpha_bits": 1}, "alpha_bits must be an integer in"),
        ({"centre_dtype": "float8"}, "centre_dtype must be 'float16' or 'float32'"),
        ({"feature_dtype": "int8"}, "feature_dtype must be 'float16' or 'float32', got 'int8'"),
        ({"index_coding": "huffman"}, "index coding must be"),
    ):
        with pytest.raises(ValueError, match=message):
            export_compact(tmp_path / "x.2dgz", model, guide, **kwargs)
    assert not (tmp_path / "x.2dgz").exists()


# ---------------------------------------------------------------------------- CLI
def test_cli_export_then_evaluate_the_compact_file(
    trained_mean_field, shared_models, tmp_path, capsys
):
    model, _ = trained_mean_field
    run = tmp_path / "run"
    full = run / "model_2dg.pt"
    save_2dg(full, model, shared_models["representative"], network=SPEC)
    assert main(["export", str(run)]) == 0
    out = capsys.readouterr().out
    small = run / "model_2dg.2dgz"
    assert f"wrote {small}" in out and "bits/weight" in out
    assert is_compact_file(small) and not is_compact_file(full)
    assert resolve_model_file(run) == full
    summary = compact_summary(small)
    assert summary["total_bytes"] == small.stat().st_size
    assert sum(summary["section_bytes"].values()) == summary["total_bytes"]

    metrics = {}
    for name, path in (("full", full), ("compact", small)):
        dest = tmp_path / f"{name}.json"
        assert main(["evaluate", str(path), "--out", str(dest)]) == 0
        metrics[name] = json.loads(dest.read_text())
    a, b = metrics["full"], metrics["compact"]
    assert abs(a["accuracy"] - b["accuracy"]) <= 0.001
    assert abs(a["nll"] - b["nll"]) <= 0.01 and abs(a["ece"] - b["ece"]) <= 0.005
    capsys.readouterr()

    # options, and the errors: an existing compact source, a folder without a model
    assert (
        main(
            [
                "export",
                str(full),
                "--out",
                str(tmp_path / "g.2dgz"),
                "--index-coding",
                "global",
                "--precision",
                "float32",
                "--covariances",
                "yes",
            ]
        )
        == 0
    )
    header, _ = read_compact(tmp_path / "g.2dgz")
    assert header["index"]["coding"] == "global" and header["centre_dtype"] == "float32"
    assert header["covariances"] is True
    m, g = load_model_file(tmp_path / "g.2dgz")
    assert isinstance(g, SharedGMMGuide)
    assert main(["export", str(small)]) == 2
    assert "already a compact file" in capsys.readouterr().err
    (tmp_path / "empty_run").mkdir()
    assert main(["export", str(tmp_path / "empty_run")]) == 2
    assert "has no model_2dg.pt" in capsys.readouterr().err
    tampered = tmp_path / "t.2dgz"
    data = small.read_bytes()
    tampered.write_bytes(data[:-40] + bytes([data[-40] ^ 4]) + data[-39:])
    assert main(["evaluate", str(tampered)]) == 2
    err = capsys.readouterr().err
    assert str(tampered) in err and "SHA-256" in err


def test_magic_is_the_first_bytes(compact_file):
    assert compact_file.read_bytes().startswith(COMPACT_MAGIC)


# ---------------------------------------------------------------------------- ResNet-20
@pytest.fixture(scope="module")
def resnet20_digits():
    """A ResNet-20 BNN briefly trained on the 8x8 digits (2 mean-field epochs, stage 2
    with 16 components, 2 stage-3 epochs): (model, guide, split)."""
    from twodg_pyro.data import make_loader
    from twodg_pyro.infer import fit
    from twodg_pyro.models import resnet20
    from twodg_pyro.pipeline import SharingConfig
    from twodg_pyro.pipeline.settings.build import build_model, load_data
    from twodg_pyro.pipeline.settings.config import DataConfig, PriorConfig
    from twodg_pyro.sharing import build_sharing

    split = load_data(DataConfig(name="digits"), image=True)
    model = build_model(
        resnet20(num_classes=10, in_channels=1), PriorConfig("layerwise"), len(split.train)
    )
    loader = make_loader(split.train, 128, shuffle=True, seed=0)
    mf = MeanFieldGuide(model, seed=0)
    fit(model, mf, loader, epochs=2, lr=1e-2, progress=False)
    cfg = SharingConfig(
        outlier_rule="quantile", mu_quantile=0.995, grad_percentile=0.005, n_components=16, n_min=20
    )
    structure, _ = build_sharing(model, mf, loader, cfg)
    guide = SharedGMMGuide(model, structure)
    fit(model, guide, loader, epochs=2, lr=1e-2, progress=False)
    return model, guide, split


def test_resnet20_round_trip_on_digits_images(resnet20_digits, tmp_path):
    """The ResNet-20 BNN on the digits: the compact file predicts like the full one."""
    model, guide, _ = resnet20_digits
    spec = {"name": "resnet20", "kwargs": {"num_classes": 10, "in_channels": 1}}
    full, small = tmp_path / "r.pt", tmp_path / "r.2dgz"
    save_2dg(full, model, guide, network=spec)
    rep = export_compact(small, model, guide, network=spec)
    assert rep["n_weights"] == model.num_weights > 250_000
    assert rep["net"] > 0  # BatchNorm parameters and statistics
    assert rep["total"] < full.stat().st_size / 20
    assert rep["index_bits_per_weight"] <= 1.05 * rep["index_entropy_bits_per_site"]
    m2, g2 = load_compact(small)
    for k, v in model.net.state_dict().items():
        if k not in model.site_names:
            assert torch.equal(m2.net.state_dict()[k], v), k
    a = evaluate_model_file(full, num_samples=10, seed=0)
    b = evaluate_model_file(small, num_samples=10, seed=0)
    assert abs(a["accuracy"] - b["accuracy"]) <= 0.001
    assert abs(a["nll"] - b["nll"]) <= 0.01 and abs(a["ece"] - b["ece"]) <= 0.005


def test_a_head_file_over_the_mean_bodys_own_batchnorm_statistics(resnet20_digits, tmp_path):
    """A Laplace head fitted on the mean body with BatchNorm statistics recomputed at the
    mean (``GuidePosterior.with_mean_norm_stats``) is written with that model: read
    back, its body holds those statistics and it predicts as in memory; the same head
    beside the model whose statistics are the draws' is refused, naming a statistic."""
    pytest.importorskip("laplace")
    from twodg_pyro.data import make_loader
    from twodg_pyro.methods import GuidePosterior, fit_laplace, load_method

    model, guide, split = resnet20_digits
    loader = make_loader(split.train, 128)
    at_mean = GuidePosterior(model, guide).with_mean_norm_stats(loader)
    post = fit_laplace(at_mean.mean_network(), loader, marglik_steps=10)
    spec = {"name": "resnet20", "kwargs": {"num_classes": 10, "in_channels": 1}}
    with pytest.raises(ValueError, match="running_"):
        export_compact(tmp_path / "wrong.2dgz", model, guide, network=spec, laplace=post)
    export_compact(tmp_path / "head.2dgz", at_mean.model, guide, network=spec, laplace=post)
    loaded = load_method(tmp_path / "head.2dgz")
    mine = dict(at_mean.model.net.named_buffers())
    for name, b in loaded.net.named_buffers():
        assert torch.equal(b, mine[name]), name
    x = split.test.tensors[0]
    p_mem, p_file = post.predict(x, 30, 0).mean, loaded.predict(x, 30, 0).mean
    assert float((p_mem - p_file).abs().max()) < 0.05


def test_float64_network_and_pretrained_prior(trained_mean_field, stage2_structure, tmp_path):
    """The network's dtype comes back; a PretrainedPrior (whose centres, the pretrained
    weights, a compact file does not hold) loads, with a warning, as an UnavailablePrior
    that raises where the prior is used: never as a silent N(0, 1)."""
    import copy
    import warnings

    from twodg_pyro.bnn import BNNModel
    from twodg_pyro.io import UnavailablePrior
    from twodg_pyro.priors import NormalPrior, PretrainedPrior

    model, _ = trained_mean_field
    net = copy.deepcopy(model.net).double()
    m64 = BNNModel(net, prior=PretrainedPrior.from_network(net, 0.1), likelihood=model.likelihood)
    guide = SharedGMMGuide(m64, stage2_structure)
    path = tmp_path / "m64.2dgz"
    export_compact(path, m64, guide, network=SPEC, **FAITHFUL_OPTIONS)
    with pytest.warns(UserWarning, match="PretrainedPrior"):
        m2, g2 = load_compact(path)
    assert m2.dtype == torch.float64 and g2.centre_mu.dtype == torch.float64
    assert isinstance(m2.prior, UnavailablePrior)
    with pytest.raises(ValueError, match="pass it to the loader"):
        m2.prior_distribution(m2.sites[0])
    torch.testing.assert_close(g2.centres(), guide.centres(), rtol=1e-6, atol=1e-9)
    x = torch.randn(5, 64, dtype=torch.float64)
    torch.manual_seed(1)
    w = guide.sample_weights(4)
    torch.manual_seed(1)
    w2 = g2.sample_weights(4)
    for k in w:  # same draws up to the file's rounding (16-bit outliers)
        torch.testing.assert_close(w2[k], w[k], rtol=1e-3, atol=1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m3, _ = load_compact(path, prior=NormalPrior(0.5))
    assert m3.prior.scale == 0.5
    assert torch.isfinite(m2.network_forward({k: v[0] for k, v in w2.items()}, x)).all()


# ---------------------------------------------------------------------------- evaluation
def test_compact_file_keeps_the_runs_data_set_and_draws(
    trained_mean_field, shared_models, tmp_path, capsys
):
    """``export`` carries the full file's evaluation record into the ``.2dgz``:
    ``evaluate`` then uses the run's data set, split settings, seed and draws without
    being told them (issue 31: an MNIST model's compact file failed on 'digits')."""
    from twodg_pyro.pipeline.outputs.saved_models import evaluation_defaults

    model, _ = trained_mean_field
    record = {
        "num_samples": 7,
        "seed": 3,
        "n_examples": 539,
        "split": "test",
        "method": "2dg",
        "data": {"name": "digits", "root": None, "test_fraction": 0.3, "split_seed": 0},
        "metrics": {"accuracy": 0.5},
    }
    full = tmp_path / "model_2dg.pt"
    save_2dg(full, model, shared_models["representative"], network=SPEC, evaluation=record)
    small = tmp_path / "model_2dg.2dgz"
    assert main(["export", str(full), "--out", str(small)]) == 0
    capsys.readouterr()
    header, _ = read_compact(small)
    kept = header["evaluation"]
    assert kept["data"] == record["data"] and kept["num_samples"] == 7 and kept["seed"] == 3
    assert "metrics" not in kept and kept["source_metrics"] == {"accuracy": 0.5}
    assert kept["source"] == "model_2dg.pt"
    out = evaluate_model_file(small)
    assert (out["num_samples"], out["seed"], out["data"]) == (7, 3, "digits")
    assert out["n_examples"] == evaluate_model_file(full)["n_examples"] == 539
    assert "recorded_metrics" not in out  # the full model's numbers, not this file's

    # another data set's record is read back (MNIST is not on this machine)
    mnist = dict(record, data={"name": "mnist", "root": "data/mnist"})
    export_compact(small, model, shared_models["representative"], SPEC, evaluation=mnist)
    assert evaluation_defaults(small)["data"] == "mnist"
    with pytest.raises(TypeError, match="evaluation must be a dict"):
        export_compact(tmp_path / "x.2dgz", model, shared_models["tied"], SPEC, evaluation=[1])


def test_mnist_compact_file_evaluates_without_data(tmp_path, capsys):
    """A 784-input model of (fake) MNIST: its exported ``.2dgz`` evaluates on MNIST with no
    ``--data``; one written without an evaluation record (as every file before issue 31)
    is assumed digits and the error says to pass ``--data``."""
    from test_data import write_fake_mnist
    from test_protocol_and_loop import toy_structure

    from twodg_pyro.bnn import BNNModel
    from twodg_pyro.likelihoods import Categorical

    write_fake_mnist(tmp_path / "data", "MNIST")
    spec = {"name": "mlp", "kwargs": {"in_features": 784, "hidden": [8], "num_classes": 10}}
    model = BNNModel(MLP(784, (8,), 10), prior=1.0, likelihood=Categorical(100))
    guide = SharedGMMGuide(model, toy_structure(model), tying="representative")
    record = {
        "num_samples": 4,
        "seed": 1,
        "data": {"name": "mnist", "root": str(tmp_path / "data")},
    }
    full = tmp_path / "model_2dg.pt"
    save_2dg(full, model, guide, network=spec, evaluation=record)
    small = tmp_path / "model_2dg.2dgz"
    assert main(["export", str(full), "--out", str(small)]) == 0
    dest = tmp_path / "m.json"
    assert main(["evaluate", str(small), "--out", str(dest)]) == 0
    out = json.loads(dest.read_text())
    assert (out["data"], out["num_samples"], out["seed"], out["n_examples"]) == ("mnist", 4, 1, 10)

    old = tmp_path / "old.2dgz"
    export_compact(old, model, guide, network=spec)
    assert "evaluation" not in read_compact(old)[0]
    capsys.readouterr()
    assert main(["evaluate", str(old)]) == 2
    err = capsys.readouterr().err
    assert "does not fit data set 'digits'" in err and "pass --data" in err
    assert main(["evaluate", str(old), "--data", "mnist", "--root", str(tmp_path / "data")]) == 0
