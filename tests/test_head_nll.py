"""The head-file NLL study (``experiments/head_nll.py``) and the frontier's kept files:
the last layer refitted to its mode is a stationary point of the log joint that it
names, no worse than where it started, with the body untouched (digits, a trained
mean-field MLP)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from twodg_pyro.data import make_loader
from twodg_pyro.methods import GuidePosterior, fit_laplace
from twodg_pyro.methods.feature_residual import last_layer_module, layer_inputs

pytest.importorskip("laplace")


def _objective(post, net, loader):
    """The log joint's negative at ``net``'s last layer, and its gradient's norm."""
    last = last_layer_module(net, post.param_names)
    phi = layer_inputs(net.eval(), last, loader)
    y = torch.cat([b[1] for b in loader])
    w = last.weight.detach().clone().requires_grad_(True)
    b = last.bias.detach().clone().requires_grad_(True)
    delta = float(post.prior_precision[0])
    j = F.cross_entropy(phi @ w.T + b, y, reduction="sum")
    j = j + 0.5 * delta * (w.square().sum() + b.square().sum())
    gw, gb = torch.autograd.grad(j, (w, b))
    return float(j.detach()), float(torch.cat([gw.flatten(), gb]).norm())


def test_the_last_layer_at_its_mode_is_stationary_and_leaves_the_body(trained_mean_field, digits):
    import head_nll  # experiments/ is on the tests' path (pyproject)

    model, guide = trained_mean_field
    loader = make_loader(digits.train, 256)
    post = fit_laplace(GuidePosterior(model, guide).mean_network(), loader, marglik_steps=30)
    before = {n: p.detach().clone() for n, p in post.net.named_parameters()}
    mode = head_nll.last_layer_mode(post, loader)
    j0, g0 = _objective(post, post.net, loader)
    j1, g1 = _objective(post, mode, loader)
    assert j1 < j0 and g1 < 1e-3 * g0, (j0, j1, g0, g1)
    covered = set(post.param_names)
    for name, p in mode.named_parameters():
        same = torch.equal(p, before[name])
        assert same == (name not in covered), name
    for name, p in post.net.named_parameters():  # the head's own network is not moved
        assert torch.equal(p, before[name]), name
    # and the head refitted around it is centred on the mode
    refit = fit_laplace(mode, loader, marglik_steps=30)
    params = dict(mode.named_parameters())
    mean = torch.cat([params[n].detach().flatten() for n in post.param_names])
    assert torch.equal(refit.mean(), mean)


def test_the_frontier_keeps_a_seeds_files_where_asked(tmp_path):
    import frontier

    with frontier._files_folder(str(tmp_path), 3) as folder:
        (folder / "a.2dgz").write_bytes(b"x")
    assert (tmp_path / "seed3" / "a.2dgz").read_bytes() == b"x"
    with frontier._files_folder(None, 3) as folder:
        gone = folder
        assert folder.is_dir()
    assert not gone.exists()
