"""Closed-form 2x2 SPD algebra against numpy/scipy, and the SPD validator."""

import math

import numpy as np
import pytest
import scipy.linalg
import scipy.stats
import torch

from twodg_pyro.gmm import (
    check_spd,
    cholesky2x2,
    det2x2,
    eigvalsh2x2,
    gaussian_log_prob,
    inv2x2,
    logdet2x2,
    sqrtm2x2,
    trace2x2,
)


def random_spd(n: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, 2, 2, generator=g, dtype=torch.float64) * scale
    return a @ a.transpose(1, 2) + 1e-3 * scale**2 * torch.eye(2, dtype=torch.float64)


def test_det_inv_trace_match_numpy():
    s = random_spd(200, seed=1)
    np_s = s.numpy()
    assert torch.allclose(det2x2(s), torch.from_numpy(np.linalg.det(np_s)), rtol=1e-10)
    assert torch.allclose(inv2x2(s), torch.from_numpy(np.linalg.inv(np_s)), rtol=1e-8, atol=1e-8)
    assert torch.allclose(trace2x2(s), torch.from_numpy(np.trace(np_s, axis1=1, axis2=2)))
    assert torch.allclose(logdet2x2(s), torch.from_numpy(np.linalg.slogdet(np_s)[1]), atol=1e-10)


def test_sqrtm_squares_to_input_and_matches_scipy():
    s = random_spd(200, seed=2)
    r = sqrtm2x2(s)
    assert torch.allclose(r @ r, s, rtol=1e-10, atol=1e-12)
    assert torch.allclose(r, r.transpose(1, 2))
    ref = np.stack([np.real(scipy.linalg.sqrtm(m)) for m in s.numpy()])
    assert np.allclose(r.numpy(), ref, rtol=1e-8, atol=1e-10)
    # the square root is itself positive definite
    assert bool((det2x2(r) > 0).all()) and bool((r[:, 0, 0] > 0).all())


def test_cholesky_and_eigenvalues():
    s = random_spd(100, seed=3)
    low = cholesky2x2(s)
    assert torch.allclose(low @ low.transpose(1, 2), s, rtol=1e-10, atol=1e-12)
    assert torch.all(low[:, 0, 1] == 0)
    assert torch.allclose(low, torch.linalg.cholesky(s), rtol=1e-10, atol=1e-12)
    lmin, lmax = eigvalsh2x2(s)
    ev = torch.linalg.eigvalsh(s)
    assert torch.allclose(lmin, ev[:, 0], rtol=1e-8) and torch.allclose(lmax, ev[:, 1], rtol=1e-8)


def test_gaussian_log_prob_matches_scipy():
    covs = random_spd(5, seed=4, scale=0.3)
    means = torch.randn(5, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    pts = torch.randn(300, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    lp = gaussian_log_prob(pts, means, covs, chunk_size=64)
    for k in range(5):
        ref = scipy.stats.multivariate_normal(means[k].numpy(), covs[k].numpy()).logpdf(pts)
        assert np.allclose(lp[:, k].numpy(), ref, rtol=1e-9, atol=1e-9)


def test_check_spd_accepts_spd_and_names_offender():
    s = random_spd(10, seed=7)
    check_spd(s)
    bad = s.clone()
    bad[3] = torch.tensor([[1.0, 2.0], [2.0, 1.0]], dtype=torch.float64)  # det = -3
    with pytest.raises(ValueError, match=r"covs\[3\] is not positive definite: det = -3"):
        check_spd(bad)
    bad = s.clone()
    bad[6, 0, 0] = -1.0
    with pytest.raises(ValueError, match=r"covs\[6\] is not positive definite: S00 = -1"):
        check_spd(bad)
    bad = s.clone()
    bad[2, 0, 1] += 0.5
    with pytest.raises(ValueError, match=r"mycov\[2\] is not symmetric"):
        check_spd(bad, "mycov")
    bad = s.clone()
    bad[4, 1, 1] = math.nan
    with pytest.raises(ValueError, match=r"covs\[4\] has non-finite entries"):
        check_spd(bad)
    with pytest.raises(ValueError, match=r"shape \(\.\.\., 2, 2\), got \(3, 3\)"):
        check_spd(torch.eye(3))
    nested = s.view(2, 5, 2, 2).clone()
    nested[1, 2] = -torch.eye(2, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"covs\[1, 2\]"):
        check_spd(nested)
