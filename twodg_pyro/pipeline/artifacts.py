"""What a run leaves besides the table: a model file for every method it trained, the
InferenceData, diagnostics and figures (the ``evaluate`` / ``diagnose`` jobs on a saved
model file are in :mod:`.saved_models`).

Files written by :func:`write_artifacts` into the run folder:

``model_<method>.pt``
    one per method trained whose registry entry has a model file
    (:attr:`~twodg_pyro.pipeline.context.Method.model_file`): a Bayesian model and guide
    (``mean_field``, ``2dg``, ``rank1``, ``ssvi``; :func:`~twodg_pyro.io.save_model`) or a
    baseline's object (:func:`~twodg_pyro.io.save_baseline`), with its network spec (so
    that :func:`~twodg_pyro.io.load_model` rebuilds it without being passed the network)
    and an ``evaluation`` record: the seed, draws, data settings and metrics of the run's
    evaluation (a baseline's own draws: an ensemble's members, a network's one forward
    pass), from which ``twodg-pyro evaluate`` takes its defaults;
``model_2dg.2dgz``
    the 2DG BNN's compact file (:func:`~twodg_pyro.io.export_compact` at its default
    precision, with the same ``evaluation`` record less the metrics, which a rounded
    model only approaches): what a user deploys, whose bytes are the 2DG row's
    ``file_bytes`` (:mod:`.costs`);
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

from pathlib import Path

from ..baselines.draws import prediction_draws
from ..evaluation import data_to_device, n_examples
from .builders import network_spec
from .context import METHOD_REGISTRY
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
COMPACT_2DG_FILE = "model_2dg.2dgz"


def _trained(art) -> dict:
    """``{method: (model, guide, [training states])}`` of the Bayesian methods of a run."""
    out = {}
    mf = art.mean_field
    if mf is not None and any(r.get("method") == "mean_field" for r in art.records):
        out["mean_field"] = (mf.model, mf.guide, [mf.state])
    for method, entry in art.trained.items():
        if entry.guide is not None:
            stage1 = [mf.state] if method == "2dg" and mf is not None else []
            out[method] = (entry.model, entry.guide, stage1 + [entry.state])
    return out


def _metrics(record: dict | None) -> dict | None:
    return None if record is None else {k: record[k] for k in _METRICS if k in record}


def model_evaluation(cfg, method: str, record: dict | None, draws: dict) -> dict:
    """The ``evaluation`` record a run stores in a method's model file: the draws and
    data settings of its evaluation and the metrics it gave (``twodg-pyro evaluate``
    takes its defaults from it)."""
    d = cfg.data
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
        "metrics": _metrics(record) or {},
    }


def _write_model_files(writer: StepWriter, art, cfg, trained: dict, baselines: dict, draws):
    """``model_<method>.pt`` of every Bayesian method (``trained``) and baseline, and the
    2DG BNN's compact ``model_2dg.2dgz`` (one step each); files already in
    ``art.model_files`` (written by :func:`~twodg_pyro.pipeline.costs.add_costs`) are
    recorded, not written again."""
    from ..io import save_baseline, save_model
    from ..io.compact import compact_evaluation, export_compact

    records = {r.get("method"): r for r in art.records}
    spec = network_spec(cfg.network, art.split)
    done = getattr(art, "model_files", {}) or {}
    for method, obj in {**trained, **baselines}.items():
        # a baseline's own draws (an ensemble's members, an MCMC posterior's kept draws,
        # a network's one forward pass), as the costs count them
        own_draws = draws
        if method in baselines:
            own_draws = {**draws, "num_samples": prediction_draws(obj, draws["num_samples"])}
        evaluation = model_evaluation(cfg, method, records.get(method), own_draws)
        names = [f"model_{method}"] + ([COMPACT_2DG] if method == "2dg" else [])
        for name in names:
            if name in done and Path(done[name]).parent == writer.out:
                writer.files[name] = str(done[name])
                writer.bar.update(1)
                continue

            def save(name=name, method=method, obj=obj, evaluation=evaluation):
                if name == COMPACT_2DG:  # what a user deploys: the .2dgz, same record
                    path = writer.out / COMPACT_2DG_FILE
                    ev = compact_evaluation(evaluation, f"model_{method}.pt")
                    export_compact(path, obj[0], obj[1], network=spec, evaluation=ev)
                    return path
                path = writer.out / f"{name}.pt"
                if method in trained:  # (model, guide, states)
                    save_model(path, obj[0], obj[1], network=spec, evaluation=evaluation)
                    return path
                return save_baseline(path, obj, network=spec, evaluation=evaluation, method=method)

            writer.step(name, save)


def write_model_files(art, cfg, out_dir) -> dict:
    """Write the model files of a finished run into ``out_dir`` (``model_<method>.pt`` of
    every method with one, ``model_2dg.2dgz``): ``{"files": {name: path}, "errors":
    {name: message}}`` (a file that cannot be written is a warning and an error entry)."""
    out = Path(out_dir)
    trained = _trained(art)
    baselines = _baselines(art)
    writer = StepWriter(out, 0, progress=False)
    draws = evaluation_of(cfg, _eval_data(art, cfg))
    _write_model_files(writer, art, cfg, trained, baselines, draws)
    writer.close()
    return writer.record()


def _baselines(art) -> dict:
    """``{method: object}`` of the baselines of a run that have a model file."""
    return {
        m: e.model
        for m, e in art.trained.items()
        if e.guide is None and METHOD_REGISTRY[m].model_file
    }


def _eval_data(art, cfg):
    if art.eval_data is not None:
        return art.eval_data
    return data_to_device(xy(art.split.test), cfg.device)


def write_artifacts(art, cfg, out_dir, skip_diagnostics: str | None = None) -> dict:
    """Write the model files, InferenceData, diagnostics and figures of a finished run.

    Args:
        art: the :class:`~twodg_pyro.pipeline.trained.RunArtifacts` of
            :func:`~twodg_pyro.pipeline.run`.
        cfg: its :class:`~twodg_pyro.pipeline.config.RunConfig` (``cfg.diagnostics``: on
            or off, draws and examples; :func:`diagnostics_budget`).
        out_dir: the run folder.
        skip_diagnostics: write the model files only, with this reason in
            ``diagnostics.json`` (an incomplete run's finished methods).

    Returns:
        ``{"files": {name: path}, "errors": {name: message}}``.  Only the baselines'
        model files are written when the run trained no Bayesian method.
    """
    from ..diagnostics import plot_elbo_terms, plot_merges, plot_sharing_plane
    from ..distributed import env
    from ..evaluation import seeded_predict

    out = Path(out_dir)
    trained = _trained(art)
    baselines = _baselines(art)
    dcfg = cfg.diagnostics
    split = art.split
    device = cfg.device
    eval_data = _eval_data(art, cfg)
    draws = evaluation_of(cfg, eval_data)
    records = {r.get("method"): r for r in art.records}
    primary = next((m for m in ("2dg", *trained) if m in trained), None)
    diagnose = primary is not None and dcfg.enabled and skip_diagnostics is None
    n_steps = len(trained) + len(baselines) + ("2dg" in trained)
    if diagnose:
        n_steps += 3 * len(trained) + 4 + (2 if primary == "2dg" else 0) + 1
    writer = StepWriter(out, n_steps, progress=cfg.progress and env.is_main())
    _write_model_files(writer, art, cfg, trained, baselines, draws)
    if primary is None:  # no Bayesian method: no diagnostics
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
    predictions = art.predictions
    train_data = data_to_device(xy(split.train), device)
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
            budget["n_eval_examples"],
            dcfg.max_site_values,
            metrics,
            train_data=train_data,
            max_train_examples=budget["n_train_examples"],
        )
        if idata is not None:
            idatas[method] = idata
        report["methods"][method] = {"metrics": metrics, "draws": draws, **section}
    report["compare"] = compare_step(writer, idatas)
    model, guide, states = trained[primary]
    primary_section = report["methods"][primary]
    report["metrics"] = primary_section["metrics"]
    report["loo"] = primary_section.get("loo")
    pred = predictions.get(primary)
    if pred is None:  # e.g. a record restored from a checkpoint: the same seeded draws
        pred = seeded_predict(model, guide, eval_data, cfg.num_samples, cfg.seed)
    summary_and_reliability(writer, idatas.get(primary), pred, primary, draws)
    over_budget = "over the diagnostics budget (diagnostics.budget)"
    report["vi"] = khat_step(
        writer,
        model,
        guide,
        train_data,
        budget["khat_samples"],
        cfg.seed,
        budget["n_train_examples"],
        skip_blocks=None if budget["khat_blocks_run"] else over_budget,
    )
    report["budget"] = budget
    if primary == "2dg":
        writer.step("sharing_plane", lambda: plot_sharing_plane(guide, out / "sharing_plane.png"))
    histories = {}
    if art.mean_field is not None:
        histories["stage 1 (mean-field SVI)"] = art.mean_field.state.history
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
