"""Multi-process training on torch.distributed: two gloo processes on loopback.

One launch of 2 ranks (``RANK``/``WORLD_SIZE``/``MASTER_ADDR=127.0.0.1``/a free
``MASTER_PORT``, ``GLOO_SOCKET_IFNAME=lo``; every wait bounded) runs every scenario in
turn and saves what each rank saw; the tests compare that with single-process
references computed here.  This file is also the worker: ``python test_distributed.py DIR``.

How the stage-3 equivalence is made exact: with ``noise="shared"`` every rank draws
the guide's weights from the same per-step seed, which is also the draw a single
process makes on the global batch; the draw's shape does not depend on the batch, so
one process on batch 2B and two ranks on B each see the same weights and the same
examples (``DistributedSampler`` with 1 or 2 replicas splits the same permutation).  What
remains is summation order.  The comparison runs in float64: in float32 a parameter
whose gradient nearly cancels (likelihood against KL) can get the opposite sign from
rounding, and Adam turns that into a full ``lr``-sized difference; in float64 the
parameters after one epoch (10 Adam steps that move them by ~1e-2) agree to 1e-9.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve()
GLOBAL_BATCH = 128
LR = 1e-2
TIMEOUT_S = 60.0  # process-group timeout of the worker: the longest any collective waits


# ---------------------------------------------------------------------- shared set-up
def _gmm_sets():
    """``{name: (points, kwargs)}`` for the mixture comparisons."""
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(6, 2, generator=g) * 4
    x6 = centres[torch.randint(6, (6000,), generator=g)] + torch.randn(6000, 2, generator=g)
    # an 8 x 8 grid of clusters, K = 64: each spatial cell keeps ~12 candidate components
    grid = torch.stack(torch.meshgrid(torch.arange(8.0), torch.arange(8.0), indexing="ij"), -1)
    grid = grid.reshape(-1, 2) * 4
    x64 = grid[torch.randint(64, (8000,), generator=g)] + 0.5 * torch.randn(8000, 2, generator=g)
    base = torch.tensor([[0.0, 0.0], [1.0, 1.0], [3.0, 0.0], [0.0, 3.0]])
    dup = torch.cat([base.repeat(500, 1), torch.randn(2000, 2, generator=g) * 0.3 + 5])
    dup = dup[torch.randperm(dup.shape[0], generator=g)]
    f64 = torch.float64
    return {
        "dense": (x6.double(), dict(n_components=6, random_state=3, dtype=f64)),
        "pruned": (x64.double(), dict(n_components=64, random_state=1, dtype=f64, max_iter=10)),
        "reseed": (
            dup.double(),
            dict(n_components=12, random_state=1, dtype=f64, max_iter=30, init="random"),
        ),
        "float32": (x6.float(), dict(n_components=6, random_state=3)),
        # initialised from a subsample: rank 0 reads the drawn rows from both ranks
        "subsample": (
            x6.double(),
            dict(n_components=6, random_state=5, dtype=f64, init_subsample=1500),
        ),
    }


def _model(inputs: dict, dtype=torch.float32):
    """The model rebuilt from the saved network."""
    from twodg_pyro.bnn import BNNModel
    from twodg_pyro.likelihoods import Categorical
    from twodg_pyro.models import MLP

    net = MLP(64, (32,), 10)
    net.load_state_dict(inputs["net"])
    return BNNModel(net, prior=1.0, likelihood=Categorical(inputs["n_train"])).to(dtype)


def _stage3_objects(inputs: dict, tying: str = "stochastic", dtype=torch.float32):
    """Model and shared-GMM guide rebuilt from the saved network and structure."""
    from twodg_pyro.guides import SharedGMMGuide

    model = _model(inputs, dtype)
    return model, SharedGMMGuide(model, inputs["structure"], tying=tying).to(dtype)


def _digits():
    from twodg_pyro.data import load_digits_split

    return load_digits_split(seed=0)


def _stage3_epoch(inputs, batch_size=GLOBAL_BATCH):
    """One stage-3 epoch in float64 (model, guide and inputs)."""
    from torch.utils.data import TensorDataset

    from twodg_pyro.distributed import fit_distributed

    model, guide = _stage3_objects(inputs, dtype=torch.float64)
    x, y = _digits().train.tensors
    state = fit_distributed(
        model,
        guide,
        TensorDataset(x.double(), y),
        1,
        batch_size=batch_size,
        lr=LR,
        noise="shared",
        progress=False,
        seed=0,
    )
    return {k: v.clone() for k, v in guide.state_dict().items()}, state.history


def _von_epoch(inputs, batch_size=GLOBAL_BATCH):
    """One stage-1 epoch of the mean-field guide by variational online Newton with the fused
    step (``mnist-lenet5-von``'s), in float64, from the saved network."""
    import functools

    from torch.utils.data import TensorDataset

    from twodg_pyro.distributed import fit_distributed
    from twodg_pyro.guides import MeanFieldGuide
    from twodg_pyro.infer import DecomposedELBO, VariationalOnlineNewton

    model = _model(inputs, torch.float64)
    guide = MeanFieldGuide(model, init_scale=0.01, seed=0).double()
    start = {k: v.clone() for k, v in guide.state_dict().items()}
    x, y = _digits().train.tensors
    beta = 0.1
    von = functools.partial(VariationalOnlineNewton, kl_weight=beta, beta2=0.99, total_steps=20)
    state = fit_distributed(
        model,
        guide,
        TensorDataset(x.double(), y),
        1,
        batch_size=batch_size,
        lr={"loc": 0.1, "scale": 0.1, "default": 0.1},
        elbo=(elbo := DecomposedELBO(beta=beta, fused_kl=True)),
        optimizer=von,
        noise="shared",
        progress=False,
        seed=0,
    )
    # the fused step ran: no fallback to the traced program, and VON kept the shared scale
    shared = [s for s in state.optimizer.state.values() if "shared_scale" in s]
    fused = elbo.fallback_reason is None and len(shared) == len(guide.rhos)
    return start, {k: v.clone() for k, v in guide.state_dict().items()}, state.history, fused


# ---------------------------------------------------------------------- the worker
def _worker(tmp: Path) -> None:  # pragma: no cover - runs in the launched processes
    from twodg_pyro.distributed import DistributedGaussianMixture2D, MainOnly, env
    from twodg_pyro.distributed.train import fit_distributed, state_checksum
    from twodg_pyro.infer.checkpoint import Checkpoint
    from twodg_pyro.pipeline.outputs.results import write_results
    from twodg_pyro.sharing import MahalanobisHook, MergeHook

    rank = int(os.environ["RANK"])
    out: dict = {"errors": {}}

    def scenario(name, fn):
        t0 = time.perf_counter()
        try:
            out[name] = fn()
        except Exception:  # noqa: BLE001 - reported to the test
            out["errors"][name] = traceback.format_exc()
        print(f"rank {rank}: {name} {time.perf_counter() - t0:.1f} s", flush=True)

    # -- a backend this host lacks, and a bogus one: clear errors before any traffic
    def backend_errors():
        msgs = {}
        for b in ("nccl", "bogus"):
            try:
                env.setup(b, timeout_s=TIMEOUT_S)
                msgs[b] = None
            except env.DistributedSetupError as e:
                msgs[b] = str(e)
        return msgs

    if not torch.cuda.is_available():
        scenario("backend_errors", backend_errors)
    info = env.setup("gloo", timeout_s=TIMEOUT_S)
    out["info"] = (info.rank, info.world_size, info.backend)
    inputs = torch.load(tmp / "inputs.pt", weights_only=False)

    # -- the mixture: every rank fits its share; sharded input too
    def gmm():
        res = {}
        for name, (x, kw) in _gmm_sets().items():
            g = DistributedGaussianMixture2D(**kw).fit(x)
            res[name] = {
                "w": g.weights_,
                "m": g.means_,
                "c": g.covariances_,
                "n_iter": g.n_iter_,
                "lb": g.lower_bound_,
                "counts": g.counts_,
                "reseeded": g.n_reseeded_,
                "n_local": g.n_local_,
            }
        x, kw = _gmm_sets()["dense"]
        lo, hi = rank * x.shape[0] // 2, (rank + 1) * x.shape[0] // 2
        g = DistributedGaussianMixture2D(**kw, sharded=True).fit(x[lo:hi])
        res["sharded"] = {"w": g.weights_, "m": g.means_, "c": g.covariances_}
        return res

    scenario("gmm", gmm)

    # -- one stage-3 epoch, 2 ranks x 64 = one process x 128
    scenario("stage3", lambda: _stage3_epoch(inputs))

    # -- one fused VON epoch of stage 1, 2 ranks x 64 = one process x 128
    scenario("von", lambda: _von_epoch(inputs))

    # -- a world size that does not divide the batch: the same error on every rank
    def bad_batch():
        model, guide = _stage3_objects(inputs)
        try:
            fit_distributed(model, guide, _digits().train, 1, batch_size=129, progress=False)
        except ValueError as e:
            return str(e)
        return None

    scenario("bad_batch", bad_batch)

    # -- a NaN on one rank only: every rank stops with the error, none waits
    def nan_one_rank():
        from torch.utils.data import TensorDataset

        model, guide = _stage3_objects(inputs)
        x = torch.randn(8, 64)
        x[3] = float("nan")
        ds = TensorDataset(x, torch.arange(8) % 10)
        t0 = time.perf_counter()
        try:
            fit_distributed(model, guide, ds, 1, batch_size=8, progress=False)
        except FloatingPointError as e:
            return {"message": str(e), "seconds": time.perf_counter() - t0}
        return None

    scenario("nan_one_rank", nan_one_rank)

    # -- hooks under DDP (a merge replaces parameters: re-wrapped), rank-0-only files
    def hooks():
        # representative tying: the merge tests see the stage-2 covariances (the
        # untrained structure's tiny ones would turn singular in float32 under training)
        model, guide = _stage3_objects(inputs, "representative")
        k0 = guide.n_components
        merge = MergeHook(tau_d=0.3, rule="moment", every=1, until_fixed_point=False)
        reassign = MahalanobisHook(every=1)
        mine = tmp / f"rank{rank}"
        ckpt = MainOnly(Checkpoint(mine / "checkpoints" / "stage3.pt", stage="stage3"))
        state = fit_distributed(
            model,
            guide,
            _digits().train,
            3,
            batch_size=GLOBAL_BATCH,
            lr=LR,
            callbacks=[merge, reassign, ckpt],
            progress=False,
            seed=1,
        )
        env.on_main(lambda: write_results(mine, [{"method": "2dg"}], {}), "write results")
        return {
            "k0": k0,
            "k": guide.n_components,
            "merge_log": merge.log,
            "reassign_log": reassign.log,
            "checksum": state_checksum(model, guide),
            "opt_ids_match": {id(p) for g in state.optimizer.param_groups for p in g["params"]}
            == {id(p) for p in guide.parameters()},
            "history": state.history,
            "files": sorted(str(p.relative_to(mine)) for p in mine.rglob("*"))
            if mine.exists()
            else [],
        }

    scenario("hooks", hooks)

    # -- a rank that never joins a collective: the other fails after the timeout
    def timeout():
        group = torch.distributed.new_group(timeout=timedelta(seconds=2))
        if rank == 0:
            t0 = time.perf_counter()
            try:
                torch.distributed.barrier(group=group)
            except Exception as e:  # noqa: BLE001
                return {"error": f"{type(e).__name__}: {e}", "seconds": time.perf_counter() - t0}
            return {"error": None, "seconds": time.perf_counter() - t0}
        time.sleep(4.0)
        return {}

    scenario("timeout", timeout)
    env.barrier()
    torch.save(out, tmp / f"rank{rank}.pt")
    env.cleanup()


# ---------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def dist_run(tmp_path_factory):
    """Inputs, single-process references, and what each of the 2 ranks saw."""
    from twodg_pyro.bnn import BNNModel
    from twodg_pyro.distributed.launch import run_local
    from twodg_pyro.guides import MeanFieldGuide
    from twodg_pyro.likelihoods import Categorical
    from twodg_pyro.models import MLP
    from twodg_pyro.pipeline import SharingConfig
    from twodg_pyro.sharing import build_sharing

    tmp = tmp_path_factory.mktemp("dist")
    torch.manual_seed(0)
    n_train = len(_digits().train)
    net = MLP(64, (32,), 10)
    model = BNNModel(net, prior=1.0, likelihood=Categorical(n_train))
    mf = MeanFieldGuide(model, seed=0)
    cfg = SharingConfig(
        outlier_rule="quantile",
        mu_quantile=0.99,
        grad_percentile=0.0,
        n_components=12,
        n_min=5,
        gmm_max_iter=20,
    )
    structure, _ = build_sharing(model, mf, None, cfg)
    inputs = {"net": net.state_dict(), "structure": structure, "n_train": n_train}
    torch.save(inputs, tmp / "inputs.pt")
    t0 = time.perf_counter()
    ranks = run_local([str(HERE), str(tmp)], 2, timeout_s=300.0, env={"OMP_NUM_THREADS": "1"})
    seconds = time.perf_counter() - t0
    print(f"2-rank launch: {seconds:.1f} s\n" + "".join(r.stdout for r in ranks))
    for r in ranks:
        assert r.returncode == 0 and not r.timed_out, (
            f"rank {r.rank} exited with {r.returncode} (timed out: {r.timed_out}):\n"
            f"{r.stderr[-4000:]}"
        )
    outs = [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for r, o in enumerate(outs):
        assert not o["errors"], f"rank {r}: " + "\n".join(o["errors"].values())
    return {"tmp": tmp, "inputs": inputs, "ranks": outs, "seconds": seconds}


# ---------------------------------------------------------------------- 2 processes
def test_two_gloo_ranks_on_loopback(dist_run):
    assert [o["info"] for o in dist_run["ranks"]] == [(0, 2, "gloo"), (1, 2, "gloo")]


@pytest.mark.parametrize("name", ["dense", "pruned", "reseed", "float32", "subsample"])
def test_distributed_gmm_equals_single_process_fit(dist_run, name):
    from twodg_pyro.gmm import GaussianMixture2D

    x, kw = _gmm_sets()[name]
    ref = GaussianMixture2D(**kw).fit(x)
    r0, r1 = (o["gmm"][name] for o in dist_run["ranks"])
    assert r0["n_local"] + r1["n_local"] == x.shape[0]  # each rank saw only its share
    for key in ("w", "m", "c", "counts"):  # every rank holds the same mixture
        assert torch.equal(r0[key], r1[key])
    assert r0["n_iter"] == ref.n_iter_ and r0["reseeded"] == ref.n_reseeded_
    if name == "reseed":
        assert ref.n_reseeded_ > 0  # the re-seeding draws follow the single-process stream
    # float64 E-steps agree up to summation order (~1e-12); float32 ones up to float32
    # rounding in differently sized spatial cells (~1e-6 relative)
    f64 = x.dtype == torch.float64
    tol = dict(atol=1e-5, rtol=0) if f64 else dict(atol=1e-4, rtol=1e-5)
    for key, want in (("w", ref.weights_), ("m", ref.means_), ("c", ref.covariances_)):
        torch.testing.assert_close(r0[key].double(), want.double(), **tol)
    assert math.isclose(r0["lb"], ref.lower_bound_, rel_tol=1e-9 if f64 else 1e-5)
    diff = int((r0["counts"] - ref.counts_).abs().sum())
    assert diff == 0 if f64 else diff <= 4


def test_distributed_gmm_on_sharded_input(dist_run):
    r0, r1 = (o["gmm"] for o in dist_run["ranks"])
    for key in ("w", "m", "c"):
        assert torch.equal(r0["sharded"][key], r1["sharded"][key])
        torch.testing.assert_close(r0["sharded"][key], r0["dense"][key], atol=1e-10, rtol=0)


def test_stage3_epoch_two_ranks_equals_one_process_with_twice_the_batch(dist_run):
    inputs = dist_run["inputs"]
    ref_state, ref_hist = _stage3_epoch(inputs)
    (s0, h0), (s1, h1) = (o["stage3"] for o in dist_run["ranks"])
    init = _stage3_objects(inputs, dtype=torch.float64)[1].state_dict()
    for k, v in ref_state.items():
        assert torch.equal(s0[k], s1[k]), k  # the ranks never differ
        if v.is_floating_point():
            torch.testing.assert_close(s0[k], v, atol=1e-9, rtol=1e-9, msg=k)
    # the epoch moved the parameters far beyond the tolerance: the check is not vacuous
    assert (ref_state["centre_mu"] - init["centre_mu"]).abs().max() > 1e-3
    assert h0 == h1
    for key in ("loss", "nll", "kl_inlier", "kl_outlier"):
        assert math.isclose(h0[0][key], ref_hist[0][key], rel_tol=1e-9), key


def test_fused_von_epoch_two_ranks_equals_one_process_with_twice_the_batch(dist_run):
    """Stage 1 by variational online Newton with the fused step (the ``mnist-lenet5-von``
    preset's) under DDP: every rank takes the same steps, those of one process on the
    global batch up to summation order, and the epoch moved every mean and scale tensor."""
    start, ref_state, ref_hist, ref_fused = _von_epoch(dist_run["inputs"])
    (_, s0, h0, fused0), (_, s1, h1, fused1) = (o["von"] for o in dist_run["ranks"])
    assert ref_fused and fused0 and fused1
    assert set(s0) == set(ref_state) and any("rho" in k for k in s0)
    for k, v in ref_state.items():
        assert torch.equal(s0[k], s1[k]), k  # the ranks never differ
        torch.testing.assert_close(s0[k], v, atol=1e-9, rtol=1e-9, msg=k)
        assert (v - start[k]).abs().max() > 1e-4, k  # not vacuous: the epoch moved it
    assert h0 == h1 and len(h0) == 1
    for key in ("loss", "nll", "kl"):
        assert math.isclose(h0[0][key], ref_hist[0][key], rel_tol=1e-9), key


def test_batch_not_divisible_by_world_size_is_an_error_on_every_rank(dist_run):
    msgs = [o["bad_batch"] for o in dist_run["ranks"]]
    assert msgs[0] == msgs[1] and msgs[0] is not None
    assert "129 is not divisible by the world size 2" in msgs[0] and "128 or 130" in msgs[0]


def test_nan_on_one_rank_stops_every_rank(dist_run):
    res = [o["nan_one_rank"] for o in dist_run["ranks"]]
    assert all(r is not None for r in res)
    assert all(r["seconds"] < TIMEOUT_S / 2 for r in res)  # nobody waited for a timeout
    assert sum("none (another rank)" in r["message"] for r in res) == 1


def test_backend_not_available_is_a_clear_error_on_every_rank(dist_run):
    if torch.cuda.is_available():
        pytest.skip("this host has GPUs: nccl is available")
    for o in dist_run["ranks"]:
        msgs = o["backend_errors"]
        assert f"rank {o['info'][0]}: backend 'nccl' needs CUDA GPUs" in msgs["nccl"]
        assert "unknown torch.distributed backend 'bogus'" in msgs["bogus"]


def test_hooks_under_ddp_keep_ranks_identical(dist_run):
    h0, h1 = (o["hooks"] for o in dist_run["ranks"])
    assert h0["k"] < h0["k0"] and h0["merge_log"] == h1["merge_log"]  # merges happened
    assert h0["reassign_log"] == h1["reassign_log"]
    assert torch.equal(h0["checksum"], h1["checksum"])
    assert h0["opt_ids_match"] and h1["opt_ids_match"]  # optimiser rebuilt on every rank
    assert h0["history"] == h1["history"] and len(h0["history"]) == 3
    assert all(math.isfinite(r["loss"]) for r in h0["history"])


def test_only_rank_zero_writes_checkpoints_and_results(dist_run):
    h0, h1 = (o["hooks"] for o in dist_run["ranks"])
    assert h0["files"] == ["checkpoints", "checkpoints/stage3.pt", "results.json", "results.md"]
    assert h1["files"] == []
    from twodg_pyro.infer.checkpoint import load_checkpoint

    ck = load_checkpoint(dist_run["tmp"] / "rank0" / "checkpoints" / "stage3.pt")
    assert ck.epoch == 3 and ck.header["guide_class"] == "SharedGMMGuide"


def test_a_silent_rank_is_a_timeout_error_not_a_hang(dist_run):
    res = dist_run["ranks"][0]["timeout"]
    assert res["error"] is not None and 1.5 < res["seconds"] < 30, res


# ---------------------------------------------------------------------- in-process
def test_setup_without_torchrun_is_single_process(monkeypatch):
    from twodg_pyro.distributed import env

    for v in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(v, raising=False)
    info = env.setup()
    assert (info.rank, info.world_size, info.backend) == (0, 1, None)
    assert env.is_main() and not env.is_distributed() and env.get_world_size() == 1
    with pytest.raises(ValueError, match="timeout_s must be a positive"):
        env.setup(timeout_s=0)
    with pytest.raises(env.DistributedSetupError, match="unknown torch.distributed backend"):
        env.setup("bogus")
    if not torch.cuda.is_available():
        with pytest.raises(env.DistributedSetupError, match="needs CUDA GPUs"):
            env.setup("nccl")


def test_setup_reads_torchrun_env_and_sets_the_timeout(monkeypatch):
    from twodg_pyro.distributed import env

    seen = {}
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *a, **k: seen.update(k))
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(env.DistributedSetupError, match="MASTER_ADDR not set"):
        env.setup("gloo")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    info = env.setup("gloo", timeout_s=7)
    assert (info.rank, info.world_size, info.local_rank, info.backend) == (3, 4, 1, "gloo")
    assert seen["timeout"] == timedelta(seconds=7) and seen["rank"] == 3
    assert seen["world_size"] == 4 and seen["init_method"] == "env://"
    monkeypatch.delenv("RANK")
    with pytest.raises(env.DistributedSetupError, match="RANK is not set"):
        env.setup("gloo")


def test_local_batch_size():
    from twodg_pyro.distributed import local_batch_size

    assert local_batch_size(128, 4) == 32 and local_batch_size(7, 1) == 7
    with pytest.raises(ValueError, match="not divisible by the world size 3"):
        local_batch_size(128, 3)
    with pytest.raises(ValueError, match="positive integer"):
        local_batch_size(0, 1)


def test_single_process_paths_are_the_plain_ones():
    from twodg_pyro.distributed import DistributedGaussianMixture2D, ShardedLoader
    from twodg_pyro.gmm import GaussianMixture2D

    x, kw = _gmm_sets()["float32"]
    a, b = GaussianMixture2D(**kw).fit(x), DistributedGaussianMixture2D(**kw).fit(x)
    for key in ("weights_", "means_", "covariances_", "counts_"):
        assert torch.equal(getattr(a, key), getattr(b, key))
    ds = torch.utils.data.TensorDataset(torch.arange(10.0))
    loader = ShardedLoader(ds, 4, seed=0)
    first = torch.cat([b[0] for b in loader])
    second = torch.cat([b[0] for b in loader])
    assert sorted(first.tolist()) == list(range(10)) and not torch.equal(first, second)


def test_run_distributed_rejects_methods_without_support():
    from twodg_pyro.pipeline import RunConfig, run_distributed

    with pytest.raises(ValueError, match=r"\['rank1'\] have no multi-process support"):
        run_distributed(RunConfig(methods=["mean_field", "rank1"]))


def test_data_parallel_execution_refuses_resume():
    from twodg_pyro.pipeline import RunConfig, run
    from twodg_pyro.pipeline.runtime.data_parallel import DataParallel

    with pytest.raises(ValueError, match="--resume runs in one process"):
        run(RunConfig(methods=["mean_field"]), "unused", resume=True, execution=DataParallel())


# ---------------------------------------------------------------------- the pipeline
TINY_RUN = """\
methods = ['deterministic', 'mean_field', '2dg']
num_samples = 4
progress = false
checkpoint_every = 2
[data]
batch_size = 128
[network]
hidden = [16]
pretrain_epochs = 1
[stage1]
epochs = 2
deterministic_epochs = 1
[sharing]
n_components = 8
n_min = 5
grad_batches = 1
gmm_max_iter = 20
[stage3]
epochs = 2
merge_every = 1
reassign_every = 1
"""


def _one_set_of_files(out: Path) -> list[dict]:
    """Check that the run folder ``out`` holds one set of results, the model file and the
    stage checkpoints; returns the records of its ``results.json``."""
    import json

    names = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    assert [n for n in names if n.startswith("results")] == ["results.json", "results.md"]
    assert [n for n in names if n.startswith("checkpoints/")] == [
        "checkpoints/config.json",
        "checkpoints/stage1.pt",
        "checkpoints/stage3.pt",
    ]
    assert "model_2dg.pt" in names
    return json.loads((out / "results.json").read_text())["records"]


def test_pipeline_on_two_ranks_writes_one_set_of_results(tmp_path):
    """The whole small pipeline (``twodg-pyro train``) on 2 gloo ranks through the one
    orchestration (:func:`~twodg_pyro.pipeline.run` with a ``DataParallel`` execution):
    every method runs on both ranks; rank 0 alone prints and writes the files."""
    from twodg_pyro.distributed.launch import run_local
    from twodg_pyro.infer.checkpoint import load_checkpoint

    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY_RUN)
    out = tmp_path / "run"
    argv = ["-m", "twodg_pyro.cli", "train", "--config", str(cfg), "--out", str(out)]
    env = {"OMP_NUM_THREADS": "1", "TWODG_DIST_TIMEOUT_S": "120"}
    ranks = run_local(argv, 2, timeout_s=240.0, env=env)
    for r in ranks:
        assert r.returncode == 0 and not r.timed_out, (
            f"rank {r.rank} exited with {r.returncode} (timed out: {r.timed_out}):\n"
            f"{r.stderr[-4000:]}"
        )
    assert ranks[0].stdout.count("wrote ") == 1 and "| method |" in ranks[0].stdout
    assert "wrote " not in ranks[1].stdout and "| method |" not in ranks[1].stdout
    records = _one_set_of_files(out)
    assert [r["method"] for r in records] == ["deterministic", "mean_field", "2dg"]
    assert all(r["world_size"] == 2 for r in records)
    assert all(r["accuracy"] > 0.5 for r in records if r["method"] != "deterministic")
    assert load_checkpoint(out / "checkpoints" / "stage3.pt").epoch == 2


