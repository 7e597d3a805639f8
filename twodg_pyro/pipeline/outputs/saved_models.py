"""The ``evaluate`` and ``diagnose`` jobs on a saved model file of any method (full or
compact): the data and draws the run that wrote it used (its ``evaluation`` record),
the check that the model fits the data, the metrics, and the diagnostics of
:mod:`.artifacts` for one model."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ...evaluation import data_to_device, prediction_metrics
from ...files.atomic import jsonable
from ...likelihoods import Categorical, RegressionLikelihood
from ..settings.build import check_device, eval_data, load_data
from ..settings.registry import METHOD_REGISTRY, method_runner
from ..settings.sections import DataConfig
from .diagnostics_steps import (
    KHAT_BLOCK_COMPONENTS,
    KHAT_MAX_EXAMPLES,
    KHAT_SAMPLES,
    StepWriter,
    export_step,
    khat_step,
    summary_and_reliability,
    write_report,
    xy,
)


def evaluation_defaults(model_file, data=None, num_samples=None, seed=None) -> dict:
    """The data, draws and seed to evaluate a model file with: those given, else those of
    the run that wrote it (the file's ``evaluation`` record), else digits, 30 draws and
    seed 0.  Returns ``{"data", "data_known", "num_samples", "seed", "data_settings",
    "recorded", "header"}`` (``data_known``: the data set was given or recorded, not
    assumed; ``data_settings``: the run's split settings when ``data`` is the run's
    data set; ``recorded``: the file's evaluation record, ``{}`` without one;
    ``header``: the file's header, ``{}`` when it cannot be read)."""
    from ...io import read_model_header

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
        "data_known": data is not None or "name" in run_data,
        "num_samples": int(
            num_samples if num_samples is not None else recorded.get("num_samples", 30)
        ),
        "seed": int(seed if seed is not None else recorded.get("seed", 0)),
        "data_settings": {k: v for k, v in run_data.items() if k != "name"} if same else {},
        "recorded": recorded,
        "header": header,
    }


def _load(model_file, d: dict, root: str | None, device: str):
    """The saved trained method (:func:`~twodg_pyro.methods.load_method`) and the data
    split it is evaluated on (with the run's split settings, e.g. ``test_fraction``, from
    ``d``)."""
    from ...methods import load_method
    from ...models import MLP

    check_device(device)
    if d["header"].get("method") in METHOD_REGISTRY:  # its module registers its file
        method_runner(d["header"]["method"])
    method = load_method(model_file, device=device)
    run = d["data_settings"]
    settings = {
        k: v for k, v in run.items() if k in ("val_fraction", "test_fraction", "split_seed")
    }
    cfg = DataConfig(name=d["data"], root=run.get("root") if root is None else root, **settings)
    split = load_data(cfg, image=not isinstance(method.net, MLP))
    try:
        check_fits(method, split, model_file, device)
    except ValueError as e:
        if d["data_known"]:
            raise
        raise ValueError(  # e.g. a .2dgz written before compact files kept the data set
            f"{e} (the file records no data set, so {d['data']!r} was assumed: pass --data)"
        ) from e
    return method, split


def check_fits(method, split, model_file, device: str = "cpu") -> None:
    """Check that the saved trained ``method`` can be evaluated on ``split``: its network
    takes the split's inputs and has one output per class, and the labels are in range; on
    a regression data set, that its likelihood is a regression one (which checks the
    targets' shape when it is evaluated).

    Raises:
        ValueError: naming the model file, the data set and what does not fit (e.g. a
            digits model on MNIST).
    """
    from ..settings.checks import check_split

    where, name = str(model_file), split.name
    first = next(
        (getattr(split, n) for n in ("test", "val", "train") if len(getattr(split, n))), None
    )
    if first is None:
        raise ValueError(f"data set {name!r} is empty")
    x0 = torch.as_tensor(first[0][0]).unsqueeze(0).to(device)
    net = method.net
    if x0.is_floating_point():  # the network's dtype (a float64 model takes float64 inputs)
        x0 = x0.to(next(net.parameters()).dtype)
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
    lik = method.likelihood
    if getattr(split, "task", "classification") == "regression":
        if not isinstance(lik, RegressionLikelihood):
            raise ValueError(
                f"{where!r} does not fit data set {name!r}: its likelihood is "
                f"{type(lik).__name__ if lik is not None else 'none'} (a classifier), "
                f"{name} has real-valued targets (regression)"
            )
        return
    n_out = int(out.shape[-1])
    if n_out != int(split.num_classes):
        raise ValueError(
            f"{where!r} does not fit data set {name!r}: its network has {n_out} outputs, "
            f"{name} has {split.num_classes} classes"
        )
    check_split(split)  # integer class labels in [0, num_classes)
    if lik is not None and not isinstance(lik, Categorical):  # a hand-edited header
        raise ValueError(
            f"{where!r} does not fit data set {name!r}: its likelihood is "
            f"{type(lik).__name__} (regression), {name} has class labels (Categorical)"
        )


def evaluate_model_file(
    model_file,
    data: str | None = None,
    root: str | None = None,
    split_name: str = "test",
    num_samples: int | None = None,
    seed: int | None = None,
    device: str = "cpu",
    uncertainty=None,
) -> dict:
    """Accuracy, NLL, ECE and Brier (a regression model on a regression data set: RMSE,
    Gaussian NLL and interval coverage) of a saved model of any method: the prediction of its
    trained method (:meth:`~twodg_pyro.methods.TrainedMethod.predict`) asked for
    ``num_samples`` draws seeded with ``seed``, run on ``device`` in the dtype the model
    was saved in: a posterior's seeded draws, an ensemble's members, MCMC's kept draws, a
    network's one forward pass (``num_samples`` in the output says how many).

    ``data``, ``num_samples`` and ``seed`` default to those of the run that wrote the file
    (its ``evaluation`` record; else digits, 30, 0), and the run's split settings are
    used for its data set: on the run's device the metrics are then those of the run's
    results table.  The output says which draws and examples it used, and gives the
    run's recorded metrics (``recorded_metrics``) when it used the same ones.

    With ``uncertainty`` (an :class:`~twodg_pyro.pipeline.settings.config.UncertaintyConfig`) the
    output also has ``uncertainty``: OOD detection, shift and selective prediction on the
    same draws (:mod:`twodg_pyro.pipeline.outputs.uncertainty_step`).
    """
    from ...evaluation import SAMPLE_CHUNK
    from ...metrics import check_labels
    from .uncertainty_step import UncertaintySets

    d = evaluation_defaults(model_file, data, num_samples, seed)
    method, split = _load(model_file, d, root, device)
    dataset = getattr(split, split_name)
    if len(dataset) == 0:
        raise ValueError(f"the {split_name} split of {d['data']!r} is empty")
    data = eval_data(dataset, device)
    regression = isinstance(method.likelihood, RegressionLikelihood)
    if isinstance(data, tuple) and not regression:
        check_labels(data[1])  # dtype and sign now; the classes' range once C is known
    pred = method.predict(data, d["num_samples"], d["seed"])
    result = {
        "model_file": str(model_file),
        "data": d["data"],
        "split": split_name,
        "method": d["recorded"].get("method") or method.name,
        **({"sample_chunk": SAMPLE_CHUNK} if method.variational else {}),
        **prediction_metrics(pred),
        "num_samples": method.num_draws(d["num_samples"]),
        "seed": int(d["seed"]),
        "n_examples": int(pred.mean.shape[0]),
    }
    if not all(math.isfinite(result[k]) for k in ("nll", "brier", "rmse") if k in result):
        raise ValueError(
            f"{str(model_file)!r}: its predictions are not finite (NaN/inf): its stored "
            "values overflow its network on these data (an edited file, or a diverged model)"
        )
    if uncertainty is not None:
        sets = UncertaintySets(split, data, uncertainty, d["seed"])
        draws = uncertainty.draws if uncertainty.draws is not None else d["num_samples"]
        result["uncertainty"] = sets.record(method, draws, device)
    rec = d["recorded"]
    if (  # the run's metrics, when it used the same draws and examples
        rec.get("metrics")
        and (not method.seeded or rec.get("seed") == result["seed"])
        and rec.get("num_samples") == result["num_samples"]
        and rec.get("n_examples") == result["n_examples"]
        and rec.get("split", "test") == result["split"]
        and (rec.get("data") or {}).get("name") == d["data"]
    ):
        result["recorded_metrics"] = rec["metrics"]
    return result


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
    khat_components: int | None = KHAT_BLOCK_COMPONENTS,
) -> dict:
    """InferenceData, k-hat, PSIS-LOO, ``az.summary`` and figures of a saved model of any
    method.

    Writes into ``out_dir``: ``inference_data_<method>.nc``, ``diagnostics.json``
    (``metrics`` and ``draws``: those of :func:`evaluate_model_file` with the same
    arguments; ``loo``; ``vi``: the k-hat; ``inference_data``; files), ``posterior_summary.csv``,
    ``reliability.png`` and, for a 2DG BNN, ``sharing_plane.png`` (the training history is
    not in the model file, so there are no ELBO or merge figures).  A 2DG + Laplace
    compact file is diagnosed as the 2DG BNN it holds (``diagnosed_part`` says so).  ``data``,
    ``num_samples`` and ``seed`` default to the run's (see :func:`evaluate_model_file`).
    The k-hat uses ``khat_samples`` draws on a seeded subset of at most
    ``max_train_examples`` training examples, the InferenceData and PSIS-LOO
    ``num_samples`` draws on at most ``max_eval_examples`` test examples and at most
    ``max_site_values`` values per site (default
    :data:`~twodg_pyro.diagnostics.DEFAULT_MAX_SITE_VALUES`).  ``vi["blocks"]`` holds the
    block k-hats (each layer, the outliers and the ``khat_components`` largest mixture
    components, on the k-hat's draws and examples); ``None`` skips them.  The model runs on
    ``device`` in the dtype it was saved in.  Returns the ``diagnostics.json`` content.
    """
    from ...diagnostics import DEFAULT_MAX_SITE_VALUES, method_of, plot_sharing_plane
    from ...evaluation import draws_record, seeded_predict

    d = evaluation_defaults(model_file, data, num_samples, seed)
    if (d["header"].get("baseline")) == "mcmc":
        return diagnose_mcmc_file(model_file, out_dir, d, root, device, max_eval_examples, progress)
    trained, split = _load(model_file, d, root, device)
    part = None
    bnn = getattr(trained, "bnn", None)  # a 2DG + Laplace file's 2DG BNN (load_method)
    if not trained.variational and bnn is not None and bnn.variational:
        # a 2DG + Laplace file holds its 2DG BNN, a model and guide: diagnose that part
        trained = bnn
        part = (
            "the file's 2DG BNN (its metrics and diagnostics are the BNN's; the Laplace "
            "last layer beside it is not a variational posterior, and is not diagnosed)"
        )
    if not trained.variational:
        raise ValueError(
            f"{str(model_file)!r} holds a {trained.name} ({type(trained).__name__}), not a "
            "model and guide: diagnose takes a BNN's file or MCMC chains; evaluate it with "
            "twodg-pyro evaluate"
        )
    model, guide = trained.model, trained.guide
    method = method_of(guide)
    S, seed = d["num_samples"], d["seed"]
    out = Path(out_dir)
    writer = StepWriter(out, 7 + (method == "2dg"), progress=progress)
    test = data_to_device(xy(split.test), device)
    train = data_to_device(xy(split.train), device)
    pred = writer.step(
        "evaluate", lambda: seeded_predict(model, guide, test, S, seed, device=device)
    )
    draws = draws_record(S, seed, len(split.test), "test")
    metrics = None if pred is None else prediction_metrics(pred)
    report: dict = {
        "model_file": str(model_file),
        "method": method,
        "data": d["data"],
        "seed": int(seed),
        "metrics": metrics,
        "draws": draws,
    }
    if part is not None:
        report["diagnosed_part"] = part
    idata, section = export_step(
        writer,
        method,
        model,
        guide,
        test,
        S,
        seed,
        metrics,
        max_examples=max_eval_examples,
        max_site_values=DEFAULT_MAX_SITE_VALUES if max_site_values is None else max_site_values,
        train_data=train,
        max_train_examples=max_train_examples,
    )
    report.update(section)
    summary_and_reliability(writer, idata, pred, method, draws)
    report["vi"] = khat_step(
        writer,
        model,
        guide,
        train,
        max_components=khat_components or 0,
        skip_blocks=None if khat_components is not None else "not asked for (khat_components=None)",
        num_samples=khat_samples,
        seed=seed,
        max_examples=max_train_examples,
    )
    if method == "2dg":
        writer.step("sharing_plane", lambda: plot_sharing_plane(guide, out / "sharing_plane.png"))
    return jsonable(write_report(writer, report))


