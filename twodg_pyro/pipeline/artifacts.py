"""What a run leaves besides the table: a model file for every method it trained, the
InferenceData, diagnostics and figures; and the ``evaluate`` / ``diagnose`` jobs on a
saved model file.

Files written by :func:`write_artifacts` into the run folder:

``model_<method>.pt``
    one per Bayesian method trained (``mean_field``, ``2dg``, ``rank1``, ``ssvi``;
    :func:`~twodg_pyro.io.save_model`), with its network spec (so that
    :func:`~twodg_pyro.io.load_model` rebuilds it without being passed the network) and
    an ``evaluation`` record: the seed, draws, data settings and metrics of the run's
    evaluation, from which ``twodg-pyro evaluate`` takes its defaults;
``inference_data_<method>.nc``
    the ArviZ InferenceData of each Bayesian method on the same evaluation examples
    (groups and shapes: :mod:`twodg_pyro.diagnostics.arviz_export`);
``diagnostics.json``
    for the primary method (the 2DG BNN when the run trained one, else the mean-field
    BNN, else rank-1 or SSVI): ``method``, ``metrics`` and ``draws`` (the results
    table's numbers and the draws behind them), ``loo`` (PSIS-LOO), ``vi`` (Pareto k-hat
    of the importance ratios, on the training data); for every Bayesian method
    ``methods[<method>]`` (``metrics``, ``draws``, ``loo``, ``inference_data``: the
    exported examples); ``compare`` (``az.compare`` of the methods' PSIS-LOO, best
    first, when there are two or more); ``budget``; the files written and any errors;
``posterior_summary.csv``
    ``az.summary(kind="stats")`` of the primary method's exported posterior;
``reliability.png``
    the primary method's reliability diagram, of the results table's prediction (its
    title states the draws and examples);
``sharing_plane.png``, ``elbo_terms.png``, ``merges.png``
    the other figures of :mod:`twodg_pyro.diagnostics.plots`.

**One model, one set of numbers.**  Every metric of a model in these files is computed
from the same posterior draws (:mod:`twodg_pyro.evaluation`: ``num_samples`` draws seeded
with the run's seed) on the same test examples: results.md/json, ``diagnostics.json``'s
``metrics``, the reliability figure, and ``twodg-pyro evaluate model_<method>.pt`` (whose
defaults are the run's seed, draws and data) agree.  The InferenceData holds those same
draws; when the diagnostics budget exports a subset of the test examples,
``methods[<method>]["inference_data"]`` says how many and gives the metrics on them.

Everything after the model files is bounded by the run's ``diagnostics`` settings
(:class:`~twodg_pyro.pipeline.config.DiagnosticsConfig`, :func:`diagnostics_budget`:
draws, and seeded subsets of the training and evaluation examples, held to a fraction of
the training's forward passes) and shows a progress bar, one step per item; with
``diagnostics.enabled = false`` (``--no-diagnostics``) only the model files and a
``diagnostics.json`` saying so are written.  The results table is written before any of
this starts.

Each item is produced independently: one that fails is reported (a warning and an
``errors`` entry in ``diagnostics.json``) and the others are still written, so that a
long run never loses its model file to a figure.
"""

from __future__ import annotations

import json
import math
import traceback
import warnings
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .results import atomic_write_text

__all__ = [
    "write_artifacts",
    "network_spec",
    "evaluate_model_file",
    "diagnose_model_file",
    "diagnostics_budget",
    "model_file_name",
    "BAYESIAN_METHODS",
    "KHAT_SAMPLES",
    "KHAT_MAX_EXAMPLES",
]

#: Draws from q for the Pareto k-hat (Yao et al. recommend at least about 100).
KHAT_SAMPLES = 100
#: Examples used by the diagnostics: for log p(D | w) in the k-hat, all training examples
#: up to this many, else a seeded subset scaled by N / n (noisier; see ``vi_diagnostics``);
#: for the InferenceData and PSIS-LOO, a seeded subset of the evaluation examples.
KHAT_MAX_EXAMPLES = 2000
#: The methods that get a model file and an InferenceData, in the order they are written.
BAYESIAN_METHODS = ("mean_field", "2dg", "rank1", "ssvi")


