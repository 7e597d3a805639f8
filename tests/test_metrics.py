import math

import pytest
import torch

from twodg_pyro.metrics import accuracy, brier, classification_metrics, ece, nll


def test_metrics_against_hand_computation():
    probs = torch.tensor([[0.9, 0.1], [0.4, 0.6], [0.7, 0.3], [0.2, 0.8]])
    labels = torch.tensor([0, 0, 1, 1])
    assert accuracy(probs, labels) == 0.5
    assert nll(probs, labels) == pytest.approx(
        -(math.log(0.9) + math.log(0.4) + math.log(0.3) + math.log(0.8)) / 4
    )
    # 15 bins: conf 0.9 (bin 13, correct), 0.6 (bin 8, wrong), 0.7 (bin 10, wrong),
    # 0.8 (bin 11, correct) -> (0.1 + 0.6 + 0.7 + 0.2) / 4
    assert ece(probs, labels) == pytest.approx((0.1 + 0.6 + 0.7 + 0.2) / 4)
    assert brier(probs, labels) == pytest.approx(
        (2 * 0.1**2 + 2 * 0.6**2 + 2 * 0.7**2 + 2 * 0.2**2) / 4
    )


def test_bin_edges_are_right_closed():
    probs = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    labels = torch.tensor([0, 1])
    # conf 1.0 in the last bin (correct), 0.5 in bin 7 (argmax 0 -> wrong)
    assert ece(probs, labels) == pytest.approx((0.0 + 0.5) / 2)


def test_empty_and_misshapen_inputs_are_errors():
    with pytest.raises(ValueError, match="empty"):
        classification_metrics(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="expected probs"):
        accuracy(torch.zeros(3), torch.zeros(3, dtype=torch.long))
