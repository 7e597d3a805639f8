"""The diagnostics steps of a run folder and of ``diagnose``: each one run, timed on a
progress bar and reported on its own (:class:`StepWriter`), and the budget that bounds
them (:func:`diagnostics_budget`).  Used by :mod:`.artifacts` (a finished run) and
:mod:`.saved_models` (a saved model file)."""

from __future__ import annotations

import json
import traceback
import warnings
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ...files.atomic import atomic_write_text, jsonable

#: Draws from q for the Pareto k-hat (Yao et al. recommend at least about 100).
KHAT_SAMPLES = 100
#: Examples used by the diagnostics: for log p(D | w) in the k-hat, all training examples
#: up to this many, else a seeded subset scaled by N / n (noisier; see ``vi_diagnostics``);
#: for the InferenceData and PSIS-LOO, a seeded subset of the evaluation examples.
KHAT_MAX_EXAMPLES = 2000
#: Mixture components with a block k-hat of their own (the largest; see ``block_khat``).
KHAT_BLOCK_COMPONENTS = 4


def xy(dataset):
    """``(X, y)`` tensors of a ``TensorDataset``, else the dataset itself."""
    tensors = getattr(dataset, "tensors", None)
    return (tensors[0], tensors[1]) if tensors is not None else dataset


class StepWriter:
    """Runs each artifact step, recording files and errors (each also a warning, unless
    ``warn`` is false), with a progress bar (one update per step, the step's name
    beside it)."""

    def __init__(self, out_dir: Path, steps: int = 0, progress: bool = False, warn: bool = True):
        self.out, self.warn, self.progress = out_dir, warn, bool(progress)
        self.files: dict[str, str] = {}
        self.errors: dict[str, str] = {}
        self.bar = tqdm(
            total=steps or None, desc="diagnostics", unit="step", disable=not progress, leave=False
        )

    def step(self, name: str, fn, when: bool = True):
        """``fn()`` as the step ``name`` (a returned path is a file written); ``None`` when
        it fails (reported) or ``when`` is false (skipped)."""
        if not when:
            self.bar.update(1)
            return None
        self.bar.set_postfix_str(name, refresh=True)
        try:
            result = fn()
        except Exception as e:  # noqa: BLE001 - reported, the other artifacts still run
            self.errors[name] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
            if self.warn:
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

    def record(self) -> dict:
        """``{"files": {name: path}, "errors": {name: message}}`` of the steps so far."""
        return {"files": dict(self.files), "errors": dict(self.errors)}


def diagnostics_budget(
    dcfg,
    num_samples: int,
    n_train: int,
    n_eval: int,
    train_passes: int | None,
    n_exports: int = 1,
    khat_blocks: int = 0,
) -> dict:
    r"""How many draws and examples the diagnostics of a run use.

    With :math:`S_k` = ``dcfg.khat_samples`` draws for the k-hat, :math:`S_e` =
    ``num_samples`` draws exported for each of the :math:`E` = ``n_exports`` methods,
    and :math:`n_k = \min(N_\text{train}, m)`, :math:`n_e = \min(N_\text{eval}, m)`
    examples (:math:`m` = ``dcfg.max_examples``), the diagnostics cost
    :math:`S_k n_k + E S_e (n_e + n_k)` forward passes of one example (an export's draws
    are evaluated on its :math:`n_e` examples and, for ``sample_stats.log_p``, on the
    k-hat's :math:`n_k` training examples).  When that exceeds
    ``dcfg.budget`` times ``train_passes`` (epochs times training examples over the
    exported models' SVI stages; ``None``: no training to compare with), both :math:`n`
    shrink by the same factor, to no fewer than ``dcfg.min_examples`` (or the whole set,
    if smaller).

    The :math:`B` = ``khat_blocks`` block k-hats (``block_khat``: a layer, the outliers,
    a component at a time) cost :math:`B S_k n_k` more; they run (``khat_blocks_run``)
    when the total stays within the budget, or when there is no training to compare with.

    Returns the numbers used (``khat_samples``, ``num_samples``, ``n_train_examples``,
    ``n_eval_examples``, ``khat_blocks``, ``khat_blocks_run``) and the accounting
    (``n_exports``, ``diagnostics_passes``, ``train_passes``, ``budget``, ``reduced``).
    """
    s_k, s_e, e = int(dcfg.khat_samples), int(num_samples), max(1, int(n_exports))
    n_k, n_e = min(n_train, dcfg.max_examples), min(n_eval, dcfg.max_examples)
    work = s_k * n_k + e * s_e * (n_e + n_k)
    reduced = train_passes is not None and work > dcfg.budget * train_passes
    if reduced:
        f = dcfg.budget * train_passes / work
        n_k = max(min(n_train, dcfg.min_examples), int(n_k * f))
        n_e = max(min(n_eval, dcfg.min_examples), int(n_e * f))
    passes = s_k * n_k + e * s_e * (n_e + n_k)
    blocks = max(0, int(khat_blocks))
    run_blocks = blocks > 0 and (
        train_passes is None or passes + blocks * s_k * n_k <= dcfg.budget * train_passes
    )
    return {
        "khat_samples": s_k,
        "num_samples": s_e,
        "n_exports": e,
        "n_train_examples": n_k,
        "n_eval_examples": n_e,
        "train_examples_total": int(n_train),
        "eval_examples_total": int(n_eval),
        "khat_blocks": blocks,
        "khat_blocks_run": run_blocks,
        "diagnostics_passes": passes + (blocks * s_k * n_k if run_blocks else 0),
        "train_passes": train_passes,
        "budget": float(dcfg.budget),
        "reduced": reduced,
    }


