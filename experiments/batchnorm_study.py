"""BatchNorm's statistics under the natural-gradient posterior (issue 43): kept from the
pretrained network, recomputed once at the posterior mean, or recomputed for every weight
draw, measured on the validation split.

The natural-gradient recipe trains stage 1 with BatchNorm frozen at the pretrained
network's running statistics (``network.norm_stats = "frozen"``), so the objective is
the function that predicts; a draw of the weights then runs on statistics that were
computed for other weights.  Here the recipe's stage 1 (``last_layer_study.POINTS``) is
trained once from the recipe's pretrained network, and every row predicts with the same
seeded weight draws (the means plus the scales times a standard Normal), with BatchNorm's
running mean and variance

* ``frozen``: the pretrained network's (what the recipe predicts with);
* ``at the mean``: recomputed once over the training images, with the posterior's means
  as the weights;
* ``per draw``: recomputed over the training images for each draw (SWAG's ``bn_update``:
  the statistics of the network that predicts; ``--bn-images`` images a draw, in training
  mode with a cumulative average, then evaluation mode), so a prediction costs
  ``1 + bn_images / N`` forward passes a draw for ``N`` predicted inputs.

A second stage 1, the same recipe with BatchNorm's affine parameters Bayesian too
(``layer_types`` naming ``nn.BatchNorm2d``: fan-in 1, N(0, 1) under the layer-wise
prior), is scored by its guide's own draws, beside the first one's.

Each row is scored on the **validation split** (its OOD sets and corruptions, as in
``stage1_selection.py``; the test images play no part).

    python experiments/batchnorm_study.py --arch resnet20     # 10 min, 2 threads

Results: ``experiments/results/recipe_selection/batchnorm_<arch>.{json,md}``.
"""

from __future__ import annotations

import copy
import json
import time

import torch
from common import cell, command
from last_layer_study import POINTS, LastLayer, natural_gradient_stage1
from recipe_selection import append_record, selection_output, selection_parser
from stage1_selection import score_cells, validation_record
from torch import nn

from twodg_pyro.methods.base import TrainedMethod
from twodg_pyro.nn.sites import DEFAULT_LAYER_TYPES
from twodg_pyro.pipeline.methods.algorithm1 import stage1_mean_field
from twodg_pyro.pipeline.runtime.context import RunContext
from twodg_pyro.pipeline.settings.build import seed_everything

MODES = ("frozen", "at the mean", "per draw")


def norm_layers(net: nn.Module) -> list[nn.modules.batchnorm._NormBase]:
    """The network's layers with running statistics."""
    return [m for m in net.modules() if isinstance(m, nn.modules.batchnorm._NormBase)]


@torch.no_grad()
def recompute_statistics(net: nn.Module, x: torch.Tensor, batch: int = 200) -> dict:
    """BatchNorm's running statistics of ``net`` as it is, over the images ``x`` (training
    mode, a cumulative average over batches of ``batch``); returns them, the net left in
    evaluation mode with them."""
    layers = norm_layers(net)
    momenta = [m.momentum for m in layers]
    for m in layers:
        m.reset_running_stats()
        m.momentum = None
    net.train()
    for i in range(0, len(x), batch):
        net(x[i : i + batch])
    net.eval()
    for m, mom in zip(layers, momenta, strict=True):
        m.momentum = mom
    return {i: (m.running_mean.clone(), m.running_var.clone()) for i, m in enumerate(layers)}


def load_statistics(net: nn.Module, stats: dict) -> None:
    with torch.no_grad():
        for i, m in enumerate(norm_layers(net)):
            m.running_mean.copy_(stats[i][0])
            m.running_var.copy_(stats[i][1])


class DrawnNetwork(TrainedMethod):
    """A mean-field posterior's seeded weight draws run in its network with BatchNorm's
    statistics set by ``mode`` (module docstring); the statistics of each draw are kept, so
    every set of inputs predicted with the same seed sees the same networks."""

    name = "mean-field, BatchNorm statistics"

    def __init__(self, ll: LastLayer, mode: str, x_train: torch.Tensor):
        super().__init__()
        self.ll, self.mode, self.x_train = ll, mode, x_train
        self.frozen = {
            i: (m.running_mean.clone(), m.running_var.clone())
            for i, m in enumerate(norm_layers(ll.net))
        }
        self._cache: dict[tuple[int, int], dict] = {}

    @property
    def net(self):
        return self.ll.net

    def _statistics(self, seed: int, k: int) -> dict:
        if self.mode == "frozen":
            return self.frozen
        key = (seed, k) if self.mode == "per draw" else (0, 0)
        if key not in self._cache:
            self._cache[key] = recompute_statistics(self.net, self.x_train)
        return self._cache[key]

    @torch.no_grad()
    def _draws(self, parts, num_samples: int, seed: int) -> torch.Tensor:
        x = torch.cat([p[0] for p in parts])
        gen = torch.Generator().manual_seed(int(seed))
        out = []
        for k in range(int(num_samples)):
            if self.mode == "at the mean":
                self.ll.set_weights(None)
                load_statistics(self.net, self._statistics(seed, k))
            self.ll.set_weights(gen)
            if self.mode != "at the mean":
                load_statistics(self.net, self._statistics(seed, k))
            self.net.eval()
            out.append(
                torch.cat([self.net(x[i : i + 500]).softmax(-1) for i in range(0, len(x), 500)])
            )
        self.ll.set_weights(None)
        load_statistics(self.net, self.frozen)
        return torch.stack(out).float()


