"""Checkpoints: exact resumption of fit (mean-field and shared-GMM with merges), atomic
writes, truncated files, the NaN guard naming the last good checkpoint, SPD covariances."""

import json
import os

import pyro
import pytest
import torch

from twodg_pyro.bnn import BNNModel
from twodg_pyro.data import make_loader
from twodg_pyro.files.atomic import atomic_torch_save
from twodg_pyro.gmm import check_spd
from twodg_pyro.guides import MeanFieldGuide, SharedGMMGuide
from twodg_pyro.infer import Callback, KLAnnealing, fit
from twodg_pyro.infer.checkpoint import Checkpoint, load_checkpoint, restore_state, resume_fit
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.models import MLP
from twodg_pyro.prediction import predict
from twodg_pyro.sharing import MahalanobisHook, MergeHook, SharingStructure


class Kill(Callback):
    """Simulates a kill: raises after epoch ``at`` has ended (and been checkpointed)."""

    def __init__(self, at):
        self.at = at

    def on_epoch_end(self, state):
        if state.epoch == self.at:
            raise KeyboardInterrupt


def _mean_field(digits, seed):
    torch.manual_seed(seed)
    model = BNNModel(MLP(64, (16,), 10), prior=1.0, likelihood=Categorical(len(digits.train)))
    return model, MeanFieldGuide(model, seed=seed)