def export_step(
    writer: StepWriter,
    method: str,
    model,
    guide,
    eval_data,
    num_samples: int,
    seed: int,
    metrics: dict | None,
    **export,
):
    """The exported tree of one method (file ``inference_data_<method>.nc``: a DataTree on
    ArviZ 1.x, an InferenceData on 0.x) and its PSIS-LOO; returns ``(tree or None, report
    section)`` (2 steps of ``writer``).  ``export``: the keyword arguments of
    :func:`~twodg_pyro.diagnostics.to_inference_data` (``max_examples``,
    ``max_site_values``; ``train_data``, a seeded subset of at most ``max_train_examples``,
    is the data of the tree's ``sample_stats.log_p``)."""
    from ... import diagnostics as D
    from ...metrics import classification_metrics

    section: dict = {}
    idata = writer.step(
        f"inference_data_{method}",
        lambda: D.to_inference_data(
            model,
            guide,
            eval_data,
            num_samples,
            seed,
            method=method,
            progress=writer.progress,
            **export,
        ),
    )
    if idata is None:
        writer.bar.update(2)  # the steps below need it
        return None, section
    name = f"inference_data_{method}.nc"
    writer.step(f"inference_data_{method}", lambda: D.save_inference_data(idata, writer.out / name))
    section["loo"] = writer.step(f"loo_{method}", lambda: D.loo(idata))
    posterior = D.group(idata, "posterior")
    n_exported = int(D.group(idata, "observed_data")["y"].shape[0])
    info = {
        "file": name,
        "arviz_major": D.ARVIZ_MAJOR,
        "arviz_version": D.ARVIZ_VERSION,
        "n_examples": n_exported,
        "n_examples_total": int(posterior.attrs.get("n_examples_total", n_exported)),
        "num_draws": int(posterior.sizes["draw"]),
        "seed": int(seed),
    }
    pp = D.group(idata, "posterior_predictive")
    if "class_probs" in pp and (
        metrics is None or n_exported < info["n_examples_total"]
    ):  # a subset (or no results-table metrics): the metrics of the exported examples
        probs, labels = D.class_probabilities(idata)
        info["metrics_on_exported_examples"] = classification_metrics(
            torch.as_tensor(probs), torch.as_tensor(labels)
        )
    section["inference_data"] = info
    section["posterior_uncertainty"] = posterior_uncertainty(guide, idata)
    return idata, section