class Reseeded(TrainedMethod):
    """``method`` with its draws seeded by ``seed`` whatever seed it is asked for (the
    uncertainty sets ask with the run's)."""

    def __init__(self, method: TrainedMethod, seed: int):
        super().__init__()
        self.method, self.seed, self.bayesian = method, seed, method.bayesian
        self.name = method.name

    @property
    def net(self):
        return self.method.net

    def num_draws(self, num_samples: int) -> int:
        return self.method.num_draws(num_samples)

    def _draws(self, parts, num_samples: int, seed: int) -> torch.Tensor:
        return self.method.sample_probs(parts, num_samples, self.seed)


def markdown(doc: dict) -> str:
    lines = [
        f"# BatchNorm's statistics under the natural-gradient posterior: {doc['arch']}, "
        f"seed {doc['seed']}",
        "",
        f"Command: `{doc['command']}`.  Stage 1: `{doc['point']}` (KL weight "
        f"{doc['kl_weight']:.4g}).  {doc['draws']} seeded weight draws (the same in every "
        f"row but the guide's own) on the validation images; OOD sets of {doc['ood_size']} "
        f"images made from them; severity-5 corruptions of {doc['shift_size']}.  Statistics "
        f"recomputed over {doc['bn_images']} training images.",
        "",
        "| BatchNorm statistics | draws' seed | acc | NLL | ECE | clean MI "
        "| OOD AUROC entropy (MI) | severity-5 NLL (mean) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["records"]:
        lines.append(
            f"| {r['point']} | {r['draw_seed']} | {score_cells(r)} | {cell(r['severity5'])} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = selection_parser(__doc__, 2, "default: batchnorm_<arch>")
    p.add_argument("--bn-images", type=int, default=3600, help="training images a draw")
    p.add_argument(
        "--draw-seeds", type=int, nargs="+", default=[0, 1, 2], help="each row's draws, seeded"
    )
    args = p.parse_args(argv)
    out, stem, done = selection_output(args, f"batchnorm_{args.arch}", markdown)
    if done:
        return 0
    study = natural_gradient_stage1(args)
    det, stage1, ev, beta = (study[k] for k in ("det", "stage1", "ev", "beta"))
    (xv, yv), xt = study["val"], study["train_x"]
    xt = xt[torch.randperm(len(xt), generator=torch.Generator().manual_seed(args.seed))]
    xt = xt[: args.bn_images]
    ll = LastLayer(stage1)
    doc = {
        "arch": args.arch,
        "seed": args.seed,
        "command": command("batchnorm_study.py", argv),
        "point": POINTS[args.arch],
        "kl_weight": beta,
        "draws": args.draws,
        "ood_size": args.ood_size,
        "shift_size": args.shift_size,
        "bn_images": len(xt),
        "records": [],
    }
    t0 = time.perf_counter()

    def save(point: str, method, draw_seed: int) -> None:
        method = Reseeded(method, draw_seed)
        probs = method.predict((xv, yv), args.draws, draw_seed).mean
        rec = validation_record(probs, ev, method, args.draws, yv, point, draw_seed=draw_seed)
        append_record(out, stem, doc, rec, markdown)
        print(f"[{time.perf_counter() - t0:.0f} s] {point}: {json.dumps(rec)}", flush=True)

    save("deterministic network", det, args.seed)
    methods = {"the guide's own draws (frozen)": stage1}
    methods.update({mode: DrawnNetwork(ll, mode, xt) for mode in MODES})
    for point, method in methods.items():
        for draw_seed in args.draw_seeds:
            save(point, method, draw_seed)
    # the same stage 1 with BatchNorm's affine parameters Bayesian too (N(0, 1) under the
    # layer-wise prior: fan-in 1), the statistics frozen, its guide's own draws
    seed_everything(study["cfg"].seed)
    layers = (*DEFAULT_LAYER_TYPES, nn.BatchNorm2d)
    bayes_affine = stage1_mean_field(
        RunContext(cfg=study["cfg"]), study["art"].split, copy.deepcopy(det.net), layer_types=layers
    )
    for draw_seed in args.draw_seeds:
        save("affine parameters Bayesian (the guide's own draws, frozen)", bayes_affine, draw_seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
