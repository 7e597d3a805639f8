"""Closed-form W2 between 2-D Gaussians against a scipy.linalg.sqrtm computation."""

import numpy as np
import scipy.linalg
import torch

from twodg_pyro.gmm import pairwise_w2_squared, w2_squared


def random_spd(n: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, 2, 2, generator=g, dtype=torch.float64) * scale
    return a @ a.transpose(1, 2) + 1e-2 * scale**2 * torch.eye(2, dtype=torch.float64)


def w2_scipy(ma, sa, mb, sb) -> float:
    ra = np.real(scipy.linalg.sqrtm(sa))
    cross = np.real(scipy.linalg.sqrtm(ra @ sb @ ra))
    return float(np.sum((ma - mb) ** 2) + np.trace(sa + sb - 2.0 * cross))


def test_w2_matches_scipy_on_random_pairs():
    n = 300
    sa, sb = random_spd(n, 1), random_spd(n, 2, scale=0.5)
    g = torch.Generator().manual_seed(3)
    ma = torch.randn(n, 2, generator=g, dtype=torch.float64)
    mb = torch.randn(n, 2, generator=g, dtype=torch.float64)
    ours = w2_squared(ma, sa, mb, sb)
    ref = np.array(
        [w2_scipy(ma[i].numpy(), sa[i].numpy(), mb[i].numpy(), sb[i].numpy()) for i in range(n)]
    )
    assert np.allclose(ours.numpy(), ref, rtol=1e-6, atol=1e-6)
    assert np.abs(ours.numpy() - ref).max() < 1e-6


def test_w2_properties():
    s = random_spd(50, 4)
    m = torch.randn(50, 2, dtype=torch.float64)
    same = w2_squared(m, s, m, s)
    assert float(same.max()) < 1e-12 and float(same.min()) >= 0.0  # clamped, no negatives
    # commuting (diagonal) case: W2^2 = |dm|^2 + sum (sqrt(a) - sqrt(b))^2
    a = torch.diag_embed(torch.tensor([[1.0, 4.0]], dtype=torch.float64))
    b = torch.diag_embed(torch.tensor([[9.0, 1.0]], dtype=torch.float64))
    z = torch.zeros(1, 2, dtype=torch.float64)
    assert torch.allclose(w2_squared(z, a, z + 1.0, b), torch.tensor([2.0 + 4.0 + 1.0]).double())
    # broadcasting: one against many
    out = w2_squared(m[:1], s[:1], m, s)
    assert out.shape == (50,) and float(out[0]) < 1e-12


def test_pairwise_is_exactly_symmetric_and_matches_elementwise():
    k = 70
    s = random_spd(k, 5, scale=0.1)
    m = torch.randn(k, 2, dtype=torch.float64) * 0.1
    d = pairwise_w2_squared(m, s, chunk_size=16)
    assert d.shape == (k, k)
    assert torch.equal(d, d.T)  # bit-identical, needed by the merge tie-breaking
    i, j = torch.triu_indices(k, k, 1)
    assert torch.allclose(d[i, j], w2_squared(m[i], s[i], m[j], s[j]), rtol=1e-12, atol=1e-15)
    other = pairwise_w2_squared(m[:5], s[:5], m, s)
    assert torch.allclose(other, d[:5])
