"""What a run produced besides its table: the trained methods, their predictions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...data import DataSplit
    from ...methods import TrainedMethod
    from ...prediction import Prediction


@dataclass
class RunArtifacts:
    """What :func:`~twodg_pyro.pipeline.run` produced, for callers that want more than
    the table.

    Attributes:
        records: the rows of the results table, in the order of the methods.
        split: the data split the run trained and evaluated on.
        eval_data: the evaluation examples every method was evaluated on (on the device).
        trained: every trained method by name, a
            :class:`~twodg_pyro.methods.TrainedMethod` (``"mean_field"``: stage 1's
            mean-field BNN, also when only the 2DG row was asked for; ``"2dg"``,
            ``"ensemble"``, ...).
        predictions: each method's prediction of ``eval_data`` (the table's numbers).
        variants: the 2DG BNN of each variant of
            :func:`~twodg_pyro.pipeline.runtime.variants.run_variants`, by variant name.
        model_files: the model files written into the run folder, by step name
            (``model_<method>``, ``model_2dg_compact``;
            :func:`~twodg_pyro.pipeline.outputs.artifacts.write_model_files`).
        failed_files: the model files that could not be written, by step name: the
            error (the run then ends incomplete: ``results.json`` says so and
            :func:`~twodg_pyro.pipeline.run` raises
            :class:`~twodg_pyro.pipeline.outputs.results.IncompleteRunError`).
    """

    records: list[dict] = field(default_factory=list)
    split: DataSplit | None = None
    eval_data: Any = None
    trained: dict[str, TrainedMethod] = field(default_factory=dict)
    predictions: dict[str, Prediction] = field(default_factory=dict)
    variants: dict[str, TrainedMethod] = field(default_factory=dict)
    model_files: dict[str, str] = field(default_factory=dict)
    failed_files: dict[str, str] = field(default_factory=dict)