def posterior_uncertainty(guide, idata) -> dict:
    r"""How much uncertainty the posterior carries, in numbers a reader can judge:

    * ``mean_mutual_information``: the mean over the exported examples of
      :math:`H[\bar p] - \frac1S \sum_s H[p_s]` (nats) over the exported draws'
      ``class_probs`` (0 for a posterior that is a point);
    * for a guide with per-weight scales (``means_and_scales``): ``sigma_median`` and
      ``sigma_over_spread``, the median :math:`\sigma_i` over the standard deviation of
      the means (about 0.04 for the paper recipe on LeNet-5, 1.5 for the recommended
      one: ``experiments/results/uncertainty.json``'s ``scale_trajectory``).
    """
    from ...diagnostics import group
    from ...infer.callbacks import scale_summary
    from ...uncertainty import mutual_information

    out: dict = {}
    pp = group(idata, "posterior_predictive")
    if pp is not None and "class_probs" in pp:
        probs = torch.as_tensor(pp["class_probs"].values)
        probs = probs.reshape(-1, *probs.shape[-2:])  # (chain x draw, obs, class)
        out["mean_mutual_information"] = float(mutual_information(probs).mean())
    fn = getattr(guide, "means_and_scales", None)
    if callable(fn):
        out.update(scale_summary(*fn()))
    return out


def khat_step(
    writer: StepWriter,
    model,
    guide,
    train_data,
    max_components: int = KHAT_BLOCK_COMPONENTS,
    skip_blocks: str | None = None,
    **draws,
):
    """The k-hat of the whole weight vector (``vi_diagnostics``) and under its
    ``"blocks"`` key the block k-hats (``block_khat``: each layer, the outliers, the
    ``max_components`` largest components), on the same ``draws`` (``num_samples``,
    ``seed``, ``max_examples``: their keyword arguments) (1 step; a failure of the blocks
    is recorded as ``khat_blocks`` in the errors).  With ``skip_blocks`` (the reason) the
    blocks are not computed: ``{"skipped": reason}``."""
    from ... import diagnostics as D

    def run():
        vi = D.vi_diagnostics(model, guide, train_data, **draws, progress=writer.progress)
        if skip_blocks is not None:
            vi["blocks"] = {"skipped": skip_blocks}
            return vi
        try:
            vi["blocks"] = D.block_khat(
                model,
                guide,
                train_data,
                **draws,
                max_components=max_components,
                progress=writer.progress,
            )
        except Exception as e:  # noqa: BLE001 - reported; the joint k-hat still stands
            writer.errors["khat_blocks"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
            warnings.warn(f"could not compute the block k-hats: {e}", RuntimeWarning, stacklevel=2)
        return vi

    return writer.step("khat", run)


def khat_block_count(guide, max_components: int = KHAT_BLOCK_COMPONENTS) -> int:
    """How many block k-hats :func:`khat_step` computes for ``guide`` (for the budget)."""
    from ...diagnostics import default_blocks

    return len(default_blocks(guide, max_components))


def summary_and_reliability(writer: StepWriter, idata, pred, method: str, draws: dict) -> None:
    """``posterior_summary.csv`` and ``reliability.png`` of the primary method (2 steps)."""
    from ... import diagnostics as D
    from ...evaluation import draws_sentence

    def write_summary():
        path = writer.out / "posterior_summary.csv"
        atomic_write_text(path, D.summary(idata, kind="stats").to_csv())
        return path

    def reliability():
        title = f"{method}: {draws_sentence(draws)}"
        path = writer.out / "reliability.png"
        return D.plot_reliability(pred.mean, pred.targets, path, title=title)

    writer.step("posterior_summary", write_summary, when=idata is not None)
    classified = pred is not None and pred.targets is not None and pred.std is None
    writer.step("reliability", reliability, when=classified)  # a regression has no classes


def write_report(writer: StepWriter, report: dict) -> dict:
    """Close ``writer`` and write ``diagnostics.json``: ``report`` with the steps' files
    (this one among them) and errors; returns that content."""
    writer.close()
    path = writer.out / "diagnostics.json"
    writer.files["diagnostics"] = str(path)
    report = {**report, **writer.record()}
    atomic_write_text(path, json.dumps(jsonable(report), indent=2, sort_keys=True))
    return report


def compare_step(writer: StepWriter, idatas: dict) -> list | None:
    """ArviZ's comparison of the methods' PSIS-LOO (``diagnostics.compare``: stable
    stacking weights) as a list of rows, best first (1 step)."""
    from ... import diagnostics as D

    def rows():
        table = D.compare(idatas)
        return [{"method": str(name), **row} for name, row in table.to_dict("index").items()]

    return writer.step("compare", rows, when=len(idatas) >= 2)