def _params(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_mean_field_resume_is_exact(digits, tmp_path):
    lr = {"loc": 1e-2, "scale": 1e-2}

    def start():
        pyro.set_rng_seed(1)
        model, guide = _mean_field(digits, 1)
        loader = make_loader(digits.train, 128, shuffle=True, seed=1)
        return model, guide, loader

    # uninterrupted
    model, guide, loader = start()
    ref = fit(model, guide, loader, 6, lr, callbacks=[KLAnnealing(4)], progress=False)
    ref_params, ref_pred = _params(guide), predict(model, guide, digits.test.tensors, 5).mean

    # killed after epoch 3 (last checkpoint: epoch 2), resumed in fresh objects
    model, guide, loader = start()
    path = tmp_path / "run.pt"
    ckpt = Checkpoint(path, every=2, stage="stage1", generators=[loader])
    with pytest.raises(KeyboardInterrupt):
        fit(model, guide, loader, 6, lr, callbacks=[KLAnnealing(4), ckpt, Kill(3)], progress=False)
    assert load_checkpoint(path).epoch == 2
    pyro.set_rng_seed(123)  # the resumed process starts from another RNG state
    model, guide = _mean_field(digits, 7)  # and other initial values
    loader = make_loader(digits.train, 128, shuffle=True, seed=1)
    state = resume_fit(
        path, model, guide, loader, lr=lr, callbacks=[KLAnnealing(4)], progress=False
    )
    assert state.epoch == 6 and state.history == ref.history
    _assert_same(_params(guide), ref_params)
    torch.testing.assert_close(
        predict(model, guide, digits.test.tensors, 5).mean, ref_pred, rtol=0, atol=0
    )


@pytest.mark.parametrize("tying", ["stochastic", "tied"])
def test_shared_gmm_resume_after_merges_is_exact(
    trained_mean_field, stage2_structure, digits, tmp_path, tying
):
    model, _ = trained_mean_field
    check_spd(stage2_structure.covariances, "GMM covariances after fit")

    def start():
        pyro.set_rng_seed(2)
        guide = SharedGMMGuide(model, stage2_structure, tying)
        loader = make_loader(digits.train, 128, shuffle=True, seed=2)
        hooks = [MergeHook(tau_d=0.3, rule="moment", every=2), MahalanobisHook(every=3)]
        return guide, loader, hooks

    guide, loader, hooks = start()
    k0 = guide.n_components
    ref = fit(model, guide, loader, 6, 1e-2, callbacks=hooks, progress=False)
    assert guide.n_components < k0  # merges happened
    check_spd(guide.covariances().detach(), "guide covariances after merges and training")
    ref_params, ref_logs = _params(guide), [h.log for h in hooks]
    ref_opt = ref.optimizer.state_dict()

    guide, loader, hooks = start()
    path = tmp_path / "s3.pt"
    ckpt = Checkpoint(path, every=1, stage="stage3", callbacks=hooks, generators=[loader])
    with pytest.raises(KeyboardInterrupt):
        fit(model, guide, loader, 6, 1e-2, callbacks=hooks + [ckpt, Kill(4)], progress=False)
    c = load_checkpoint(path, stage="stage3")
    assert c.epoch == 4 and c.structure(SharingStructure.from_payload).n_gaussians < k0

    pyro.set_rng_seed(99)
    guide, loader, hooks = start()  # K of the stage-2 structure: the checkpoint's is adopted
    state = restore_state(c, model, guide, 1e-2, callbacks=hooks, generators=[loader])
    state = fit(model, guide, loader, 6, callbacks=hooks, state=state, progress=False)
    assert state.history == ref.history
    assert [h.log for h in hooks] == ref_logs
    _assert_same(_params(guide), ref_params)
    opt = state.optimizer.state_dict()
    for i, st in ref_opt["state"].items():
        for k, v in st.items():
            assert torch.equal(opt["state"][i][k], v)


def test_the_checkpoint_file_leaves_the_structure_to_its_reader(
    trained_mean_field, stage2_structure, digits, tmp_path
):
    """The checkpoint file (``twodg_pyro.files``) knows no guide: its structure section is
    decoded by the reader's decoder (``restore_state``: the class of the guide's own
    structure), and a section the decoder refuses is a ValueError naming the file."""
    model, _ = trained_mean_field
    loader = make_loader(digits.train, 128, shuffle=True, seed=3)
    path = tmp_path / "s3.pt"
    guide = SharedGMMGuide(model, stage2_structure, "representative")
    fit(model, guide, loader, 1, 1e-2, callbacks=[Checkpoint(path)], progress=False)
    c = load_checkpoint(path)
    assert c.has_structure and c.structure(dict) == c.section("structure/")
    assert c.structure(SharingStructure.from_payload).n_gaussians == guide.n_components
    mf_path, _ = _one_checkpointed_epoch(digits, tmp_path / "mf.pt")
    assert not load_checkpoint(mf_path).has_structure
    assert load_checkpoint(mf_path).structure(SharingStructure.from_payload) is None

    c.payload["structure/header"] = json.dumps({"kind": "not a structure"})
    fresh = SharedGMMGuide(model, stage2_structure, "representative")
    with pytest.raises(ValueError, match=r"s3\.pt'?: bad sharing structure: not a sharing"):
        restore_state(c, model, fresh, 1e-2)


def _one_checkpointed_epoch(digits, path):
    """One epoch of a mean-field BNN with a checkpoint at ``path``: ``(path, loader)``."""
    model, guide = _mean_field(digits, 0)
    loader = make_loader(digits.train, 128, shuffle=True, seed=0)
    callbacks = [Checkpoint(path, generators=[loader])]
    fit(model, guide, loader, 1, 1e-2, callbacks=callbacks, progress=False)
    return path, loader


def test_checkpoint_into_another_network_is_a_clear_error(digits, tmp_path):
    path, loader = _one_checkpointed_epoch(digits, tmp_path / "c.pt")
    other = BNNModel(MLP(64, (32,), 10), likelihood=Categorical(10))
    with pytest.raises(ValueError, match=r"another network: 4 Bayesian sites with 1210 weights"):
        restore_state(path, other, MeanFieldGuide(other), 1e-2, generators=[loader])


def test_atomic_save_never_leaves_a_partial_final_file(tmp_path, monkeypatch):
    path = tmp_path / "ck.pt"
    atomic_torch_save({"a": torch.ones(3)}, path)
    before = path.read_bytes()

    def broken_save(obj, f, *a, **k):  # f: a path or (atomic_torch_save) a file object
        if hasattr(f, "write"):
            f.write(b"PK\x03\x04 half a file")
        else:
            with open(f, "wb") as fh:
                fh.write(b"PK\x03\x04 half a file")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        atomic_torch_save({"a": torch.zeros(1000)}, path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["ck.pt"]  # no temporary file left behind


def test_truncated_checkpoint_is_a_clear_error(digits, tmp_path):
    path, loader = _one_checkpointed_epoch(digits, tmp_path / "c.pt")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated, corrupted"):
        load_checkpoint(path)


class _Poison(Callback):
    def on_epoch_end(self, state):
        if state.epoch == 2:
            with torch.no_grad():
                next(iter(state.guide.parameters())).fill_(float("nan"))


def test_nan_loss_names_step_term_and_last_good_checkpoint(digits, tmp_path):
    model, guide = _mean_field(digits, 0)
    loader = make_loader(digits.train, 128, shuffle=True, seed=0)
    path = tmp_path / "c.pt"
    ckpt = Checkpoint(path, every=1, generators=[loader])
    with pytest.raises(FloatingPointError) as err:
        fit(model, guide, loader, 5, 1e-2, callbacks=[ckpt, _Poison()], progress=False)
    msg = str(err.value)
    assert f"epoch 2, step {2 * len(loader)}" in msg and "'nll'" in msg and "'kl'" in msg
    assert f"last good checkpoint: {path} (epoch 2)" in msg
    assert load_checkpoint(path).epoch == 2  # the checkpoint itself is intact