# ---------------------------------------------------------------------- the CLI
@pytest.mark.slow
def test_cli_under_torchrun_writes_one_set_of_files(tmp_path):
    from twodg_pyro.distributed.launch import free_port

    cfg = tmp_path / "tiny.toml"
    cfg.write_text(
        "methods = ['mean_field', '2dg']\nnum_samples = 4\nprogress = false\n"
        "checkpoint_every = 1\n[data]\nbatch_size = 128\n[network]\nhidden = [32]\n"
        "[stage1]\nepochs = 2\n[sharing]\nn_components = 16\nn_min = 5\ngrad_batches = 1\n"
        "gmm_max_iter = 20\n[stage3]\nepochs = 2\nmerge_every = 1\nreassign_every = 1\n"
    )
    out = tmp_path / "run"
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--nproc_per_node=2", "--master_addr=127.0.0.1"]
    cmd += [f"--master_port={free_port()}", "-m", "twodg_pyro.cli", "train"]
    cmd += ["--config", str(cfg), "--out", str(out)]
    e = dict(os.environ, GLOO_SOCKET_IFNAME="lo", TWODG_DIST_TIMEOUT_S="120")
    r = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-4000:]
    assert r.stdout.count("wrote ") == 1  # rank 0 only
    recs = {x["method"]: x for x in _one_set_of_files(out)}
    assert recs["2dg"]["world_size"] == 2 and recs["2dg"]["accuracy"] > 0.5


def test_cli_as_a_rank_with_a_batch_the_world_does_not_divide(tmp_path, monkeypatch, capsys):
    from twodg_pyro.cli import main

    cfg = tmp_path / "bad.toml"
    cfg.write_text("methods = ['mean_field']\n[data]\nbatch_size = 127\n")
    # rank 1 of 2 as torchrun would start it; the error comes before any connection
    for k, v in dict(WORLD_SIZE="2", RANK="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="9").items():
        monkeypatch.setenv(k, v)
    assert main(["train", "--config", str(cfg), "--out", str(tmp_path / "o")]) == 2
    assert "127 is not divisible by the world size 2" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


if __name__ == "__main__":  # a rank of the launch in `dist_run`
    _worker(Path(sys.argv[1]))