def model_file_name(method: str) -> str:
    """``model_<method>.pt``: the model file of ``method`` in a run folder."""
    return f"model_{method}.pt"


def network_spec(cfg, split) -> dict:
    """``{"name", "kwargs"}`` for :func:`twodg_pyro.models.build_network`, mirroring
    :func:`~twodg_pyro.pipeline.builders.build_net` (JSON-serialisable)."""
    shape = tuple(int(d) for d in split.input_shape)
    if cfg.arch == "mlp":
        kwargs = {
            "in_features": math.prod(shape),
            "hidden": [int(h) for h in cfg.hidden],
            "num_classes": int(split.num_classes),
        }
    elif cfg.arch == "lenet5":
        kwargs = {
            "num_classes": int(split.num_classes),
            "in_channels": shape[0],
            "input_size": shape[-1],
        }
    else:
        kwargs = {"num_classes": int(split.num_classes), "in_channels": shape[0]}
    return {"name": cfg.arch, "kwargs": kwargs}


def _xy(dataset):
    """``(X, y)`` tensors of a ``TensorDataset``, else the dataset itself."""
    tensors = getattr(dataset, "tensors", None)
    return (tensors[0], tensors[1]) if tensors is not None else dataset


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if hasattr(obj, "item") and getattr(obj, "ndim", 1) == 0:
        return _jsonable(obj.item())
    return obj


class _Writer:
    """Runs each artifact step, recording files and errors, with a progress bar (one
    update per step, the step's name beside it)."""

    def __init__(self, out_dir: Path, steps: int = 0, progress: bool = False):
        self.out = out_dir
        self.files: dict[str, str] = {}
        self.errors: dict[str, str] = {}
        self.progress = bool(progress)
        self.bar = tqdm(
            total=steps or None, desc="diagnostics", unit="step", disable=not progress, leave=False
        )

    def step(self, name: str, fn):
        self.bar.set_postfix_str(name, refresh=True)
        try:
            result = fn()
        except Exception as e:  # noqa: BLE001 - reported, the other artifacts still run
            self.errors[name] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
            warnings.warn(
                f"could not write {name}: {type(e).__name__}: {e}", RuntimeWarning, stacklevel=2
            )
            return None
        finally:
            self.bar.update(1)
        if isinstance(result, Path):
            self.files[name] = str(result)
        return result

    def close(self) -> None:
        self.bar.close()


def _n_examples(data) -> int:
    """Examples in ``(X, y)`` tensors, a ``Dataset`` or a ``DataLoader``."""
    if isinstance(data, tuple):
        return int(data[0].shape[0])
    dataset = getattr(data, "dataset", data)
    return len(dataset)


def diagnostics_budget(
    dcfg,
    num_samples: int,
    n_train: int,
    n_eval: int,
    train_passes: int | None,
    n_exports: int = 1,
) -> dict:
    """How many draws and examples the diagnostics of a run use.

    With :math:`S_k` = ``dcfg.khat_samples`` draws for the k-hat, :math:`S_e` =
    ``num_samples`` draws exported for each of the :math:`E` = ``n_exports`` methods,
    and :math:`n_k = \\min(N_\\text{train}, m)`, :math:`n_e = \\min(N_\\text{eval}, m)`
    examples (:math:`m` = ``dcfg.max_examples``), the diagnostics cost
    :math:`S_k n_k + E S_e n_e` forward passes of one example.  When that exceeds
    ``dcfg.budget`` times ``train_passes`` (epochs times training examples over the
    exported models' SVI stages; ``None``: no training to compare with), both :math:`n`
    shrink by the same factor, to no fewer than ``dcfg.min_examples`` (or the whole set,
    if smaller).

    Returns the numbers used (``khat_samples``, ``num_samples``, ``n_train_examples``,
    ``n_eval_examples``) and the accounting (``n_exports``, ``diagnostics_passes``,
    ``train_passes``, ``budget``, ``reduced``).
    """
    s_k, s_e, e = int(dcfg.khat_samples), int(num_samples), max(1, int(n_exports))
    n_k, n_e = min(n_train, dcfg.max_examples), min(n_eval, dcfg.max_examples)
    work = s_k * n_k + e * s_e * n_e
    reduced = False
    if train_passes is not None and work > dcfg.budget * train_passes:
        f = dcfg.budget * train_passes / work
        n_k = max(min(n_train, dcfg.min_examples), int(n_k * f))
        n_e = max(min(n_eval, dcfg.min_examples), int(n_e * f))
        reduced = True
    return {
        "khat_samples": s_k,
        "num_samples": s_e,
        "n_exports": e,
        "n_train_examples": n_k,
        "n_eval_examples": n_e,
        "train_examples_total": int(n_train),
        "eval_examples_total": int(n_eval),
        "diagnostics_passes": s_k * n_k + e * s_e * n_e,
        "train_passes": train_passes,
        "budget": float(dcfg.budget),
        "reduced": reduced,
    }