def diagnose_mcmc_file(
    model_file,
    out_dir,
    d: dict,
    root: str | None = None,
    device: str = "cpu",
    max_eval_examples: int | None = KHAT_MAX_EXAMPLES,
    progress: bool = False,
) -> dict:
    """The chains' diagnostics of an MCMC model file (``d``: its
    :func:`evaluation_defaults`): the metrics of all its kept draws on the test split,
    the convergence report (:func:`~twodg_pyro.methods.mcmc.arviz.mcmc_report`: R-hat and
    bulk / tail ESS per site and on the predictive probabilities of at most
    ``max_eval_examples`` test inputs, divergences, tree depth, step size, E-BFMI) under
    ``mcmc``, with its printable ``mcmc_lines``.  Writes ``inference_data_mcmc.nc`` (the
    posterior per site, ``sample_stats``, the ``predictions``), ``mcmc_trace.png`` /
    ``mcmc_trace_rank.png`` (ArviZ's trace and rank plots of the log density and the
    least mixed probabilities) and ``diagnostics.json``; returns its content."""
    from ...diagnostics import save_inference_data
    from ...methods.mcmc.arviz import mcmc_report, mcmc_tree, plot_mcmc_chains, report_lines

    post, split = _load(model_file, d, root, device)
    out = Path(out_dir)
    writer = StepWriter(out, 5, progress=progress)
    test = data_to_device(xy(split.test), device)
    n = len(split.test) if max_eval_examples is None else int(max_eval_examples)
    x, y = test[0][:n], test[1][:n]
    probs = writer.step("predict", lambda: post.chain_probs(x))
    metrics = prediction_metrics(post.predict(test, post.num_draws()))
    report: dict = {
        "model_file": str(model_file),
        "method": d["header"].get("method", "mcmc"),
        "data": d["data"],
        "metrics": metrics,
        "draws": {
            "num_samples": post.num_draws(),
            "seed": post.settings.get("seed"),
            "n_examples": len(split.test),
            "split": "test",
        },
    }
    rep = writer.step("mcmc_report", lambda: mcmc_report(post, probs=probs))
    if rep is not None:
        rep["predictive_examples"] = int(len(x))
        report["mcmc"] = rep
        report["mcmc_lines"] = report_lines(rep)
    writer.step(
        "inference_data",
        lambda: save_inference_data(mcmc_tree(post, (x, y)), out / "inference_data_mcmc.nc"),
    )
    writer.step("trace", lambda: plot_mcmc_chains(post, out / "mcmc_trace.png", probs))
    return jsonable(write_report(writer, report))
