"""Mahalanobis check and alpha-blending of ellipse points, against explicit numpy."""

import numpy as np
import pytest
import torch

from twodg_pyro.gmm import (
    ellipse_assign,
    mahalanobis_squared,
    mahalanobis_squared_own,
)

F64 = torch.float64


def setup(n=2000, k=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(k, 2, generator=g, dtype=F64)
    a = torch.randn(k, 2, 2, generator=g, dtype=F64) * 0.3
    covs = a @ a.transpose(1, 2) + 0.01 * torch.eye(2, dtype=F64)
    pts = torch.randn(n, 2, generator=g, dtype=F64) * 1.2
    assign = torch.randint(0, k, (n,), generator=g)
    return pts, means, covs, assign


def numpy_d2(pts, means, covs):
    p, m, c = pts.numpy(), means.numpy(), covs.numpy()
    inv = np.linalg.inv(c)
    d = p[:, None, :] - m[None, :, :]
    return np.einsum("nki,kij,nkj->nk", d, inv, d)


def test_mahalanobis_matches_numpy():
    pts, means, covs, assign = setup()
    d2 = mahalanobis_squared(pts, means, covs, chunk_size=300)
    ref = numpy_d2(pts, means, covs)
    assert np.allclose(d2.numpy(), ref, rtol=1e-10, atol=1e-10)
    own = mahalanobis_squared_own(pts, means, covs, assign)
    assert np.allclose(own.numpy(), ref[np.arange(len(pts)), assign.numpy()], rtol=1e-10)


def test_threshold_split_nearest_k_and_alphas():
    pts, means, covs, assign = setup()
    thr, k = 5.991, 5
    res = ellipse_assign(pts, means, covs, assign, threshold=thr, k=k, chunk_size=128)
    ref = numpy_d2(pts, means, covs)
    own = ref[np.arange(len(pts)), assign.numpy()]
    expect_mask = own > thr
    assert np.array_equal(res.mask.numpy(), expect_mask)
    assert 0 < expect_mask.sum() < len(pts)  # the split is not trivial
    assert np.array_equal(res.indices.numpy(), np.nonzero(expect_mask)[0])
    assert res.components.shape == (int(expect_mask.sum()), k) and res.k == k
    # the k nearest are the k smallest distances, nearest first
    sub = ref[expect_mask]
    got = np.take_along_axis(sub, res.components.numpy(), axis=1)
    assert np.allclose(got, np.sort(sub, axis=1)[:, :k], rtol=1e-12)
    # alphas: proportional to N(x | m_j, S_j), normalised to one
    assert torch.allclose(res.alphas.sum(1), torch.ones(res.alphas.shape[0], dtype=F64))
    logdet = np.linalg.slogdet(covs.numpy())[1]
    logn = -0.5 * got - 0.5 * logdet[res.components.numpy()]
    w = np.exp(logn - logn.max(1, keepdims=True))
    assert np.allclose(res.alphas.numpy(), w / w.sum(1, keepdims=True), rtol=1e-10)
    assert np.allclose(res.d2_own.numpy(), own, rtol=1e-10)


def test_k_larger_than_components_is_clamped():
    pts, means, covs, assign = setup(n=300, k=3, seed=1)
    res = ellipse_assign(pts, means, covs, assign, k=5, threshold=0.5)
    assert res.k == 3 and res.components.shape[1] == 3
    assert torch.equal(torch.sort(res.components, dim=1).values[0], torch.arange(3))
    assert torch.allclose(res.alphas.sum(1), torch.ones(res.alphas.shape[0], dtype=F64))


def test_far_points_keep_finite_alphas():
    pts, means, covs, assign = setup(n=10, k=6, seed=2)
    pts = pts + 1e4  # everything is very far: log-space softmax must not underflow to NaN
    res = ellipse_assign(pts, means, covs, assign)
    assert bool(res.mask.all()) and bool(torch.isfinite(res.alphas).all())
    assert torch.allclose(res.alphas.sum(1), torch.ones(10, dtype=F64))


def test_bad_inputs_raise_with_the_value():
    pts, means, covs, assign = setup(n=20, k=4)
    with pytest.raises(ValueError, match=r"threshold must be a finite number > 0, got -1"):
        ellipse_assign(pts, means, covs, assign, threshold=-1.0)
    with pytest.raises(ValueError, match=r"threshold must be .*got 0"):
        ellipse_assign(pts, means, covs, assign, threshold=0)
    with pytest.raises(ValueError, match=r"k must be an integer >= 1, got 0"):
        ellipse_assign(pts, means, covs, assign, k=0)
    bad = covs.clone()
    bad[1, 0, 0] = -0.5
    with pytest.raises(ValueError, match=r"covs\[1\] is not positive definite: S00 = -0.5"):
        ellipse_assign(pts, means, bad, assign)
    with pytest.raises(ValueError, match=r"assign\[3\] = 7 is not a component index"):
        ellipse_assign(pts, means, covs, torch.tensor([0, 1, 2, 7] + [0] * 16))
    nan_pts = pts.clone()
    nan_pts[5, 1] = float("nan")
    with pytest.raises(ValueError, match=r"1 non-finite value.*row 5"):
        mahalanobis_squared(nan_pts, means, covs)
    with pytest.raises(ValueError, match=r"points must be an \(N, 2\) tensor, got \(20, 3\)"):
        mahalanobis_squared(torch.zeros(20, 3, dtype=F64), means, covs)


def test_progress_bar_goes_to_stderr_and_leaves_the_result_unchanged(capsys):
    pts, means, covs, assign = setup()
    quiet = ellipse_assign(pts, means, covs, assign, k=3, chunk_size=128)
    assert capsys.readouterr() == ("", "")
    shown = ellipse_assign(pts, means, covs, assign, k=3, chunk_size=128, progress=True)
    out, err = capsys.readouterr()
    assert out == "" and "Mahalanobis" in err
    assert int(quiet.mask.sum()) > 128  # several chunks
    for key in ("mask", "indices", "components", "alphas", "d2_own"):
        assert torch.equal(getattr(quiet, key), getattr(shown, key)), key


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_ellipse_step_does_not_depend_on_its_chunk(dtype, monkeypatch):
    import twodg_pyro.gmm.mahalanobis as mahalanobis

    pts, means, covs, assign = (t.to(dtype) if t.is_floating_point() else t for t in setup())
    big = ellipse_assign(pts, means, covs, assign)
    monkeypatch.setattr(mahalanobis, "_CHUNK_ELEMS", 7 * 40 + 3)  # 7 rows a chunk, remainder
    small = ellipse_assign(pts, means, covs, assign)
    assert big.indices.numel() > 100
    assert torch.equal(big.components, small.components)
    assert torch.equal(big.alphas, small.alphas)  # bit for bit


def test_a_scope_keeps_each_point_among_its_groups_components():
    """``scope = (group, allowed)``: a flagged point's components are the ``k`` nearest of
    those its group allows, nearest first, and its alphas those of the true distances; a
    group allowing fewer than ``k`` borrows the nearest others after its own; an
    everything-allowed scope is the unscoped step bit for bit; a bad scope is named."""
    pts, means, covs, assign = setup()
    g = torch.Generator().manual_seed(1)
    group = torch.randint(0, 3, (len(pts),), generator=g)
    allowed = torch.rand(3, len(means), generator=g) < 0.5
    allowed[2] = False
    allowed[2, :3] = True  # group 2 allows only 3 components: k = 5 borrows two
    assign[group == 2] %= 3
    allowed[group, assign] = True
    res = ellipse_assign(pts, means, covs, assign, k=5, scope=(group, allowed))
    ref = numpy_d2(pts, means, covs)[res.mask.numpy()]
    ok = allowed[group[res.mask]].numpy()
    comps = res.components.numpy()
    for row, (d2, mask, got) in enumerate(zip(ref, ok, comps, strict=True)):
        own = np.flatnonzero(mask)[np.argsort(d2[mask])]
        others = np.flatnonzero(~mask)[np.argsort(d2[~mask])]
        assert np.array_equal(got, np.concatenate([own, others])[:5]), row
    assert (ok.sum(1) < 5).any()  # the borrowing rows are there
    logn = (
        -0.5 * np.take_along_axis(ref, comps, 1) - 0.5 * np.linalg.slogdet(covs.numpy())[1][comps]
    )
    w = np.exp(logn - logn.max(1, keepdims=True))
    assert np.allclose(res.alphas.numpy(), w / w.sum(1, keepdims=True), rtol=1e-10)
    every = (group, torch.ones_like(allowed))
    plain, scoped = (
        ellipse_assign(pts, means, covs, assign),
        ellipse_assign(pts, means, covs, assign, scope=every),
    )
    assert torch.equal(plain.components, scoped.components)
    assert torch.equal(plain.alphas, scoped.alphas)
    with pytest.raises(ValueError, match="scope must be"):
        ellipse_assign(pts, means, covs, assign, scope=(group[:-1], allowed))