def _export(
    writer: _Writer,
    method: str,
    model,
    guide,
    eval_data,
    num_samples: int,
    seed: int,
    max_eval_examples: int | None,
    max_site_values: int | None,
    metrics: dict | None,
):
    """InferenceData of one method (file ``inference_data_<method>.nc``) and its
    PSIS-LOO; returns ``(idata or None, report section)`` (2 steps of ``writer``)."""
    from .. import diagnostics as D
    from ..metrics import classification_metrics

    section: dict = {}
    idata = writer.step(
        f"inference_data_{method}",
        lambda: D.to_inference_data(
            model,
            guide,
            eval_data,
            num_samples,
            seed,
            max_site_values=max_site_values,
            max_examples=max_eval_examples,
            method=method,
            progress=writer.progress,
        ),
    )
    if idata is None:
        writer.bar.update(2)  # the steps below need it
        return None, section
    name = f"inference_data_{method}.nc"
    writer.step(f"inference_data_{method}", lambda: D.save_inference_data(idata, writer.out / name))
    section["loo"] = writer.step(f"loo_{method}", lambda: D.loo(idata))
    n_exported = int(idata.observed_data["y"].shape[0])
    info = {
        "file": name,
        "n_examples": n_exported,
        "n_examples_total": int(idata.posterior.attrs.get("n_examples_total", n_exported)),
        "num_draws": int(idata.posterior.sizes["draw"]),
        "seed": int(seed),
    }
    if "class_probs" in idata.posterior_predictive and (
        metrics is None or n_exported < info["n_examples_total"]
    ):  # a subset (or no results-table metrics): the metrics of the exported examples
        probs, labels = D.class_probabilities(idata)
        info["metrics_on_exported_examples"] = classification_metrics(
            torch.as_tensor(probs), torch.as_tensor(labels)
        )
    section["inference_data"] = info
    return idata, section


def _khat(writer: _Writer, model, guide, train_data, khat_samples, seed, max_train_examples):
    from .. import diagnostics as D

    return writer.step(
        "khat",
        lambda: D.vi_diagnostics(
            model,
            guide,
            train_data,
            num_samples=khat_samples,
            seed=seed,
            max_examples=max_train_examples,
            progress=writer.progress,
        ),
    )


def _summary_and_reliability(writer: _Writer, idata, pred, method: str, draws: dict) -> None:
    """``posterior_summary.csv`` and ``reliability.png`` of the primary method (2 steps)."""
    from .. import diagnostics as D
    from ..evaluation import draws_sentence

    out = writer.out
    if idata is not None:

        def write_summary():
            path = out / "posterior_summary.csv"
            atomic_write_text(path, D.summary(idata, kind="stats").to_csv())
            return path

        writer.step("posterior_summary", write_summary)
    else:
        writer.bar.update(1)

    def reliability():
        title = f"{method}: {draws_sentence(draws)}"
        return D.plot_reliability(pred.mean, pred.targets, out / "reliability.png", title=title)

    if pred is not None and pred.targets is not None:
        writer.step("reliability", reliability)
    else:
        writer.bar.update(1)


def _write_report(writer: _Writer, report: dict) -> Path:
    report = dict(report, files=dict(writer.files), errors=dict(writer.errors))
    path = writer.out / "diagnostics.json"
    atomic_write_text(path, json.dumps(_jsonable(report), indent=2, sort_keys=True))
    return path


