"""The INT8 quantisation baseline of Table 4: size arithmetic and the quantiser."""

import pytest

from twodg_pyro.baselines import quantize_mean_field, quantized_size_mb


def test_size_arithmetic_against_a_hand_computation():
    # 784-400-400-10 MLP: 478,410 weights in 6 tensors; int8 mu (1 byte), 4-bit sigma
    # (0.5 byte), 3 float32 per tensor (mu scale, log-sigma min and step)
    assert quantized_size_mb(478410, 6, 4) == pytest.approx((478410 + 239205 + 72) / 1e6)
    assert quantized_size_mb(478410, 6, 2) == pytest.approx((478410 + 119603 + 72) / 1e6)
    assert quantized_size_mb(478410, 6, 1) == pytest.approx((478410 + 59802 + 72) / 1e6)
    # the anchors' 0.718 / 0.598 / 0.538 MB (without the per-tensor scales)
    assert round(quantized_size_mb(478410, 0, 4), 3) == 0.718
    assert round(quantized_size_mb(478410, 0, 1), 3) == 0.538
    expected = (10 + 10 + 12 + 20) / 1e6
    assert quantized_size_mb(10, 1, 8, n_deterministic=5) == pytest.approx(expected)


@pytest.mark.parametrize("bits", [1, 2, 4])
def test_quantiser_levels_and_error(trained_mean_field, bits):
    _, guide = trained_mean_field
    q = quantize_mean_field(guide, bits)
    for site in guide.sites:
        mu, mu_q = guide.loc(site.name).detach(), q.loc(site.name).detach()
        step = mu.abs().max() / 127
        assert (mu - mu_q).abs().max() <= step / 2 + 1e-6
        assert mu_q.div(step).round().unique().numel() <= 255
        levels = q.scale(site.name).detach().reshape(-1).unique()
        assert levels.numel() <= 2**bits
    with pytest.raises(ValueError, match="sigma_bits must be 1, 2, 4 or 8, got 3"):
        quantize_mean_field(guide, 3)
