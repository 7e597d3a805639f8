"""Post-hoc temperature scaling: a known answer (a predictive made over-confident by a
factor k is fitted back to T = k), the accuracy kept, and a worse NLL never chosen."""

import pytest
import torch

from twodg_pyro.metrics import accuracy, nll
from twodg_pyro.uncertainty import apply_temperature, fit_temperature


@pytest.mark.parametrize("k", [0.5, 1.0, 2.5])
def test_recovers_the_temperature_of_a_miscalibrated_predictive(k):
    g = torch.Generator().manual_seed(0)
    logits = 2.0 * torch.randn(20000, 10, generator=g)
    labels = torch.multinomial(torch.softmax(logits, -1), 1, generator=g).squeeze(1)
    probs = torch.softmax(logits * k, -1)  # calibrated at T = k
    t = fit_temperature(probs, labels)
    assert t == pytest.approx(k, rel=0.03)
    fixed = apply_temperature(probs, t)
    assert accuracy(fixed, labels) == accuracy(probs, labels)
    assert nll(fixed, labels) <= nll(probs, labels) + 1e-6  # float32 rounding


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="temperature must be a positive number"):
        apply_temperature(torch.full((2, 3), 1 / 3), 0.0)
    with pytest.raises(ValueError, match=r"probs must be \(N, C\)"):
        fit_temperature(torch.full((2, 3), 1 / 3), torch.tensor([0]))
    with pytest.raises(ValueError, match="label 3 at example 1 is out of range"):
        fit_temperature(torch.full((2, 3), 1 / 3), torch.tensor([0, 3]))