def _compare(writer: _Writer, idatas: dict) -> list | None:
    """``az.compare`` of the methods' PSIS-LOO as a list of rows, best first (1 step)."""
    from .. import diagnostics as D

    if len(idatas) < 2:
        writer.bar.update(1)
        return None

    def rows():
        table = D.compare(idatas)
        return [{"method": str(name), **row} for name, row in table.to_dict("index").items()]

    return writer.step("compare", rows)


def _trained(art) -> dict:
    """``{method: (model, guide, [training states])}`` of the Bayesian methods of a run."""
    out = {}
    if art.mean_field is not None:
        model, guide, state = art.mean_field
        if any(r.get("method") == "mean_field" for r in art.records):
            out["mean_field"] = (model, guide, [state])
    entry = art.extras.get("2dg")
    if entry is not None:
        stage1 = [art.mean_field[2]] if art.mean_field is not None else []
        out["2dg"] = (entry["model"], entry["guide"], stage1 + [entry["state"]])
    for method in ("rank1", "ssvi"):
        entry = art.extras.get(method)
        if entry is not None:
            out[method] = (entry["model"], entry["guide"], [entry["state"]])
    return out


def model_evaluation(cfg, method: str, record: dict | None, draws: dict) -> dict:
    """The ``evaluation`` record a run stores in a method's model file: the draws and
    data settings of its evaluation and the metrics it gave (``twodg-pyro evaluate``
    takes its defaults from it)."""
    d = cfg.data
    metrics = {}
    if record is not None:
        metrics = {k: record[k] for k in ("accuracy", "nll", "ece", "brier") if k in record}
    return {
        **draws,
        "method": method,
        "data": {
            "name": d.name,
            "root": d.root,
            "val_fraction": d.val_fraction,
            "test_fraction": d.test_fraction,
            "split_seed": d.split_seed,
        },
        "metrics": metrics,
    }


