"""Merge rules and merging to a fixed point."""

import math

import pytest
import torch

from twodg_pyro.gmm import (
    det2x2,
    merge_components,
    merge_moment,
    merge_paper,
    pairwise_w2_squared,
    remap_assignments,
    sqrtm2x2,
    trace2x2,
)

F64 = torch.float64


def random_components(k: int, seed: int, spread: float = 0.3, size: float = 0.05):
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(k, 2, generator=g, dtype=F64) * spread
    a = torch.randn(k, 2, 2, generator=g, dtype=F64) * size
    covs = a @ a.transpose(1, 2) + 1e-2 * size**2 * torch.eye(2, dtype=F64)
    counts = torch.randint(1, 200, (k,), generator=g).to(F64)
    return means, covs, counts


def is_spd(s: torch.Tensor) -> bool:
    sym = torch.allclose(s, s.transpose(-1, -2), rtol=0, atol=1e-14)
    return sym and bool((s[..., 0, 0] > 0).all()) and bool((det2x2(s) > 0).all())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_merged_covariances_are_spd_under_both_rules(seed):
    m, s, n = random_components(400, seed, size=1.0)
    # include near-singular inputs
    s[:50] = s[:50] * torch.tensor([[1.0, 0.999], [0.999, 1.0]], dtype=F64)
    m2, s2, n2 = random_components(400, seed + 10)
    _, sp = merge_paper(m, s, m2, s2)
    _, sm, _ = merge_moment(m, s, n, m2, s2, n2)
    assert is_spd(sp) and is_spd(sm)


def test_paper_rule_is_exactly_the_printed_formula():
    m, s, _ = random_components(20, 3)
    m2, s2, _ = random_components(20, 4)
    mp, sp = merge_paper(m, s, m2, s2)
    ra = sqrtm2x2(s)
    d = (m - m2)[:, :, None]
    expect = 0.5 * (s + s2) + d @ d.transpose(1, 2) / 8 + 0.5 * sqrtm2x2(ra @ s2 @ ra)
    assert torch.allclose(mp, 0.5 * (m + m2))
    assert torch.allclose(sp, expect, rtol=1e-12, atol=1e-14)


def test_moment_merge_preserves_total_mean_and_second_moment():
    m, s, n = random_components(100, 5)
    m2, s2, n2 = random_components(100, 6)
    mm, sm, nm = merge_moment(m, s, n, m2, s2, n2)
    assert torch.allclose(nm, n + n2)

    def second(mu, cov):
        return cov + mu[:, :, None] * mu[:, None, :]

    tot_mean = n[:, None] * m + n2[:, None] * m2
    assert torch.allclose(nm[:, None] * mm, tot_mean, rtol=1e-12)
    tot_second = n[:, None, None] * second(m, s) + n2[:, None, None] * second(m2, s2)
    assert torch.allclose(nm[:, None, None] * second(mm, sm), tot_second, rtol=1e-10)


@pytest.mark.parametrize("rule", ["paper", "moment"])
def test_merging_reaches_a_fixed_point_and_mapping_is_consistent(rule):
    k = 600
    means, covs, counts = random_components(k, 7, spread=0.5, size=0.03)
    tau = 0.08
    res = merge_components(means, covs, counts, tau_d=tau, rule=rule, chunk_size=100)
    k_new = res.means.shape[0]
    assert res.converged and res.n_merged == k - k_new > 0 and res.n_rounds >= 1
    # fixed point: no remaining pair qualifies, and merging again merges nothing
    d = pairwise_w2_squared(res.means, res.covs)
    d.fill_diagonal_(math.inf)
    assert float(d.min()) >= tau * tau
    again = merge_components(res.means, res.covs, res.counts, tau_d=tau, rule=rule)
    assert again.n_merged == 0 and again.n_rounds == 0
    assert torch.equal(again.mapping, torch.arange(k_new))
    # mapping consistency: merged counts are the sums of the old counts
    assert res.mapping.shape == (k,) and res.mapping.dtype == torch.long
    assert int(res.mapping.min()) == 0 and int(res.mapping.max()) == k_new - 1
    assert torch.equal(torch.unique(res.mapping), torch.arange(k_new))
    sums = torch.zeros(k_new, dtype=F64).index_add_(0, res.mapping, counts)
    assert torch.allclose(sums, res.counts)
    # untouched components keep their parameters exactly
    sizes = torch.bincount(res.mapping, minlength=k_new)
    single = sizes[res.mapping] == 1
    assert torch.equal(res.means[res.mapping[single]], means[single])
    assert is_spd(res.covs)
    # the merged variance is the trace of the merged covariance
    assert torch.allclose(res.variances, trace2x2(res.covs))


def test_moment_rule_preserves_global_moments_after_many_merges():
    means, covs, counts = random_components(300, 8, spread=0.2, size=0.05)
    res = merge_components(means, covs, counts, tau_d=0.1, rule="moment")
    assert res.n_merged > 10
    tot = (counts[:, None] * means).sum(0) / counts.sum()
    tot_new = (res.counts[:, None] * res.means).sum(0) / res.counts.sum()
    assert torch.allclose(tot, tot_new, rtol=1e-10)


def test_two_clusters_merge_when_close_only():
    m = torch.tensor([[0.0, 0.0], [0.05, 0.0], [5.0, 5.0]], dtype=F64)
    s = torch.eye(2, dtype=F64).repeat(3, 1, 1) * 0.01
    n = torch.tensor([1.0, 3.0, 2.0], dtype=F64)
    res = merge_components(m, s, n, tau_d=0.1, rule="moment")
    assert res.mapping.tolist() == [0, 0, 1]
    assert torch.allclose(res.means[0], torch.tensor([0.0375, 0.0], dtype=F64))
    assert res.counts.tolist() == [4.0, 2.0]
    assert merge_components(m, s, n, tau_d=0.05).n_merged == 0  # W2 = 0.05 is not < 0.05


