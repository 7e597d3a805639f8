r"""A KL temperature tied to the data size and the network's size.

A tempered ELBO weighs the KL term by :math:`\beta`:
:math:`\mathbb E_q[-\log p(\mathcal D \mid w)] + \beta\,\mathrm{KL}(q \,\|\, p)`.
The expected negative log-likelihood is a sum over the :math:`N` training examples, the
KL a sum over the :math:`P` Bayesian weights, so one fixed :math:`\beta` puts a network
of four times the weights under four times the pull towards the prior for the same
data: on the MNIST subset (:math:`N` = 3,600) the LeNet-5 posterior at
:math:`\beta = 0.1` predicts well, while a ResNet-20 (:math:`P` = 268,058) at the same
:math:`\beta` is an under-confident mean-field posterior whose 2DG stage collapses
(``experiments/results/recipe_selection/``).

The rule :func:`data_size_kl_weight` keeps the KL's weight per weight and per example,
:math:`\beta P / N`, at the value chosen once on LeNet-5's validation split,

.. math::

    \beta = \beta_\mathrm{ref}\,\frac{N}{N_\mathrm{ref}}\,\frac{P_\mathrm{ref}}{P},
    \qquad (\beta_\mathrm{ref}, N_\mathrm{ref}, P_\mathrm{ref}) = (0.1,\ 3600,\ 61706),

so LeNet-5 on the MNIST subset keeps its 0.1, a ResNet-20 on the same images gets
0.023, and more data moves every network towards the true ELBO (:math:`\beta \to 1`
needs :math:`N / P` about 10 times LeNet-5's); :math:`\beta` is capped at 1, the true
bound.  ``kl_weight = "data_size"`` in the pipeline's ``[stage1]`` and ``[stage3]``
selects it, ``"data_size * m"`` selects :math:`m` times it (:func:`resolve_kl_weight`;
the natural-gradient presets' ``m`` = 0.3, chosen on the validation splits).
"""

from __future__ import annotations

from ..settings import data_size_multiple

#: ``(beta, N, P)`` of the reference: LeNet-5 on the 3,600 training images of the MNIST
#: subset, where beta = 0.1 was chosen on the validation split (docs/uncertainty.md)
REFERENCE: tuple[float, int, int] = (0.1, 3600, 61706)
#: the name of the rule in the settings
DATA_SIZE = "data_size"


def data_size_kl_weight(
    n_data: int, n_weights: int, reference: tuple[float, int, int] = REFERENCE
) -> float:
    r""":math:`\beta = \min(1, \beta_\mathrm{ref} (N / N_\mathrm{ref}) (P_\mathrm{ref} / P))`
    for ``n_data`` = :math:`N` training examples and ``n_weights`` = :math:`P` Bayesian
    weights (module docstring).

    Raises:
        ValueError: ``n_data`` or ``n_weights`` below 1, or a reference that is not three
            positive numbers.
    """
    for name, v in (("n_data", n_data), ("n_weights", n_weights)):
        if int(v) != v or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    beta_ref, n_ref, p_ref = reference
    if not (beta_ref > 0 and n_ref > 0 and p_ref > 0):
        raise ValueError(f"reference must be (beta, N, P), all > 0, got {reference!r}")
    return min(1.0, float(beta_ref) * (n_data / n_ref) * (p_ref / n_weights))


def resolve_kl_weight(value: float | str, model) -> float:
    r"""The :math:`\beta` of a setting: a positive number as it is, ``"data_size"`` by
    :func:`data_size_kl_weight` with the model's :math:`N` (its likelihood's
    ``dataset_size``) and :math:`P` (``num_weights``), ``"data_size * m"`` as :math:`m`
    times that (the natural-gradient recipe's ``"data_size * 0.3"``).

    Raises:
        ValueError: a value that is neither a positive number nor ``"data_size"`` (times a
            positive number).
    """
    multiple = data_size_multiple(value)
    if multiple is not None:
        return multiple * data_size_kl_weight(model.likelihood.dataset_size, model.num_weights)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(
            f"kl_weight must be a positive number, {DATA_SIZE!r} or '{DATA_SIZE} * m' (m > 0), "
            f"got {value!r}"
        )
    return float(value)