def write_artifacts(art, cfg, out_dir) -> dict:
    """Write the model files, InferenceData, diagnostics and figures of a finished run.

    Args:
        art: the :class:`~twodg_pyro.pipeline.runner.RunArtifacts` of :func:`run`.
        cfg: its :class:`~twodg_pyro.pipeline.config.RunConfig` (``cfg.diagnostics``: on
            or off, draws and examples; :func:`diagnostics_budget`).
        out_dir: the run folder.

    Returns:
        ``{"files": {name: path}, "errors": {name: message}}``.  Nothing is written when
        the run trained no Bayesian method.
    """
    from ..diagnostics import plot_elbo_terms, plot_merges, plot_sharing_plane
    from ..distributed import env
    from ..evaluation import seeded_predict
    from ..io import save_model
    from .runner import evaluation_of

    out = Path(out_dir)
    trained = _trained(art)
    if not trained:
        return {"files": {}, "errors": {}}
    primary = next(m for m in ("2dg", "mean_field", "rank1", "ssvi") if m in trained)
    dcfg = cfg.diagnostics
    split = art.split
    device = cfg.device
    eval_data = art.extras.get("eval_data")
    if eval_data is None:
        eval_data = _to(_xy(split.test), device)
    draws = evaluation_of(cfg, eval_data)
    records = {r.get("method"): r for r in art.records}
    n_train = len(split.train)
    stages = {id(st): st for *_, states in trained.values() for st in states}
    budget = diagnostics_budget(
        dcfg,
        cfg.num_samples,
        n_train,
        _n_examples(eval_data),
        sum(len(st.history) for st in stages.values()) * n_train,
        n_exports=len(trained),
    )
    n_steps = len(trained)
    if dcfg.enabled:
        n_steps += 3 * len(trained) + 4 + (2 if primary == "2dg" else 0) + 1
    writer = _Writer(out, n_steps, progress=cfg.progress and env.is_main())

    spec = network_spec(cfg.network, split)
    for method, (model, guide, _) in trained.items():
        evaluation = model_evaluation(cfg, method, records.get(method), draws)

        def save(method=method, model=model, guide=guide, evaluation=evaluation):
            path = out / model_file_name(method)
            save_model(path, model, guide, network=spec, evaluation=evaluation)
            return path

        writer.step(f"model_{method}", save)

    if not dcfg.enabled:
        writer.close()
        writer.files["diagnostics"] = str(out / "diagnostics.json")
        _write_report(writer, {"method": primary, "skipped": "diagnostics.enabled = false"})
        return {"files": dict(writer.files), "errors": dict(writer.errors)}

    predictions = art.extras.get("predictions", {})
    report: dict = {"method": primary, "draws": draws, "methods": {}}
    idatas = {}
    for method, (model, guide, _) in trained.items():
        record = records.get(method)
        metrics = None
        if record is not None:
            metrics = {k: record[k] for k in ("accuracy", "nll", "ece", "brier") if k in record}
        idata, section = _export(
            writer,
            method,
            model,
            guide,
            eval_data,
            cfg.num_samples,
            cfg.seed,
            budget["n_eval_examples"],
            dcfg.max_site_values,
            metrics,
        )
        if idata is not None:
            idatas[method] = idata
        report["methods"][method] = {"metrics": metrics, "draws": draws, **section}
    report["compare"] = _compare(writer, idatas)
    model, guide, states = trained[primary]
    primary_section = report["methods"][primary]
    report["metrics"] = primary_section["metrics"]
    report["loo"] = primary_section.get("loo")
    pred = predictions.get(primary)
    if pred is None:  # e.g. a record restored from a checkpoint: the same seeded draws
        pred = seeded_predict(model, guide, eval_data, cfg.num_samples, cfg.seed)
    _summary_and_reliability(writer, idatas.get(primary), pred, primary, draws)
    report["vi"] = _khat(
        writer,
        model,
        guide,
        _to(_xy(split.train), device),
        budget["khat_samples"],
        cfg.seed,
        budget["n_train_examples"],
    )
    report["budget"] = budget
    if primary == "2dg":
        writer.step("sharing_plane", lambda: plot_sharing_plane(guide, out / "sharing_plane.png"))
    histories = {}
    if art.mean_field is not None:
        histories["stage 1 (mean-field SVI)"] = art.mean_field[2].history
    if primary == "2dg":
        histories["stage 3 (shared-GMM SVI)"] = states[-1].history
    elif primary in ("rank1", "ssvi"):
        histories[f"{primary} SVI"] = states[-1].history
    writer.step("elbo_terms", lambda: plot_elbo_terms(histories, out / "elbo_terms.png"))
    if primary == "2dg":
        record = records.get("2dg", {})
        log = (record.get("hooks") or {}).get("MergeHook", [])
        writer.step(
            "merges", lambda: plot_merges(log, out / "merges.png", stage2=record.get("stage2"))
        )
    writer.close()
    writer.files["diagnostics"] = str(out / "diagnostics.json")
    _write_report(writer, report)
    return {"files": dict(writer.files), "errors": dict(writer.errors)}


def _to(data, device):
    if isinstance(data, tuple):
        return tuple(t.to(device) for t in data)
    return data


# ---------------------------------------------------------------------------- saved models
def evaluation_defaults(model_file, data=None, num_samples=None, seed=None) -> dict:
    """The data, draws and seed to evaluate a model file with: those given, else those of
    the run that wrote it (the file's ``evaluation`` record), else digits, 30 draws and
    seed 0.  Returns ``{"data", "num_samples", "seed", "data_settings", "recorded"}``
    (``data_settings``: the run's split settings when ``data`` is the run's data set;
    ``recorded``: the file's evaluation record, ``{}`` without one)."""
    from ..io import read_model_header

    try:
        header = read_model_header(model_file)
    except (OSError, ValueError):
        header = {}  # the loader names the problem
    recorded = header.get("evaluation") if isinstance(header.get("evaluation"), dict) else {}
    run_data = recorded.get("data") if isinstance(recorded.get("data"), dict) else {}
    name = data if data is not None else run_data.get("name", "digits")
    same = run_data.get("name") == name
    return {
        "data": name,
        "num_samples": int(
            num_samples if num_samples is not None else recorded.get("num_samples", 30)
        ),
        "seed": int(seed if seed is not None else recorded.get("seed", 0)),
        "data_settings": {k: v for k, v in run_data.items() if k != "name"} if same else {},
        "recorded": recorded,
    }


