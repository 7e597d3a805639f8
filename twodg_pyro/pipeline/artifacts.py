"""What a run leaves besides the table: the model file, the InferenceData, diagnostics
and figures; and the ``evaluate`` / ``diagnose`` jobs on a saved model file.

Files written by :func:`write_artifacts` into the run folder (the 2DG BNN when the run
trained one, else the mean-field BNN):

``model_2dg.pt``
    the 2DG BNN (:func:`~twodg_pyro.io.save_2dg`) with its network spec, so that
    ``load_2dg(path)`` rebuilds it without being passed the network;
``inference_data.nc``
    the ArviZ InferenceData on the evaluation data (groups and shapes:
    :mod:`twodg_pyro.diagnostics.arviz_export`);
``diagnostics.json``
    Pareto k-hat of the importance ratios (on the training data), PSIS-LOO, and the
    list of files written;
``posterior_summary.csv``
    ``az.summary`` of the exported posterior;
``sharing_plane.png``, ``reliability.png``, ``elbo_terms.png``, ``merges.png``
    the figures of :mod:`twodg_pyro.diagnostics.plots`.

Everything after the model file is bounded by the run's ``diagnostics`` settings
(:class:`~twodg_pyro.pipeline.config.DiagnosticsConfig`, :func:`diagnostics_budget`:
draws, and seeded subsets of the training and evaluation examples, held to a fraction of
the training's forward passes) and shows a progress bar, one step per item; with
``diagnostics.enabled = false`` (``--no-diagnostics``) only the model file and a
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
    "KHAT_SAMPLES",
    "KHAT_MAX_EXAMPLES",
]

#: Draws from q for the Pareto k-hat (Yao et al. recommend at least about 100).
KHAT_SAMPLES = 100
#: Examples used by the diagnostics: for log p(D | w) in the k-hat, all training examples
#: up to this many, else a seeded subset scaled by N / n (noisier; see ``vi_diagnostics``);
#: for the InferenceData and PSIS-LOO, a seeded subset of the evaluation examples.
KHAT_MAX_EXAMPLES = 2000


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
    dcfg, num_samples: int, n_train: int, n_eval: int, train_passes: int | None
) -> dict:
    """How many draws and examples the diagnostics of a run use.

    With :math:`S_k` = ``dcfg.khat_samples`` draws for the k-hat, :math:`S_e` =
    ``num_samples`` draws exported, and :math:`n_k = \\min(N_\\text{train}, m)`,
    :math:`n_e = \\min(N_\\text{eval}, m)` examples (:math:`m` = ``dcfg.max_examples``),
    the diagnostics cost :math:`S_k n_k + S_e n_e` forward passes of one example.  When
    that exceeds ``dcfg.budget`` times ``train_passes`` (epochs times training examples
    over the exported model's SVI stages; ``None``: no training to compare with), both
    :math:`n` shrink by the same factor, to no fewer than ``dcfg.min_examples`` (or the
    whole set, if smaller).

    Returns the numbers used (``khat_samples``, ``num_samples``, ``n_train_examples``,
    ``n_eval_examples``) and the accounting (``diagnostics_passes``, ``train_passes``,
    ``budget``, ``reduced``).
    """
    s_k, s_e = int(dcfg.khat_samples), int(num_samples)
    n_k, n_e = min(n_train, dcfg.max_examples), min(n_eval, dcfg.max_examples)
    work = s_k * n_k + s_e * n_e
    reduced = False
    if train_passes is not None and work > dcfg.budget * train_passes:
        f = dcfg.budget * train_passes / work
        n_k = max(min(n_train, dcfg.min_examples), int(n_k * f))
        n_e = max(min(n_eval, dcfg.min_examples), int(n_e * f))
        reduced = True
    return {
        "khat_samples": s_k,
        "num_samples": s_e,
        "n_train_examples": n_k,
        "n_eval_examples": n_e,
        "train_examples_total": int(n_train),
        "eval_examples_total": int(n_eval),
        "diagnostics_passes": s_k * n_k + s_e * n_e,
        "train_passes": train_passes,
        "budget": float(dcfg.budget),
        "reduced": reduced,
    }


def _diagnostics(
    writer: _Writer,
    model,
    guide,
    eval_data,
    train_data,
    num_samples: int,
    seed: int,
    n_weights: int = 200,
    khat_samples: int = KHAT_SAMPLES,
    max_train_examples: int | None = KHAT_MAX_EXAMPLES,
    max_eval_examples: int | None = KHAT_MAX_EXAMPLES,
) -> dict:
    """InferenceData, PSIS-LOO, summary, reliability diagram and k-hat; returns the report
    (6 steps of ``writer``)."""
    from .. import diagnostics as D
    from ..metrics import classification_metrics

    out = writer.out
    report: dict = {}
    idata = writer.step(
        "inference_data",
        lambda: D.to_inference_data(
            model,
            guide,
            eval_data,
            num_samples=num_samples,
            n_weights=n_weights,
            seed=seed,
            max_examples=max_eval_examples,
            progress=writer.progress,
        ),
    )
    if idata is None:
        writer.bar.update(4)  # the steps below need it
    else:
        writer.step(
            "inference_data", lambda: D.save_inference_data(idata, out / "inference_data.nc")
        )
        report["loo"] = writer.step("loo", lambda: D.loo(idata))

        def write_summary():
            path = out / "posterior_summary.csv"
            atomic_write_text(path, D.summary(idata).to_csv())
            return path

        writer.step("posterior_summary", write_summary)

        def reliability():
            probs, labels = D.class_probabilities(idata)
            report["metrics"] = classification_metrics(
                torch.as_tensor(probs), torch.as_tensor(labels)
            )
            return D.plot_reliability(probs, labels, out / "reliability.png")

        writer.step("reliability", reliability)
    report["vi"] = writer.step(
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
    return report


def _write_report(writer: _Writer, report: dict) -> Path:
    report = dict(report, files=dict(writer.files), errors=dict(writer.errors))
    path = writer.out / "diagnostics.json"
    atomic_write_text(path, json.dumps(_jsonable(report), indent=2, sort_keys=True))
    return path


def write_artifacts(art, cfg, out_dir) -> dict:
    """Write the model file, InferenceData, diagnostics and figures of a finished run.

    Args:
        art: the :class:`~twodg_pyro.pipeline.runner.RunArtifacts` of :func:`run`.
        cfg: its :class:`~twodg_pyro.pipeline.config.RunConfig` (``cfg.diagnostics``: on
            or off, draws and examples; :func:`diagnostics_budget`).
        out_dir: the run folder.

    Returns:
        ``{"files": {name: path}, "errors": {name: message}}``.  Nothing is written when
        the run trained neither a 2DG nor a mean-field BNN.
    """
    from ..diagnostics import plot_elbo_terms, plot_merges, plot_sharing_plane
    from ..distributed import env

    out = Path(out_dir)
    entry = art.extras.get("2dg")
    if entry is not None:
        method, model, guide, state = "2dg", entry["model"], entry["guide"], entry["state"]
    elif art.mean_field is not None:
        method, (model, guide, state) = "mean_field", art.mean_field
    else:
        return {"files": {}, "errors": {}}
    dcfg = cfg.diagnostics
    split = art.split
    device = cfg.device
    states = [art.mean_field[2]] if art.mean_field is not None else []
    if method == "2dg":
        states.append(state)
    n_train = len(split.train)
    eval_data = art.extras.get("eval_data")
    if eval_data is None:
        eval_data = _to(_xy(split.test), device)
    budget = diagnostics_budget(
        dcfg,
        cfg.num_samples,
        n_train,
        _n_examples(eval_data),
        sum(len(st.history) for st in states) * n_train,
    )
    n_steps = (method == "2dg") + (6 + (3 if method == "2dg" else 1) if dcfg.enabled else 0)
    writer = _Writer(out, n_steps, progress=cfg.progress and env.is_main())

    if method == "2dg":
        from ..io import save_2dg

        def save_model():
            path = out / "model_2dg.pt"
            save_2dg(path, model, guide, network=network_spec(cfg.network, split))
            return path

        writer.step("model", save_model)

    if not dcfg.enabled:
        writer.close()
        writer.files["diagnostics"] = str(out / "diagnostics.json")
        _write_report(writer, {"method": method, "skipped": "diagnostics.enabled = false"})
        return {"files": dict(writer.files), "errors": dict(writer.errors)}
    report = _diagnostics(
        writer,
        model,
        guide,
        eval_data,
        _to(_xy(split.train), device),
        cfg.num_samples,
        cfg.seed,
        khat_samples=budget["khat_samples"],
        max_train_examples=budget["n_train_examples"],
        max_eval_examples=budget["n_eval_examples"],
    )
    report["method"] = method
    report["budget"] = budget
    if method == "2dg":
        writer.step("sharing_plane", lambda: plot_sharing_plane(guide, out / "sharing_plane.png"))
    histories = {}
    if art.mean_field is not None:
        histories["stage 1 (mean-field SVI)"] = art.mean_field[2].history
    if method == "2dg":
        histories["stage 3 (shared-GMM SVI)"] = state.history
    writer.step("elbo_terms", lambda: plot_elbo_terms(histories, out / "elbo_terms.png"))
    if method == "2dg":
        record = next((r for r in art.records if r.get("method") == "2dg"), {})
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
def _load(model_file, data: str, root: str | None, device: str):
    """The saved model (a full or a compact file) and the data split it is evaluated on."""
    from ..io.compact import load_model_file
    from ..models import MLP
    from .builders import check_device, load_data
    from .config import DataConfig

    check_device(device)
    model, guide = load_model_file(model_file, device=device)
    cfg = DataConfig(name=data, root=root)
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
    data: str = "digits",
    root: str | None = None,
    split_name: str = "test",
    num_samples: int = 30,
    seed: int = 0,
    device: str = "cpu",
) -> dict:
    """Accuracy, NLL, ECE and Brier of a saved 2DG BNN (``N_s`` = ``num_samples``), run on
    ``device`` in the dtype the model was saved in (a file written on a GPU loads on the
    CPU and back)."""
    from ..metrics import classification_metrics
    from ..predict import predict
    from .builders import seed_everything

    model, guide, split = _load(model_file, data, root, device)
    dataset = getattr(split, split_name)
    if len(dataset) == 0:
        raise ValueError(f"the {split_name} split of {data!r} is empty")
    xy = _xy(dataset)
    eval_data = _to(xy, device) if isinstance(xy, tuple) else _loader(dataset)
    seed_everything(seed)
    pred = predict(model, guide, eval_data, num_samples, device=device)
    return {
        "model_file": str(model_file),
        "data": data,
        "split": split_name,
        "n_examples": int(pred.mean.shape[0]),
        "num_samples": int(num_samples),
        "seed": int(seed),
        **classification_metrics(pred.mean, pred.targets),
    }


def _loader(dataset):
    return torch.utils.data.DataLoader(dataset, batch_size=512)


def diagnose_model_file(
    model_file,
    out_dir,
    data: str = "digits",
    root: str | None = None,
    num_samples: int = 30,
    khat_samples: int = KHAT_SAMPLES,
    n_weights: int = 200,
    max_train_examples: int | None = KHAT_MAX_EXAMPLES,
    seed: int = 0,
    device: str = "cpu",
    max_eval_examples: int | None = KHAT_MAX_EXAMPLES,
    progress: bool = False,
) -> dict:
    """InferenceData, k-hat, PSIS-LOO, ``az.summary`` and figures of a saved 2DG BNN.

    Writes into ``out_dir``: ``inference_data.nc``, ``diagnostics.json`` (k-hat, LOO,
    predictive metrics, files), ``posterior_summary.csv``, ``sharing_plane.png`` and
    ``reliability.png`` (the training history is not in the model file, so there are
    no ELBO or merge figures).  The k-hat uses ``khat_samples`` draws on a seeded subset
    of at most ``max_train_examples`` training examples, the InferenceData and PSIS-LOO
    ``num_samples`` draws on at most ``max_eval_examples`` test examples.  The model runs
    on ``device`` in the dtype it was saved in.  Returns the ``diagnostics.json`` content.
    """
    from ..diagnostics import plot_sharing_plane

    model, guide, split = _load(model_file, data, root, device)
    out = Path(out_dir)
    writer = _Writer(out, 7, progress=progress)
    report: dict = {"model_file": str(model_file), "data": data, "seed": int(seed)}
    report.update(
        _diagnostics(
            writer,
            model,
            guide,
            _to(_xy(split.test), device),
            _to(_xy(split.train), device),
            num_samples,
            seed,
            n_weights=n_weights,
            khat_samples=khat_samples,
            max_train_examples=max_train_examples,
            max_eval_examples=max_eval_examples,
        )
    )
    writer.step("sharing_plane", lambda: plot_sharing_plane(guide, out / "sharing_plane.png"))
    writer.close()
    writer.files["diagnostics"] = str(out / "diagnostics.json")
    _write_report(writer, report)
    return _jsonable(dict(report, files=dict(writer.files), errors=dict(writer.errors)))
