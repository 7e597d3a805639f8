"""What a run leaves besides the table: a model file for every method it trained, the
InferenceData, diagnostics and figures (the ``evaluate`` / ``diagnose`` jobs on a saved
model file are in :mod:`.saved_models`).

Files written into the run folder, the model files by :func:`write_model_files` (once,
before the run measures them, :mod:`.costs`), the rest by :func:`write_artifacts`:

``model_<method>.pt``
    one per method trained whose registry entry has a model file
    (:attr:`~twodg_pyro.pipeline.settings.registry.Method.model_file`): the trained method's
    :meth:`~twodg_pyro.methods.TrainedMethod.save` (a Bayesian model and guide, or a
    baseline's file), with its network spec (so that
    :func:`~twodg_pyro.methods.load_method` rebuilds it without being passed the network)
    and an ``evaluation`` record: the seed, draws, data settings and metrics of the run's
    evaluation (a method's own draws: an ensemble's members, a network's one forward
    pass), from which ``twodg-pyro evaluate`` takes its defaults;
``model_2dg.2dgz``
    the 2DG BNN's compact file (:func:`~twodg_pyro.io.export_compact` at its default
    precision, with the same ``evaluation`` record less the metrics, which a rounded
    model only approaches): what a user deploys, whose bytes are the 2DG row's
    ``file_bytes`` (:mod:`.costs`);
``model_laplace.2dgz``
    with ``laplace.network = "2dg"``: the same compact 2DG BNN with the Laplace
    approximation around its posterior means stored beside it (``export_compact(...,
    laplace=)``), the ``laplace`` row's ``file_bytes``;
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
(:class:`~twodg_pyro.pipeline.settings.config.DiagnosticsConfig`, :func:`diagnostics_budget`:
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

from pathlib import Path

from ...evaluation import data_to_device, n_examples
from ..settings.build import network_spec
from ..settings.registry import METHOD_REGISTRY
from .diagnostics_steps import (
    StepWriter,
    compare_step,
    diagnostics_budget,
    export_step,
    khat_block_count,
    khat_step,
    summary_and_reliability,
    write_report,
    xy,
)
from .results import evaluation_of

_METRICS = ("accuracy", "nll", "ece", "brier")
#: The step (the ``files`` key of ``diagnostics.json``) and the file of the compact
#: ``.2dgz`` a run writes for its 2DG BNN (``twodg-pyro export RUN``'s default name).
COMPACT_2DG = "model_2dg_compact"
#: ``{row: step}`` of the rows whose file is a compact one (the step's file is
#: ``model_<row>.2dgz``): the 2DG BNN, and Laplace around its means (``laplace.network``)
COMPACT_STEPS = {"2dg": COMPACT_2DG, "laplace": "model_laplace_compact"}


def _variational(art) -> dict:
    """``{method: (model, guide, [training states])}`` of the variational methods of a run
    with a row (stage 1's states before the 2DG BNN's own)."""
    recorded = {r.get("method") for r in art.records}
    mf = art.trained.get("mean_field")
    stage1 = [] if mf is None else [mf.state]
    return {
        name: (m.model, m.guide, (stage1 if name == "2dg" else []) + [m.state])
        for name, m in art.trained.items()
        if m.variational and name in recorded
    }


def _metrics(record: dict | None) -> dict | None:
    return None if record is None else {k: record[k] for k in _METRICS if k in record}


def model_evaluation(cfg, method: str, record: dict | None, draws: dict) -> dict:
    """The ``evaluation`` record a run stores in a method's model file: the draws and
    data settings of its evaluation and the metrics it gave (``twodg-pyro evaluate``
    takes its defaults from it)."""
    keys = ("name", "root", "val_fraction", "test_fraction", "split_seed")
    return {
        **draws,
        "method": method,
        "data": {k: getattr(cfg.data, k) for k in keys},
        "metrics": _metrics(record) or {},
    }


def write_model_files(art, cfg, out_dir, warn: bool = True) -> dict:
    """Write the model files of the methods of a run that have a row and a file
    (:attr:`~twodg_pyro.pipeline.settings.registry.Method.model_file`) into ``out_dir``: each
    method's :meth:`~twodg_pyro.methods.TrainedMethod.save` (``model_<method>.pt``) and
    the compact ``model_2dg.2dgz`` (and ``model_laplace.2dgz``), one step each.  Returns
    ``{"files": {name: path}, "errors": {name: message}}`` (a file that cannot be written
    is an error entry, and a warning with ``warn``)."""
    from ...io.compact import compact_evaluation, export_compact

    out = Path(out_dir)
    records = {r.get("method"): r for r in art.records}
    spec = network_spec(cfg.network, art.split)
    draws = evaluation_of(cfg, _eval_data(art, cfg))
    writer = StepWriter(out, 0, progress=False, warn=warn)
    for name, method in art.trained.items():
        if name not in records or not METHOD_REGISTRY[name].model_file:
            continue
        # the method's own draws (an ensemble's members, an MCMC posterior's kept draws,
        # a network's one forward pass), as its evaluation counts them
        own = {**draws, "num_samples": method.num_draws(draws["num_samples"])}
        evaluation = model_evaluation(cfg, name, records[name], own)

        def save(method=method, name=name, evaluation=evaluation):
            return method.save(out / f"model_{name}.pt", network=spec, evaluation=evaluation)

        writer.step(f"model_{name}", save)
        # what a user deploys: the .2dgz, the same record less the metrics (Laplace: around
        # the 2DG BNN's means, stored beside it)
        bnn, laplace = method, None
        if name == "laplace" and records[name].get("network") == "2dg" and "2dg" in art.trained:
            bnn, laplace = art.trained["2dg"], method
        if name == "2dg" or laplace is not None:

            def compact(bnn=bnn, laplace=laplace, name=name, evaluation=evaluation):
                ev = compact_evaluation(evaluation, f"model_{name}.pt")
                path = out / f"model_{name}.2dgz"
                export_compact(path, bnn.model, bnn.guide, spec, evaluation=ev, laplace=laplace)
                return path

            writer.step(COMPACT_STEPS[name], compact)
    writer.close()
    return writer.record()


def _eval_data(art, cfg):
    if art.eval_data is not None:
        return art.eval_data
    return data_to_device(xy(art.split.test), cfg.device)


def write_artifacts(art, cfg, out_dir, skip_diagnostics: str | None = None) -> dict:
    """Write the InferenceData, diagnostics and figures of a finished run whose model
    files :func:`write_model_files` wrote (``art.model_files``, and those it could not
    write ``art.failed_files``: they are recorded in ``diagnostics.json``, not written or
    tried again).

    Args:
        art: the :class:`~twodg_pyro.pipeline.runtime.trained.RunArtifacts` of
            :func:`~twodg_pyro.pipeline.run`.
        cfg: its :class:`~twodg_pyro.pipeline.settings.config.RunConfig` (``cfg.diagnostics``: on
            or off, draws and examples; :func:`diagnostics_budget`).
        out_dir: the run folder.
        skip_diagnostics: write ``diagnostics.json`` with this reason only (an incomplete
            run's finished methods).

    Returns:
        ``{"files": {name: path}, "errors": {name: message}}``, the model files' among
        them.  Nothing is written when the run trained no variational method.
    """
    from ...diagnostics import plot_elbo_terms, plot_merges, plot_sharing_plane
    from ...distributed import env

    out = Path(out_dir)
    trained = _variational(art)
    dcfg, split = cfg.diagnostics, art.split
    eval_data = _eval_data(art, cfg)
    draws = evaluation_of(cfg, eval_data)
    records = {r.get("method"): r for r in art.records}
    primary = next((m for m in ("2dg", *trained) if m in trained), None)
    diagnose = primary is not None and dcfg.enabled and skip_diagnostics is None
    n_steps = 3 * len(trained) + 4 + (2 if primary == "2dg" else 0) + 1 if diagnose else 0
    writer = StepWriter(out, n_steps, progress=cfg.progress and env.is_main())
    writer.files.update(art.model_files)
    writer.errors.update(art.failed_files)
    if primary is None:  # no variational method: no diagnostics
        writer.close()
        return writer.record()
    if not diagnose:
        reason = skip_diagnostics or "diagnostics.enabled = false"
        write_report(writer, {"method": primary, "skipped": reason})
        return writer.record()

    n_train = len(split.train)
    stages = {id(st): st for *_, states in trained.values() for st in states}
    budget = diagnostics_budget(
        dcfg,
        cfg.num_samples,
        n_train,
        n_examples(eval_data),
        sum(len(st.history) for st in stages.values()) * n_train,
        n_exports=len(trained),
        khat_blocks=khat_block_count(trained[primary][1]),
    )
    train_data = data_to_device(xy(split.train), cfg.device)
    report: dict = {"method": primary, "draws": draws, "methods": {}}
    idatas = {}
    for method, (model, guide, _) in trained.items():
        metrics = _metrics(records.get(method))
        idata, section = export_step(
            writer,
            method,
            model,
            guide,
            eval_data,
            cfg.num_samples,
            cfg.seed,
            metrics,
            max_examples=budget["n_eval_examples"],
            max_site_values=dcfg.max_site_values,
            train_data=train_data,
            max_train_examples=budget["n_train_examples"],
        )
        if idata is not None:
            idatas[method] = idata
        report["methods"][method] = {"metrics": metrics, "draws": draws, **section}
    report["compare"] = compare_step(writer, idatas)
    model, guide, states = trained[primary]
    section = report["methods"][primary]
    report.update(metrics=section["metrics"], loo=section.get("loo"))
    pred = art.predictions.get(primary)
    if pred is None:  # e.g. a record restored from a checkpoint: the same seeded draws
        pred = art.trained[primary].predict(eval_data, cfg.num_samples, cfg.seed)
    summary_and_reliability(writer, idatas.get(primary), pred, primary, draws)
    over_budget = "over the diagnostics budget (diagnostics.budget)"
    report["vi"] = khat_step(
        writer,
        model,
        guide,
        train_data,
        skip_blocks=None if budget["khat_blocks_run"] else over_budget,
        num_samples=budget["khat_samples"],
        seed=cfg.seed,
        max_examples=budget["n_train_examples"],
    )
    report["budget"] = budget
    if primary == "2dg":
        writer.step("sharing_plane", lambda: plot_sharing_plane(guide, out / "sharing_plane.png"))
    histories = {}
    if "mean_field" in art.trained:
        histories["stage 1 (mean-field SVI)"] = art.trained["mean_field"].state.history
    if primary == "2dg":
        histories["stage 3 (shared-GMM SVI)"] = states[-1].history
    elif primary != "mean_field":
        histories[f"{primary} SVI"] = states[-1].history
    writer.step("elbo_terms", lambda: plot_elbo_terms(histories, out / "elbo_terms.png"))
    if primary == "2dg":
        record = records.get("2dg", {})
        log = (record.get("hooks") or {}).get("MergeHook", [])
        writer.step(
            "merges", lambda: plot_merges(log, out / "merges.png", stage2=record.get("stage2"))
        )
    write_report(writer, report)
    return writer.record()