def test_gradient_and_variance_tests():
    m = torch.tensor([[0.0, 0.0], [0.01, 0.0], [0.0, 0.01], [0.01, 0.01]], dtype=F64)
    s = torch.eye(2, dtype=F64).repeat(4, 1, 1) * 1e-4
    n = torch.ones(4, dtype=F64)
    g = torch.tensor([[0.1, 0.0], [0.1, 0.0], [5.0, 0.0], [5.1, 0.0]], dtype=F64)
    # "both": components 2 and 3 have |g| >= 1 and cannot merge; 0 and 1 merge, and
    # their merged gradient (0.2, 0) still passes
    res = merge_components(m, s, n, tau_d=1.0, grads=g, tau_g=1.0, rule="moment")
    assert res.mapping[0] == res.mapping[1]
    assert len({int(res.mapping[2]), int(res.mapping[3]), int(res.mapping[0])}) == 3
    assert torch.allclose(res.grads[res.mapping[0]], torch.tensor([0.2, 0.0], dtype=F64))
    # "difference": |g_2 - g_3| = 0.1 < 1, so 2 and 3 may merge too
    res = merge_components(
        m, s, n, tau_d=1.0, grads=g, tau_g=1.0, test="difference", max_rounds=1, rule="moment"
    )
    assert res.mapping[2] == res.mapping[3] and res.mapping[0] == res.mapping[1]
    # variance test: tr S = 2e-4 >= tau_v blocks every merge
    res = merge_components(m, s, n, tau_d=1.0, tau_v=2e-4)
    assert res.n_merged == 0
    # given variances pass, but a merged component's variance becomes tr S (> tau_v),
    # so each merged pair stops there: {0, 1} and {2, 3}
    small = torch.full((4,), 1e-5, dtype=F64)
    res = merge_components(m, s, n, tau_d=1.0, variances=small, tau_v=2e-4)
    assert res.converged and res.mapping.tolist() == [0, 0, 1, 1]
    assert torch.allclose(res.variances, trace2x2(res.covs))


def test_max_rounds_stops_early():
    means, covs, counts = random_components(200, 9, spread=0.05, size=0.05)
    full = merge_components(means, covs, counts, tau_d=math.inf, rule="moment")
    assert full.means.shape[0] == 1 and full.converged
    one = merge_components(means, covs, counts, tau_d=math.inf, rule="moment", max_rounds=1)
    assert one.n_rounds == 1 and 1 < one.means.shape[0] < 200 and not one.converged


def test_remap_assignments():
    mapping = torch.tensor([0, 0, 1, 2, 1])
    assign = torch.tensor([4, 3, -1, 0, 2])
    assert remap_assignments(assign, mapping).tolist() == [1, 2, -1, 0, 1]
    with pytest.raises(ValueError, match=r"assign\[1\] = 5 is out of range"):
        remap_assignments(torch.tensor([0, 5]), mapping)


def test_bad_inputs_raise_with_the_value():
    means, covs, counts = random_components(5, 10)
    with pytest.raises(ValueError, match=r"tau_d must be a number >= 0.*-1"):
        merge_components(means, covs, counts, tau_d=-1.0)
    with pytest.raises(ValueError, match=r"tau_g must be .*nan"):
        merge_components(means, covs, counts, tau_d=1.0, tau_g=math.nan)
    bad = covs.clone()
    bad[2] = torch.tensor([[1.0, 3.0], [3.0, 1.0]], dtype=F64)
    with pytest.raises(ValueError, match=r"covs\[2\] is not positive definite: det = -8"):
        merge_components(means, bad, counts, tau_d=1.0)
    with pytest.raises(ValueError, match=r"rule must be one of .*'average'"):
        merge_components(means, covs, counts, tau_d=1.0, rule="average")
    with pytest.raises(ValueError, match=r"test must be one of .*'any'"):
        merge_components(means, covs, counts, tau_d=1.0, test="any")
    with pytest.raises(ValueError, match=r"grads must have shape \(5, 2\), got \(5,\)"):
        merge_components(means, covs, counts, tau_d=1.0, grads=torch.zeros(5, dtype=F64))
    neg = counts.clone()
    neg[4] = -2.0
    with pytest.raises(ValueError, match=r"counts\[4\] is negative: -2"):
        merge_components(means, covs, neg, tau_d=1.0)
    nan_means = means.clone()
    nan_means[1, 0] = math.nan
    with pytest.raises(ValueError, match=r"means\[1\] is not finite"):
        merge_components(nan_means, covs, counts, tau_d=1.0)


def test_progress_bar_goes_to_stderr_and_leaves_the_merge_unchanged(capsys):
    means, covs, counts = random_components(300, 8, spread=0.2, size=0.05)
    quiet = merge_components(means, covs, counts, tau_d=0.1, rule="moment")
    assert capsys.readouterr() == ("", "")
    shown = merge_components(means, covs, counts, tau_d=0.1, rule="moment", progress=True)
    out, err = capsys.readouterr()
    assert out == "" and "merge" in err
    assert quiet.n_rounds == shown.n_rounds > 1
    for key in ("means", "covs", "counts", "mapping", "variances"):
        assert torch.equal(getattr(quiet, key), getattr(shown, key)), key
