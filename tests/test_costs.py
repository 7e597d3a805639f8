"""What a user deploys (issue 31): every record's file bytes, bytes per weight, forward
passes and prediction time, measured on the files the run wrote."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from twodg_pyro.accounting import network_bytes
from twodg_pyro.io import load_compact, load_model
from twodg_pyro.io.compact import read_compact
from twodg_pyro.methods import Network
from twodg_pyro.models import MLP
from twodg_pyro.pipeline.outputs.costs import DETERMINISTIC_FILE, time_call
from twodg_pyro.pipeline.outputs.results import format_table
from twodg_pyro.settings import ConfigError

COST_FIELDS = (
    "file",
    "file_bytes",
    "bytes_per_weight",
    "float32_ratio",
    "forwards_per_prediction",
    "predict_seconds",
    "relative_predict_seconds",
)


@pytest.fixture(scope="module")
def costs_run(tmp_path_factory):
    """The tiny digits run with the deterministic row too (about two seconds)."""
    from conftest import _TINY_RUN

    from twodg_pyro.pipeline import config_from_dict, run

    cfg = copy.deepcopy(_TINY_RUN)
    cfg.update(methods=["deterministic", "mean_field", "2dg"], checkpoint_every=0)
    out = tmp_path_factory.mktemp("costs") / "run"
    run(config_from_dict(cfg), out)
    return out


def _records(run_dir) -> dict:
    payload = json.loads((run_dir / "results.json").read_text())
    return {r["method"]: r for r in payload["records"]}


def test_every_row_of_a_run_has_its_bytes_and_forwards(costs_run):
    records = _records(costs_run)
    cfg = json.loads((costs_run / "results.json").read_text())["config"]
    n_net = 64 * 16 + 16 + 16 * 10 + 10
    for method, r in records.items():
        for key in COST_FIELDS:
            assert key in r, (method, key)
        assert r["bytes_per_weight"] == pytest.approx(r["file_bytes"] / n_net)
        assert r["float32_ratio"] == pytest.approx(4 * n_net / r["file_bytes"])
        assert r["predict_seconds"] > 0 and r["relative_predict_seconds"] > 0
    det = records["deterministic"]
    assert det["file"] == DETERMINISTIC_FILE
    assert (det["file_bytes"], det["bytes_per_weight"], det["forwards_per_prediction"]) == (
        4 * n_net,
        4.0,
        1,
    )
    assert det["file_bytes_int8"] == n_net + 4 * 4  # 4 parameter tensors, a scale each
    assert det["relative_predict_seconds"] == 1.0  # the reference itself
    # the files the rows measure are the files of the run folder, byte for byte
    assert records["2dg"]["file"] == "model_2dg.2dgz"
    assert records["mean_field"]["file"] == "model_mean_field.pt"
    for method in ("2dg", "mean_field"):
        path = costs_run / records[method]["file"]
        assert records[method]["file_bytes"] == path.stat().st_size
        assert records[method]["forwards_per_prediction"] == cfg["num_samples"]
    assert records["2dg"]["file_bytes"] < records["mean_field"]["file_bytes"]
    assert records["2dg"]["float32_ratio"] > 1  # smaller than the float32 network


def test_the_compact_file_of_a_run_predicts_the_rows_numbers(costs_run):
    """``model_2dg.2dgz`` loads back to the row's predictions (``file_prob_diff``: the
    largest probability difference, same seeded draws) and knows its data set."""
    from twodg_pyro.evaluation import seeded_predict
    from twodg_pyro.pipeline.outputs.saved_models import evaluate_model_file

    r = _records(costs_run)["2dg"]
    cfg = json.loads((costs_run / "results.json").read_text())["config"]
    compact = costs_run / "model_2dg.2dgz"
    assert read_compact(compact)[0]["evaluation"]["data"]["name"] == "digits"
    assert 0 <= r["file_prob_diff"] < 5e-3
    full = evaluate_model_file(costs_run / "model_2dg.pt")
    small = evaluate_model_file(compact)
    assert (full["accuracy"], full["nll"]) == (r["accuracy"], r["nll"])
    assert abs(small["accuracy"] - r["accuracy"]) <= 2 / small["n_examples"]
    assert small["nll"] == pytest.approx(r["nll"], abs=0.01)
    # the largest probability difference, recomputed from the two files
    from twodg_pyro.pipeline.settings.build import eval_data, load_data
    from twodg_pyro.pipeline.settings.config import DataConfig

    data = eval_data(load_data(DataConfig(name="digits"), image=False).test, "cpu")
    S, seed = cfg["num_samples"], cfg["seed"]
    a = seeded_predict(*load_model(costs_run / "model_2dg.pt"), data, S, seed).mean
    b = seeded_predict(*load_compact(compact), data, S, seed).mean
    assert float((a - b).abs().max()) == pytest.approx(r["file_prob_diff"], abs=1e-6)


def test_the_table_shows_bytes_beside_the_counts_of_floats(costs_run):
    table = format_table(list(_records(costs_run).values()))
    head = table.splitlines()[0]
    for column in ("file bytes", "bytes/weight", "x smaller than fp32 det", "forwards"):
        assert column in head
    assert "compression (floats)" in head and "MB (floats)" in head


def test_network_bytes_and_forwards():
    net = MLP(4, (3,), 2)  # 4*3 + 3 + 3*2 + 2 = 23 parameters in 4 tensors
    assert network_bytes(net) == {"params": 23, "float32": 92, "int8": 23 + 16}
    bn = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    # 6 + 4 parameters, 4 float statistics (num_batches_tracked is not counted)
    assert network_bytes(bn) == {"params": 10, "float32": 56, "int8": 10 + 16 + 16}
    assert Network(net).forwards_per_prediction(30) == 1
    calls = []
    assert time_call(lambda: calls.append(1), min_seconds=0.0) >= 0 and calls == [1]
    time_call(lambda: calls.append(1), min_seconds=10.0, max_repeats=3)
    assert len(calls) == 4
    with pytest.raises(ValueError, match="max_repeats must be at least 1, got 0"):
        time_call(lambda: None, max_repeats=0)


def test_variant_records_carry_their_own_files_bytes_and_forwards(tiny_run_config):
    """``run_variants`` builds its 2DG rows outside ``run``: they get the same cost
    fields, measured on each variant's own ``.2dgz`` (more components: more bytes)."""
    from twodg_pyro.pipeline import config_from_dict
    from twodg_pyro.pipeline.runtime.variants import run_variants

    cfg = dict(tiny_run_config, methods=["deterministic", "2dg"], checkpoint_every=0)
    variants = {
        "K2": {"sharing": {"n_components": 2, "k_nearest": 2}},
        "K4": {},
        "K4 per layer": {"sharing": {"codebook": "per_layer"}},
    }
    with pytest.raises(ConfigError, match="k_nearest"):  # checked before anything trains
        run_variants(config_from_dict(cfg), {"bad": {"sharing": {"n_components": 2}}})
    records, _ = run_variants(config_from_dict(cfg), variants)
    by = {r.get("variant"): r for r in records}
    det = by["-"]
    for name in variants:
        r = by[name]
        assert r["method"] == "2dg" and r["file"] == "model_2dg.2dgz", name
        assert 0 < r["file_bytes"] < det["file_bytes"], name
        assert r["bytes_per_weight"] == pytest.approx(r["file_bytes"] / (det["file_bytes"] / 4))
        assert r["forwards_per_prediction"] == cfg["num_samples"]
        assert r["relative_predict_seconds"] > 0
        assert r["file_prob_diff"] < 1e-3
    assert by["K2"]["file_bytes"] < by["K4"]["file_bytes"]
    # a codebook per layer: K components for each of the MLP's layers, the file as exact
    assert by["K4 per layer"]["n_gaussians"] > by["K4"]["n_gaussians"]
