"""The settings of what a run computes once its methods are trained: OOD detection,
shift and selective prediction (``[uncertainty]``), and the diagnostics
(``[diagnostics]``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, ClassVar

from ...settings import (
    BOOLEAN,
    FOLDER,
    Section,
    at_least,
    names_of,
    optional_at_least,
    positive,
    require,
)
from ...uncertainty import BUILTIN_OOD_SETS, CORRUPTIONS, FOLDER_OOD_SETS, SEVERITIES


@dataclass
class UncertaintyConfig(Section):
    """OOD detection, shift and selective prediction in the results of a run
    (:mod:`twodg_pyro.pipeline.outputs.uncertainty_step`): off unless ``enabled``.  ``draws``
    (absent: ``num_samples``) seeded draws per method; every built-in OOD set of
    ``ood_sets`` and every folder set of ``folder_sets`` (read from ``folder_root``), at
    most ``ood_size`` images each; every corruption family of ``corruptions`` at
    ``severities`` on at most ``shift_size`` evaluation images."""

    section: ClassVar[str] = "uncertainty"
    enabled: Annotated[bool, BOOLEAN] = False
    draws: Annotated[int | None, optional_at_least(1, "or absent for num_samples")] = None
    ood_sets: Annotated[list[str], names_of(tuple(BUILTIN_OOD_SETS))] = field(
        default_factory=lambda: list(BUILTIN_OOD_SETS)
    )
    folder_sets: Annotated[list[str], names_of(tuple(FOLDER_OOD_SETS))] = field(
        default_factory=list
    )
    folder_root: Annotated[str | None, FOLDER] = None
    ood_size: Annotated[int | None, optional_at_least(1, "or absent for all")] = None
    corruptions: Annotated[list[str], names_of(tuple(CORRUPTIONS))] = field(
        default_factory=lambda: list(CORRUPTIONS)
    )
    severities: Annotated[list[int], names_of(SEVERITIES)] = field(
        default_factory=lambda: list(SEVERITIES)
    )
    shift_size: Annotated[int | None, optional_at_least(1, "or absent for all")] = None

    def _check(self) -> None:
        require(
            not self.folder_sets or self.folder_root is not None,
            "uncertainty.folder_root",
            self.folder_root,
            f"is needed to read the folder sets {self.folder_sets}",
        )


@dataclass
class DiagnosticsConfig(Section):
    """What a run computes after its results are written, and how much of it.

    ``enabled = false`` (``--no-diagnostics``) writes the results and the model file only:
    no InferenceData, Pareto k-hat, PSIS-LOO, posterior summary or figures.

    The budget: the k-hat uses ``khat_samples`` draws from q on a seeded subset of at most
    ``max_examples`` training examples (its log-likelihood scaled by N / n); the
    InferenceData (and so PSIS-LOO) holds ``num_samples`` draws on a seeded subset of at
    most ``max_examples`` evaluation examples, and its ``sample_stats.log_p`` evaluates
    those draws on the k-hat's training examples.  Counting one forward pass of one
    example as the unit, the diagnostics' passes (``khat_samples * n_train + E *
    num_samples * (n_eval + n_train)`` for ``E`` exported methods, plus ``khat_samples *
    n_train`` per block k-hat when they fit; see
    :func:`~twodg_pyro.pipeline.outputs.diagnostics_steps.diagnostics_budget`)
    are further held to ``budget`` times the passes of the exported model's training
    (epochs times training examples, over its SVI stages; a training pass also runs the
    backward, so ``budget = 1`` keeps the diagnostics to about a third of the training
    time): both subsets shrink in proportion, to no fewer than ``min_examples`` each.

    ``max_site_values``: the InferenceData holds at most this many values of each Pyro
    site per draw (a seeded sub-grid of a larger site; ``null``/``None``: every value;
    see :mod:`twodg_pyro.diagnostics.arviz_export`).
    """

    section: ClassVar[str] = "diagnostics"
    enabled: Annotated[bool, BOOLEAN] = True
    khat_samples: Annotated[
        int, at_least(30, "must be an integer >= 30 (the Pareto fit of the k-hat needs them)")
    ] = 100
    max_examples: Annotated[int, at_least(1)] = 2000
    budget: Annotated[float, positive()] = 1.0
    min_examples: Annotated[int, at_least(1)] = 100
    max_site_values: Annotated[int | None, optional_at_least(1, "or null for every value")] = 10_000

    def _check(self) -> None:
        require(
            self.min_examples <= self.max_examples,
            "diagnostics.min_examples",
            self.min_examples,
            f"must not exceed diagnostics.max_examples = {self.max_examples}",
        )
