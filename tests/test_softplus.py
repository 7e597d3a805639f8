"""The guides' softplus and its inverse (twodg_pyro.nn.functional): float32 on the CPU is
computed from exp and log only (torch's own kernels run element by element there), and
must agree with torch's float64 softplus to a few units in the last place over the
scales a guide meets, be the identity above 20, differentiate to sigmoid, invert, and
leave float64 to torch's kernels bit for bit."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from twodg_pyro.nn.functional import MIN_SIGMA, VECTORISED_FROM, inverse_softplus, softplus

#: float32's unit roundoff: the bounds below are a few of it
EPS32 = 2.0**-24


def _rhos(dtype=torch.float32) -> torch.Tensor:
    """Unconstrained scales from sigma = 1e-37 (rho = -85) to far above the linear branch,
    and the branch points themselves."""
    torch.manual_seed(0)
    grid = torch.linspace(-85.0, 60.0, 200_001, dtype=torch.float64)
    edges = torch.tensor([-17.0, -16.6, -16.0, -1e-6, 0.0, 1e-6, 19.999, 20.0, 20.001, 1e4])
    return torch.cat([grid, edges.double()]).to(dtype)


def test_float32_softplus_is_torchs_float64_within_a_few_ulp():
    x = _rhos()
    got = softplus(x).double()
    ref = F.softplus(x.double())
    rel = ((got - ref).abs() / ref).max().item()
    assert rel < 4 * EPS32, rel
    above = x > 20.0
    assert torch.equal(softplus(x)[above], x[above])  # the identity, as torch's threshold


def test_softplus_gradient_is_the_sigmoid():
    x = _rhos()[::20].clone().requires_grad_()
    assert x.numel() >= VECTORISED_FROM
    (grad,) = torch.autograd.grad(softplus(x).sum(), x)
    torch.testing.assert_close(grad, torch.sigmoid(x.detach()), rtol=0, atol=0)
    x64 = x.detach().double().requires_grad_()
    torch.autograd.gradcheck(softplus, (x64[::50].detach().requires_grad_(),))


def test_float32_inverse_softplus_is_log_expm1_within_a_few_ulp_and_inverts():
    sigma = torch.cat([torch.logspace(-8, 1.5, 100_000), torch.tensor([20.0, 25.0, 1e4])])
    got = inverse_softplus(sigma).double()
    s64 = sigma.double()
    ref = torch.where(s64 > 20.0, s64, torch.log(torch.expm1(s64)))
    # an absolute bound where rho crosses 0, relative elsewhere
    err = ((got - ref).abs() / ref.abs().clamp_min(1.0)).max().item()
    assert err < 4 * EPS32, err
    rho = torch.linspace(-18.0, 30.0, 10_001)
    back = inverse_softplus(softplus(rho))
    torch.testing.assert_close(back, rho, rtol=4 * EPS32, atol=4 * EPS32)
    assert (
        inverse_softplus(torch.tensor([0.0, -1.0])).tolist()
        == [inverse_softplus(torch.tensor(MIN_SIGMA)).item()] * 2
    )  # clamped at the library's smallest sigma


def test_float64_uses_torchs_kernels_bit_for_bit():
    x = _rhos(torch.float64)
    assert torch.equal(softplus(x), F.softplus(x))
    s = F.softplus(x).clamp_min(MIN_SIGMA)
    assert torch.equal(inverse_softplus(s), torch.where(s > 20.0, s, torch.log(torch.expm1(s))))


def test_small_float32_tensors_use_torchs_kernels_bit_for_bit():
    # a LeNet-5 bias or a conv kernel: one torch dispatch is cheaper than the forms' several
    x = _rhos()[:: 200_011 // (VECTORISED_FROM - 1)][: VECTORISED_FROM - 1].clone()
    assert x.numel() == VECTORISED_FROM - 1
    x.requires_grad_()
    got, ref = softplus(x), F.softplus(x)
    assert torch.equal(got, ref)
    assert torch.equal(*(torch.autograd.grad(v.sum(), x)[0] for v in (got, ref)))
    s = ref.detach().clamp_min(MIN_SIGMA)
    assert torch.equal(inverse_softplus(s), torch.where(s > 20.0, s, torch.log(torch.expm1(s))))


def test_nan_is_not_hidden():
    x = torch.tensor([float("nan"), -3.0])
    assert softplus(x)[0].isnan() and not softplus(x)[1].isnan()
    assert inverse_softplus(x.abs())[0].isnan()


def test_in_range_tensors_skip_the_clamps_with_the_same_bits():
    """Where every element lies below 20 (and sigma above MIN_SIGMA) one max pass skips the
    clamps and the linear continuation: the same values, element by element, as the
    clamped path that one element above 20 forces, and the same gradient."""
    torch.manual_seed(1)
    rho = torch.linspace(-30.0, 19.9, VECTORISED_FROM + 3) + 0.01 * torch.randn(VECTORISED_FROM + 3)
    sigma = softplus(rho)
    forced = torch.cat([rho, torch.tensor([25.0])])
    assert torch.equal(sigma, softplus(forced)[:-1])
    x = sigma.clamp_min(MIN_SIGMA)
    assert torch.equal(
        inverse_softplus(x), inverse_softplus(torch.cat([x, torch.tensor([25.0])]))[:-1]
    )
    a, b = rho.clone().requires_grad_(), forced.clone().requires_grad_()
    softplus(a).sum().backward()
    softplus(b).sum().backward()
    assert torch.equal(a.grad, b.grad[:-1])