def _load(model_file, data: str, root: str | None, device: str, data_settings=None):
    """The saved model (a full or a compact file of any method) and the data split it is
    evaluated on (``data_settings``: the run's split settings, e.g. ``test_fraction``)."""
    from ..io import load_model
    from ..models import MLP
    from .builders import check_device, load_data
    from .config import DataConfig

    check_device(device)
    model, guide = load_model(model_file, device=device)
    settings = {
        k: v
        for k, v in (data_settings or {}).items()
        if k in ("val_fraction", "test_fraction", "split_seed")
    }
    if root is None:
        root = (data_settings or {}).get("root")
    cfg = DataConfig(name=data, root=root, **settings)
    split = load_data(cfg, image=not isinstance(model.net, MLP))
    check_fits(model, split, model_file, device)
    return model, guide, split


def check_fits(model, split, model_file, device: str = "cpu") -> None:
    """Check that the saved ``model`` can be evaluated on ``split``: its network takes
    the split's inputs and has one output per class, and the labels are in range.

    Raises:
        ValueError: naming the model file, the data set and what does not fit (e.g. a
            digits model on MNIST).
    """
    from .checks import check_split

    where, name = str(model_file), split.name
    first = next(
        (getattr(split, n) for n in ("test", "val", "train") if len(getattr(split, n))), None
    )
    if first is None:
        raise ValueError(f"data set {name!r} is empty")
    x0 = first[0][0]
    x0 = torch.as_tensor(x0).unsqueeze(0).to(device)
    if x0.is_floating_point():  # the network's dtype (a float64 model takes float64 inputs)
        x0 = x0.to(getattr(model, "dtype", x0.dtype))
    net = model.net
    was_training = net.training
    net.eval()
    try:
        with torch.no_grad():
            out = net(x0)
    except RuntimeError as e:
        if isinstance(e, torch.OutOfMemoryError):
            raise
        raise ValueError(
            f"{where!r} does not fit data set {name!r}: its network "
            f"({type(net).__name__}) cannot take {name}'s inputs of shape "
            f"{tuple(split.input_shape)} (was it trained on another data set?): "
            f"{' '.join(str(e).split())}"
        ) from e
    finally:
        net.train(was_training)
    n_out = int(out.shape[-1])
    if n_out != int(split.num_classes):
        raise ValueError(
            f"{where!r} does not fit data set {name!r}: its network has {n_out} outputs, "
            f"{name} has {split.num_classes} classes"
        )
    check_split(split)


def evaluate_model_file(
    model_file,
    data: str | None = None,
    root: str | None = None,
    split_name: str = "test",
    num_samples: int | None = None,
    seed: int | None = None,
    device: str = "cpu",
) -> dict:
    """Accuracy, NLL, ECE and Brier of a saved model of any method, over ``num_samples``
    posterior draws seeded with ``seed`` (:func:`~twodg_pyro.evaluation.evaluate`), run on
    ``device`` in the dtype the model was saved in.

    ``data``, ``num_samples`` and ``seed`` default to those of the run that wrote the file
    (its ``evaluation`` record; else digits, 30, 0), and the run's split settings are
    used for its data set: on the run's device the metrics are then those of the run's
    results table.  The output says which draws and examples it used, and gives the
    run's recorded metrics (``recorded_metrics``) when it used the same ones.
    """
    from ..evaluation import SAMPLE_CHUNK, evaluate

    d = evaluation_defaults(model_file, data, num_samples, seed)
    model, guide, split = _load(model_file, d["data"], root, device, d["data_settings"])
    dataset = getattr(split, split_name)
    if len(dataset) == 0:
        raise ValueError(f"the {split_name} split of {d['data']!r} is empty")
    xy = _xy(dataset)
    eval_data = _to(xy, device) if isinstance(xy, tuple) else _loader(dataset)
    metrics = evaluate(model, guide, eval_data, d["num_samples"], d["seed"], device=device)
    result = {
        "model_file": str(model_file),
        "method": d["recorded"].get("method") or _method_of(guide),
        "data": d["data"],
        "split": split_name,
        "sample_chunk": SAMPLE_CHUNK,
        **metrics,
    }
    rec = d["recorded"]
    if (
        rec.get("metrics")
        and rec.get("seed") == result["seed"]
        and rec.get("num_samples") == result["num_samples"]
        and rec.get("n_examples") == result["n_examples"]
        and rec.get("split", "test") == split_name
        and (rec.get("data") or {}).get("name") == d["data"]
    ):
        result["recorded_metrics"] = rec["metrics"]
    return result


