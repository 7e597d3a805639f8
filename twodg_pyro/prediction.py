r"""Posterior predictive by Bayesian model averaging.

.. math:: p(y \mid x, \mathcal D) \approx \frac1S \sum_{s=1}^S p(y \mid f_{w^{(s)}}(x)),
    \qquad w^{(s)} \sim q(w)

Weights are drawn by the guide in chunks of ``sample_chunk`` samples at once
(:meth:`~twodg_pyro.guides.base.BNNGuide.sample_weights`) and the network runs on all
of them in one vectorised call (:func:`torch.func.vmap` over
:func:`torch.func.functional_call`), instead of one Pyro trace-and-replay per sample.
Each chunk is applied to every data batch before the next is drawn, so all examples
see the same ``S`` weight samples and memory stays bounded by one chunk.  The data are
read before the first draw with torch's random state forked (a ``DataLoader`` draws
its base seed from the global RNG): the draws depend on the random state at the call,
never on whether the data come as tensors or a loader, nor on their batching.

A model whose ``network_forward`` returns ``K`` outputs per weight sample (shape
``(K, B, ...)``, e.g. the ``M`` components of a rank-1 BNN) declares
``output_components = K``; the average then runs over all ``S K`` predictions.

A guide without ``sample_weights`` (e.g. Pyro's ``AutoNormal`` or
``AutoLowRankMultivariateNormal``) is drawn from by running its Pyro program
(:func:`program_draws`), vectorised over a chunk's samples where it allows.
Pyro's own ``Predictive(model, guide=guide, return_sites=["logits"], parallel=True)``
gives the same posterior predictive (the ``"logits"`` site holds the network's outputs).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

import pyro
import pyro.poutine as poutine
import torch
from torch.func import vmap
from tqdm.auto import tqdm

from .bnn import input_mismatch, match_input, require_model
from .guide import BNNGuide, check_guide_sites
from .likelihoods import Categorical, RegressionLikelihood

__all__ = [
    "Prediction",
    "deterministic_predict",
    "moment_sums",
    "moments_prediction",
    "predict",
    "program_draws",
]


@dataclass
class Prediction:
    r"""Predictive output.

    For regression (a :class:`~twodg_pyro.likelihoods.RegressionLikelihood`, whose draw
    :math:`s` predicts :math:`\mathcal N(\mu_s(x), \sigma_s(x)^2)`) the moments of the
    model average follow the law of total variance,

    .. math:: \bar\mu = \frac1S \sum_s \mu_s, \qquad
        \sigma^2_{\text{epi}} = \frac1S \sum_s \mu_s^2 - \bar\mu^2, \qquad
        \sigma^2_{\text{ale}} = \frac1S \sum_s \sigma_s^2, \qquad
        \sigma^2 = \sigma^2_{\text{epi}} + \sigma^2_{\text{ale}}.

    Attributes:
        mean: the model average: class probabilities ``(N, C)`` for classification, the
            predictive mean :math:`\bar\mu` (the targets' shape) for regression.
        targets: the labels or targets, when the data had them.
        samples: per-sample predictions ``(S, N, ...)`` when asked for (class
            probabilities; regression: the means :math:`\mu_s`).
        std: regression: the predictive standard deviation :math:`\sigma`, noise included.
        epistemic_std: regression: :math:`\sigma_{\text{epi}}`, the spread of the means
            over the draws (the noise left out).
        aleatoric_std: regression: :math:`\sigma_{\text{ale}}`, the noise alone.
    """

    mean: torch.Tensor
    targets: torch.Tensor | None = None
    samples: torch.Tensor | None = None
    std: torch.Tensor | None = None
    epistemic_std: torch.Tensor | None = None
    aleatoric_std: torch.Tensor | None = None


def moment_sums(likelihood, outputs: torch.Tensor) -> torch.Tensor:
    r"""Float64 sums over the draws of a regression likelihood's :math:`\mu_s`,
    :math:`\mu_s^2` and :math:`\sigma_s^2` for per-draw ``outputs`` ``(S, B, ...)``:
    ``(3, B, ...)`` (float64, so that :func:`moments_prediction`'s difference of squares
    keeps its digits)."""
    loc, scale = likelihood.loc_scale(outputs, 1)
    loc = loc.to(torch.float64)
    var = torch.as_tensor(scale, dtype=torch.float64, device=loc.device).square()
    return torch.stack([loc, loc.square(), var.expand_as(loc)]).sum(1)


def moments_prediction(
    sums: torch.Tensor, num_draws: int, dtype: torch.dtype, targets=None, samples=None
) -> Prediction:
    """The :class:`Prediction` of :func:`moment_sums` over ``num_draws`` draws, in ``dtype``."""
    mean, second, aleatoric = (sums / num_draws).unbind(0)
    epistemic = (second - mean.square()).clamp_min(0)
    return Prediction(
        mean=mean.to(dtype),
        targets=targets,
        samples=samples,
        std=(epistemic + aleatoric).sqrt().to(dtype),
        epistemic_std=epistemic.sqrt().to(dtype),
        aleatoric_std=aleatoric.sqrt().to(dtype),
    )


def _batches(data, batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """``(x, y)`` batches (``y``: ``None`` unlabelled); a ``ValueError`` when there are none."""
    if isinstance(data, torch.Tensor):
        return [(xb, None) for xb in data.split(batch_size)]
    if isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[0], torch.Tensor):
        return list(zip(data[0].split(batch_size), data[1].split(batch_size), strict=True))
    out = [(b, None) if torch.is_tensor(b) else (b[0], b[1] if len(b) > 1 else None) for b in data]
    if not out:
        raise ValueError("no data to predict on (empty data set)")
    return out


def _targets(batches: list[tuple[torch.Tensor, torch.Tensor | None]]) -> torch.Tensor | None:
    """The labels of :func:`_batches`' output on the CPU, ``None`` when a batch has none."""
    if all(yb is not None for _, yb in batches):
        return torch.cat([yb.cpu() for _, yb in batches])
    return None


def _cuda_devices(device: torch.device | str | None) -> list[int]:
    """``device``'s GPU for ``torch.random.fork_rng`` (``[]`` off CUDA)."""
    device = torch.device("cpu" if device is None else device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return []
    return [device.index if device.index is not None else torch.cuda.current_device()]


def _read_batches(data, batch_size: int, device) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """The data's batches, read with torch's random state forked, so that reading them
    never shifts the draws that follow.

    Iterating a ``DataLoader`` without a ``generator`` draws its base seed from the global
    RNG (and a shuffling sampler draws its seed there too); random transforms of the data
    set draw from it as well.  Read unforked, ``(X, y)`` tensors and a loader over the same
    examples would be predicted with different weights.
    """
    with torch.random.fork_rng(devices=_cuda_devices(device)):
        return _batches(data, batch_size)


@torch.no_grad()
def predict(
    model,
    guide,
    data: torch.Tensor | tuple | Iterable,
    num_samples: int = 30,
    batch_size: int = 512,
    sample_chunk: int = 10,
    keep_samples: bool = False,
    device: torch.device | str | None = None,
    progress: bool = False,
) -> Prediction:
    """Bayesian model average of ``model``'s likelihood over ``num_samples`` guide draws.

    Args:
        model: a :class:`~twodg_pyro.bnn.BNNModel`.
        guide: any guide with ``sample_weights(num_samples)``, or another Pyro guide
            (drawn from by running its program, :func:`program_draws`).
        data: inputs ``X``, a pair ``(X, y)``, or an iterable of ``(x, y)`` batches.
        num_samples: ``N_s`` (paper: 30).
        batch_size: examples per forward when ``data`` is a tensor or a pair.
        sample_chunk: weight samples drawn at once, and the most forward passes evaluated
            at once (a network with Bayesian convolutions runs its draws one by one:
            :func:`_run_chunked`): a model with ``output_components = K`` (rank-1)
            evaluates the draws of a chunk ``max(1, sample_chunk // K)`` at a time, so
            that a vectorised forward holds the activations of at most ``sample_chunk``
            passes, as for any other model (the draws, and so the seeded results, do not
            depend on it).
        keep_samples: also return the per-sample predictions ``(S, N, ...)`` (``(S K, N, ...)``
            for a model with ``output_components = K``, sample-major).
        device: where inputs are moved (default: the guide's device).
        progress: show a tqdm bar (``"predict"``, on stderr) over the (weight-sample
            chunk, data batch) passes, with the draws done so far.

    Raises:
        TypeError: ``model`` is not a model (e.g. a Pyro handler around one).
        ValueError: a guide built for another network (the first site that differs and
            both shapes), inputs the network cannot take (their shape and what its first
            layer takes), inputs that are not finite (how many rows, the first), no data.
    """
    require_model(model, "predict", ("sites", "network_forward", "likelihood"))
    check_guide_sites(model, guide, "predict")
    if int(num_samples) < 1:
        raise ValueError(f"num_samples (N_s) must be at least 1, got {num_samples!r}")
    if int(sample_chunk) < 1:
        raise ValueError(f"sample_chunk must be at least 1, got {sample_chunk!r}")
    num_samples, sample_chunk = int(num_samples), int(sample_chunk)
    model.eval()
    if device is None:  # where the guide lives (inputs from a CPU DataLoader are moved there)
        device = _device_of(guide) or _device_of(model)
    batches = _read_batches(data, int(batch_size), device)
    check_finite_inputs(batches)
    lik = model.likelihood
    regression = isinstance(lik, RegressionLikelihood)
    components = int(model.output_components)

    batched = vmap(model.network_forward, in_dims=(0, None), randomness="different")
    per_pass = max(1, sample_chunk // components)  # draws per vectorised forward
    if components == 1 and any("Conv" in site.layer_type for site in model.sites):
        per_pass = 0  # one draw at a time: see _run_chunked
    sums: list[torch.Tensor | None] = [None] * len(batches)
    per_sample: list[list[torch.Tensor]] = [[] for _ in batches]
    starts = range(0, num_samples, sample_chunk)  # the draws done before each chunk
    with tqdm(
        total=len(starts) * len(batches),
        desc="predict",
        unit="batch",
        disable=not progress,
        leave=False,
    ) as bar:
        for done in starts:
            s = min(sample_chunk, num_samples - done)
            if isinstance(guide, BNNGuide):
                weights = guide.sample_weights(s)
            else:
                x0 = batches[0][0]
                weights = program_draws(model, guide, s, x0 if device is None else x0.to(device))
            for i, (xb, _) in enumerate(batches):
                xb = xb.to(device) if device is not None else xb
                outputs = _run_chunked(model, batched, weights, xb, per_pass)
                if components > 1:
                    outputs = outputs.flatten(0, 1)
                out_dtype = outputs.dtype
                if regression:
                    total, preds = moment_sums(lik, outputs), lik.loc_scale(outputs, 1)[0]
                else:
                    preds = outputs.softmax(-1) if isinstance(lik, Categorical) else outputs
                    total = preds.sum(0)
                sums[i] = total if sums[i] is None else sums[i] + total
                if keep_samples:
                    per_sample[i].append(preds.cpu())
                bar.set_postfix_str(
                    f"draws {done + s}/{num_samples}, batches {len(batches)}", False
                )
                bar.update(1)
    samples = torch.cat([torch.cat(c, 0) for c in per_sample], 1) if keep_samples else None
    draws, targets = num_samples * components, _targets(batches)
    if regression:
        sums_all = torch.cat([t.cpu() for t in sums], 1)
        return moments_prediction(sums_all, draws, out_dtype, targets, samples)
    mean = torch.cat([(t / draws).cpu() for t in sums])
    return Prediction(mean=mean, targets=targets, samples=samples)


def check_finite_inputs(batches: list[tuple[torch.Tensor, torch.Tensor | None]]) -> None:
    """Raise ``ValueError`` naming how many input rows (examples) hold a NaN or an
    infinity, of how many, and the first one's index (over all batches, in order)."""
    bad, first, total = 0, None, 0
    for xb, _ in batches:
        if (xb.is_floating_point() or xb.is_complex()) and xb.dim() > 0:
            rows = ~torch.isfinite(xb).reshape(xb.shape[0], -1).all(1)
            n = int(rows.sum())
            if n and first is None:
                first = total + int(rows.nonzero()[0, 0])
            bad += n
        total += int(xb.shape[0]) if xb.dim() > 0 else 1
    if bad:
        raise ValueError(
            f"{bad} of {total} input rows hold values that are not finite (NaN or inf); "
            f"the first is row {first}"
        )


def _run_chunked(
    model, batched, weights: dict[str, torch.Tensor], x: torch.Tensor, per_pass: int
) -> torch.Tensor:
    """The network on a chunk of draws, ``per_pass`` draws per vectorised forward:
    ``(s, B, ...)``, or ``(s, K, B, ...)`` for a model with ``K`` output components.

    ``per_pass = 0``: one plain forward per draw.  A network with Bayesian convolutions
    runs so: vectorised over draws, a convolution whose weights differ per draw becomes
    one grouped convolution; on a ResNet-20 on the CPU 30 draws took 2.3x the time of 30
    deterministic forwards so and 0.97x one by one (LeNet-5: 1.26x and 1.04x; sampling
    the weights is 1-6 % of it; ``benchmarks/results/bench_predict_draws.md``)."""
    s = next(iter(weights.values())).shape[0]
    if per_pass == 0:
        run = getattr(model, "run_network", model.network_forward)
        return torch.stack([run({k: v[i] for k, v in weights.items()}, x) for i in range(s)])
    if s <= per_pass:
        return _run(model, batched, weights, x)
    parts = [
        _run(model, batched, {k: v[i : i + per_pass] for k, v in weights.items()}, x)
        for i in range(0, s, per_pass)
    ]
    return torch.cat(parts, 0)


def _run(model, batched, weights: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """The network on a chunk of draws (``batched``, vectorised); an input it cannot take
    raises ``ValueError`` naming the input's shape and what the first layer takes."""
    try:
        return batched(weights, x)
    except RuntimeError as e:
        if isinstance(e, torch.OutOfMemoryError):
            raise
        try:  # one draw, unvectorised: is it the input?
            model.network_forward({k: v[0] for k, v in weights.items()}, x)
        except RuntimeError as one:
            if isinstance(one, torch.OutOfMemoryError):
                raise
            raise input_mismatch(getattr(model, "net", model), x, one) from e
        raise


def program_draws(model, guide, num_samples: int, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """``num_samples`` draws of the model's sites from a guide's Pyro program:
    ``{site: (num_samples, *site.shape)}``.

    The program runs once in a plate of ``num_samples`` entries (Pyro's autoguides and this
    library's guides draw one value per entry); a guide whose draws do not come out so is
    run once per sample.  ``x`` is handed to the program (an autoguide that has not run
    yet traces the model on it).

    Raises:
        ValueError: the guide draws no value for one of the model's sites.
    """
    sites = list(model.sites)
    with poutine.block():
        with pyro.plate("_predict_draws", int(num_samples), dim=-1):
            trace = poutine.trace(guide).get_trace(x)
    draws = {}
    for site in sites:
        node = trace.nodes.get(site.name)
        if node is None:
            raise ValueError(
                f"the guide {type(guide).__name__} draws no value for the model's site "
                f"{site.name!r}"
            )
        value = node["value"]
        core = tuple(value.shape[max(value.dim() - len(site.shape), 0) :])
        if core != tuple(site.shape):
            raise ValueError(
                f"the guide {type(guide).__name__}'s site {site.name!r} has shape {core}, the "
                f"model's {tuple(site.shape)}: the guide was built for another network"
            )
        draws[site.name] = value
    if all(tuple(draws[s.name].shape) == (num_samples, *s.shape) for s in sites):
        return draws
    with poutine.block():
        runs = [poutine.trace(guide).get_trace(x).nodes for _ in range(int(num_samples))]
    return {
        site.name: torch.stack([run[site.name]["value"] for run in runs]).reshape(
            num_samples, *site.shape
        )
        for site in sites
    }


def _device_of(module) -> torch.device | None:
    """The device of a module's first parameter or buffer (``None`` if it has neither)."""
    return getattr(_first_tensor(module), "device", None)


def _first_tensor(module) -> torch.Tensor | None:
    """A module's first parameter, else its first buffer (``None`` if it has neither)."""
    tensors = (getattr(module, kind, tuple)() for kind in ("parameters", "buffers"))
    return next(itertools.chain.from_iterable(tensors), None)


@torch.no_grad()
def deterministic_predict(
    net: torch.nn.Module, data, batch_size: int = 512, likelihood=None
) -> Prediction:
    """Predictions of a plain network (the deterministic baseline): softmax probabilities,
    or with a :class:`~twodg_pyro.likelihoods.RegressionLikelihood` its ``loc`` as the mean
    and its ``scale`` as the (aleatoric) standard deviation, the epistemic one 0.  Inputs
    go to the network's device and, if floating, its dtype."""
    net.eval()
    batches = _batches(data, int(batch_size))
    like = _first_tensor(net)
    outs = torch.cat([net(xb if like is None else match_input(xb, like)) for xb, _ in batches])
    if isinstance(likelihood, RegressionLikelihood):
        sums = moment_sums(likelihood, outs.unsqueeze(0))
        return moments_prediction(sums.cpu(), 1, outs.dtype, _targets(batches))
    return Prediction(mean=outs.softmax(-1).cpu(), targets=_targets(batches))
