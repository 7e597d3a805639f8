"""What a run produced besides its table: the trained models, their predictions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from torch import nn

if TYPE_CHECKING:
    from ..data import DataSplit
    from ..infer import TrainState
    from ..prediction import Prediction
    from ..sharing import SharingStructure


class Trained(NamedTuple):
    """A trained Bayesian model: the model, its guide and the final training state; for
    the 2DG BNN also the sharing structure stage 2 built (before stage 3 refined it; the
    guide's :meth:`~twodg_pyro.guides.SharedGMMGuide.structure` is the refined one)."""

    model: nn.Module
    guide: nn.Module
    state: TrainState
    structure: SharingStructure | None = None


@dataclass
class RunArtifacts:
    """What :func:`~twodg_pyro.pipeline.run` produced, for callers that want more than
    the table.

    Attributes:
        records: the rows of the results table, in the order of the methods.
        split: the data split the run trained and evaluated on.
        eval_data: the evaluation examples every method was evaluated on (on the device).
        mean_field: stage 1's mean-field BNN (also when only the 2DG row was asked for).
        trained: every other method's trained model by method name (``"2dg"``,
            ``"rank1"``, ...; a baseline's object is the ``model`` of its entry).
        predictions: each method's prediction of ``eval_data`` (the table's numbers).
        variants: the 2DG BNN of each variant of
            :func:`~twodg_pyro.pipeline.variants.run_variants`, by variant name.
        model_files: the model files already written into the run folder, by step name
            (``model_<method>``, ``model_2dg_compact``;
            :func:`~twodg_pyro.pipeline.costs.add_costs` writes them to measure them).
    """

    records: list[dict] = field(default_factory=list)
    split: DataSplit | None = None
    eval_data: Any = None
    mean_field: Trained | None = None
    trained: dict[str, Trained] = field(default_factory=dict)
    predictions: dict[str, Prediction] = field(default_factory=dict)
    variants: dict[str, Trained] = field(default_factory=dict)
    model_files: dict[str, str] = field(default_factory=dict)