def _method_of(guide) -> str:
    from ..diagnostics import method_of

    return method_of(guide)


def _loader(dataset):
    return torch.utils.data.DataLoader(dataset, batch_size=512)


def diagnose_model_file(
    model_file,
    out_dir,
    data: str | None = None,
    root: str | None = None,
    num_samples: int | None = None,
    khat_samples: int = KHAT_SAMPLES,
    max_train_examples: int | None = KHAT_MAX_EXAMPLES,
    seed: int | None = None,
    device: str = "cpu",
    max_eval_examples: int | None = KHAT_MAX_EXAMPLES,
    max_site_values: int | None = None,
    progress: bool = False,
) -> dict:
    """InferenceData, k-hat, PSIS-LOO, ``az.summary`` and figures of a saved model of any
    method.

    Writes into ``out_dir``: ``inference_data_<method>.nc``, ``diagnostics.json``
    (``metrics`` and ``draws``: those of :func:`evaluate_model_file` with the same
    arguments; ``loo``; ``vi``: the k-hat; ``inference_data``; files), ``posterior_summary.csv``,
    ``reliability.png`` and, for a 2DG BNN, ``sharing_plane.png`` (the training history is
    not in the model file, so there are no ELBO or merge figures).  ``data``,
    ``num_samples`` and ``seed`` default to the run's (see :func:`evaluate_model_file`).
    The k-hat uses ``khat_samples`` draws on a seeded subset of at most
    ``max_train_examples`` training examples, the InferenceData and PSIS-LOO
    ``num_samples`` draws on at most ``max_eval_examples`` test examples and at most
    ``max_site_values`` values per site (default
    :data:`~twodg_pyro.diagnostics.DEFAULT_MAX_SITE_VALUES`).  The model runs on
    ``device`` in the dtype it was saved in.  Returns the ``diagnostics.json`` content.
    """
    from ..diagnostics import DEFAULT_MAX_SITE_VALUES, method_of, plot_sharing_plane
    from ..evaluation import draws_record, seeded_predict
    from ..metrics import classification_metrics

    d = evaluation_defaults(model_file, data, num_samples, seed)
    model, guide, split = _load(model_file, d["data"], root, device, d["data_settings"])
    method = method_of(guide)
    S, seed = d["num_samples"], d["seed"]
    out = Path(out_dir)
    writer = _Writer(out, 7 + (method == "2dg"), progress=progress)
    eval_data = _to(_xy(split.test), device)
    pred = writer.step(
        "evaluate", lambda: seeded_predict(model, guide, eval_data, S, seed, device=device)
    )
    draws = draws_record(S, seed, len(split.test), "test")
    metrics = None if pred is None else classification_metrics(pred.mean, pred.targets)
    report: dict = {
        "model_file": str(model_file),
        "method": method,
        "data": d["data"],
        "seed": int(seed),
        "metrics": metrics,
        "draws": draws,
    }
    idata, section = _export(
        writer,
        method,
        model,
        guide,
        eval_data,
        S,
        seed,
        max_eval_examples,
        DEFAULT_MAX_SITE_VALUES if max_site_values is None else max_site_values,
        metrics,
    )
    report.update(section)
    _summary_and_reliability(writer, idata, pred, method, draws)
    report["vi"] = _khat(
        writer,
        model,
        guide,
        _to(_xy(split.train), device),
        khat_samples,
        seed,
        max_train_examples,
    )
    if method == "2dg":
        writer.step("sharing_plane", lambda: plot_sharing_plane(guide, out / "sharing_plane.png"))
    writer.close()
    writer.files["diagnostics"] = str(out / "diagnostics.json")
    _write_report(writer, report)
    return _jsonable(dict(report, files=dict(writer.files), errors=dict(writer.errors)))
