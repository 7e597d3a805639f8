"""Posterior draws at the cost of forward passes (issue 47, item 4): ``predict`` with 30
mean-field draws against 30 forward passes of the deterministic network, on ResNet-20 and
LeNet-5 (MNIST-sized inputs), and the draws vectorised by ``torch.func.vmap`` (``predict``'s
path for networks with Bayesian convolutions before issue 47), side by side (interleaved).

Why vmap loses on convolutions: vectorised over draws, a convolution whose weights differ
per draw becomes one grouped convolution, which the CPU's kernels run more slowly than the
same convolutions one by one; sampling the weights costs under 1 % of a forward pass.

The 2DG guide (representative tying) is built by stage 2 from the mean-field guide
(K = 64, quantile outliers): its draws pick every ellipse weight's component and draw
every weight from its component.

The weights' sampling alone (``sample_weights``, all the draws at once) is timed too: what a
draw adds to a forward pass, which a loaded machine's noise on the ratios above hides.

A last-layer Laplace approximation with the GP residual (the recommended ResNet-20 row's
head; fitted on random images: its timing, not its fit, is measured) predicts from one
pass of the network, since its draws change the last layer only; before, each chunk of
10 draws ran the network twice (the mean and a Jacobian-vector product) and the residual
once more for its features: that path is timed beside it.

Target: 2DG / mean-field prediction time <= 1.3x the same number of deterministic forward
passes.  Run: python benchmarks/bench_predict_draws.py [--threads 1] [--images 200]
"""

from __future__ import annotations

import argparse

import torch
from _common import interleaved, record
from torch.func import vmap

from twodg_pyro.bnn import BNNModel
from twodg_pyro.data import make_loader
from twodg_pyro.guides import MeanFieldGuide, SharedGMMGuide
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.methods import fit_laplace
from twodg_pyro.methods.feature_residual import last_layer_module, layer_inputs
from twodg_pyro.models import build_network
from twodg_pyro.prediction import predict
from twodg_pyro.sharing import SharingConfig, build_sharing

DRAWS = 30


def contenders(arch: str, images: int) -> dict:
    torch.manual_seed(0)
    net = build_network(arch, num_classes=10, in_channels=1).eval()
    model = BNNModel(net, likelihood=Categorical(1000)).eval()
    guide = MeanFieldGuide(model, init_scale=1e-3)
    x = torch.randn(images, 1, 28, 28)
    data = [(x[:64], torch.randint(0, 10, (64,)))]
    sharing = SharingConfig(outlier_rule="quantile", mu_quantile=0.997, n_components=64)
    structure, _ = build_sharing(model, guide, data, sharing)
    shared = SharedGMMGuide(model, structure)
    batched = vmap(model.network_forward, in_dims=(0, None), randomness="different")

    @torch.no_grad()
    def deterministic():
        for _ in range(DRAWS):
            net(x).softmax(-1)

    @torch.no_grad()
    def vectorised():
        for _ in range(DRAWS // 10):
            batched(guide.sample_weights(10), x).softmax(-1)

    labels = torch.randint(0, 10, (256,))
    train = torch.utils.data.TensorDataset(torch.randn(256, 1, 28, 28), labels)
    head_net = build_network(arch, num_classes=10, in_channels=1).eval()
    post = fit_laplace(head_net, make_loader(train, 64), residual="gp", marglik_steps=5)
    last = last_layer_module(post.net, post.param_names)

    def laplace_before():  # the network per chunk of 10 draws, the features once more
        draws = post.sample_params(DRAWS, 0)
        logits = torch.cat([post._logits(d, x) for d in draws.split(10)])
        sd = post.residual.logit_std(layer_inputs(post.net, last, [x]))
        (logits + sd.reshape(1, -1, 1)).softmax(-1)

    return {
        f"{DRAWS} deterministic forwards": deterministic,
        f"predict, {DRAWS} last-layer Laplace draws + GP residual": lambda: post.sample_probs(
            x, DRAWS, 0
        ),
        f"{DRAWS} last-layer Laplace draws + GP residual, network per chunk (before)": (
            laplace_before
        ),
        f"predict, {DRAWS} mean-field draws": lambda: predict(model, guide, x, DRAWS),
        f"predict, {DRAWS} 2DG draws": lambda: predict(model, shared, x, DRAWS),
        f"{DRAWS} draws, vmap (before)": vectorised,
        # what a draw adds to a forward pass: the weights' sampling alone
        f"sampling {DRAWS} mean-field draws": lambda: guide.sample_weights(DRAWS),
        f"sampling {DRAWS} 2DG draws": lambda: shared.sample_weights(DRAWS),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--images", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for arch in ("resnet20", "lenet5"):
        times = interleaved(contenders(arch, args.images), repeats=args.repeats, inner=1, warmup=1)
        base = next(iter(times.values()))
        rows += [{"network": arch, "what": k, "s": v, "ratio": v / base} for k, v in times.items()]
    lines = [
        "# Prediction time over the same number of deterministic forward passes",
        "",
        f"`python benchmarks/bench_predict_draws.py --threads {args.threads} --images "
        f"{args.images} --repeats {args.repeats}`; medians of interleaved rounds.",
        "",
        "| network | what | s | / deterministic |",
        "|---|---|---|---|",
    ]
    lines += [f"| {r['network']} | {r['what']} | {r['s']:.3f} | {r['ratio']:.2f}x |" for r in rows]
    record("bench_predict_draws", {"rows": rows}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
