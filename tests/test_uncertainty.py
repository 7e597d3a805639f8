"""twodg_pyro.uncertainty: scores, OOD metrics, selective prediction, OOD sets,
corruptions, the report and its figures; and seeded draws that do not depend on how the
data arrive (tensors or a DataLoader)."""

from __future__ import annotations

import math
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from twodg_pyro.baselines import train_deterministic
from twodg_pyro.bnn import BNNModel
from twodg_pyro.data import DatasetNotFoundError, load_digits_split, make_loader
from twodg_pyro.data.transforms import MNIST_MEAN, MNIST_STD
from twodg_pyro.evaluation import seeded_predict
from twodg_pyro.guides import MeanFieldGuide, Rank1Guide, SSVIGuide
from twodg_pyro.guides.rank1 import Rank1BNNModel
from twodg_pyro.infer import fit
from twodg_pyro.likelihoods import Categorical
from twodg_pyro.models import MLP
from twodg_pyro.uncertainty import (
    BUILTIN_OOD_SETS,
    CORRUPTIONS,
    SEVERITIES,
    aurc,
    builtin_ood_sets,
    corrupt,
    evaluate_uncertainty,
    evaluate_uncertainty_net,
    expected_entropy,
    folder_ood_set,
    fpr_at_tpr,
    load_cifar10c,
    max_prob_score,
    mutual_information,
    ood_metrics,
    optimal_aurc,
    plot_score_histograms,
    plot_shift,
    predictive_entropy,
    risk_coverage_curve,
    selective_metrics,
    uncertainty_scores,
)
from twodg_pyro.uncertainty._pixels import to_pixels
from twodg_pyro.uncertainty.ood_sets import resize_images

LOG2 = math.log(2.0)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def mnist_like():
    """200 of the digits upsampled to 28x28, normalised with MNIST's statistics."""
    u = torch.from_numpy(load_digits().images[:200].astype(np.float32) / 16.0).unsqueeze(1)
    u = F.interpolate(u, size=(28, 28), mode="bilinear", align_corners=False).clamp(0, 1)
    return (u - MNIST_MEAN[0]) / MNIST_STD[0], u


# ------------------------------------------------------------------------------ scores
def test_mi_of_identical_draws_is_zero_and_of_disagreeing_one_hot_draws_is_log2():
    p = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    same = p.expand(5, 2, 3)
    torch.testing.assert_close(mutual_information(same), torch.zeros(2), atol=1e-7, rtol=0)
    torch.testing.assert_close(expected_entropy(same), predictive_entropy(p))
    # two draws, each certain, of different classes: H[mean] = log 2, E H = 0
    a = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])  # (S=2, N=1, C=2)
    assert mutual_information(a).item() == pytest.approx(LOG2, abs=1e-6)
    assert predictive_entropy(a).item() == pytest.approx(LOG2, abs=1e-6)
    assert expected_entropy(a).item() == pytest.approx(0.0, abs=1e-9)
    assert max_prob_score(a).item() == pytest.approx(0.5)
    # a deterministic network: (N, C) alone or S = 1 has MI exactly 0
    assert torch.equal(mutual_information(p), torch.zeros(2))
    assert torch.equal(uncertainty_scores(p[None])["mi"], torch.zeros(2))
    # uniform: entropy log C, 1 - max p = 1 - 1/C
    u = torch.full((1, 4), 0.25)
    assert predictive_entropy(u).item() == pytest.approx(math.log(4), abs=1e-6)
    assert max_prob_score(u).item() == pytest.approx(0.75)
    scores = uncertainty_scores(torch.stack([p, p.flip(-1)]))
    torch.testing.assert_close(scores["entropy"] - scores["expected_entropy"], scores["mi"])
    assert (scores["mi"] > 0).all()


@pytest.mark.parametrize(
    "bad, match",
    [
        (torch.ones(3), "shape"),
        (torch.empty(2, 0, 3), "empty"),
        (torch.tensor([[0.5, float("nan")]]), "NaN"),
        (torch.tensor([[1.5, -0.5]]), r"\[0, 1\]"),
    ],
)
def test_scores_reject_bad_probabilities(bad, match):
    with pytest.raises(ValueError, match=match):
        predictive_entropy(bad)


# ------------------------------------------------------------------------------- OOD
# The hand case (OOD positive, higher score = more OOD):
#   in  = [1, 2, 3, 4, 5]                       (5 negatives)
#   out = [0.5, 3.5, 6, 7, 8, 9, 10, 11, 12, 13] (10 positives)
# AUROC = P(out > in): 0.5 beats none, 3.5 beats 3 (1, 2, 3), the other eight beat all
#   five: (0 + 3 + 8*5) / (5*10) = 43/50 = 0.86.
# AUPR (average precision): in decreasing order 13..6 are eight positives (precision 1),
#   then 5, 4 (in), 3.5 (out: 9 positives of 11 -> 9/11), 3, 2, 1 (in), 0.5 (out: 10/15):
#   (8*1 + 9/11 + 10/15) / 10 = 313/330.
# FPR at TPR >= 95 %: all ten positives, so the threshold is 0.5 and every in-
#   distribution example is flagged: FPR = 1.  At TPR >= 85 % nine suffice: threshold
#   3.5 flags 4 and 5 of the in-distribution scores: FPR = 2/5.
HAND_IN = [1.0, 2.0, 3.0, 4.0, 5.0]
HAND_OUT = [0.5, 3.5, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0]


def test_ood_metrics_on_the_hand_case():
    m = ood_metrics(HAND_IN, HAND_OUT)
    assert m["auroc"] == pytest.approx(43 / 50)
    assert m["aupr"] == pytest.approx(313 / 330)
    assert m["fpr95"] == pytest.approx(1.0)
    # the paper's script computes its "FPR95" at 85 % TPR: another number
    assert fpr_at_tpr(HAND_IN, HAND_OUT, 0.85) == pytest.approx(2 / 5)
    assert fpr_at_tpr(HAND_IN, HAND_OUT, 0.85) != m["fpr95"]
    # tensors work the same; perfect separation; and swapping the roles flips the AUROC
    assert ood_metrics(torch.tensor(HAND_IN), torch.tensor(HAND_OUT)) == m
    assert ood_metrics([0.0, 0.1], [0.9, 1.0]) == {"auroc": 1.0, "aupr": 1.0, "fpr95": 0.0}
    assert ood_metrics(HAND_OUT, HAND_IN)["auroc"] == pytest.approx(1 - 43 / 50)


@pytest.mark.parametrize(
    "scores_in, scores_out, match",
    [
        ([], [1.0], "scores_in is empty"),
        ([1.0], [], "scores_out is empty"),
        ([1.0, float("nan")], [1.0], "scores_in holds 1 NaN"),
        ([1.0], [float("inf")], "scores_out holds 1 NaN or infinite"),
        ([[1.0, 2.0]], [1.0], r"scores_in must be a 1-D .* shape \(1, 2\)"),
    ],
)
def test_ood_metrics_reject_bad_scores(scores_in, scores_out, match):
    with pytest.raises(ValueError, match=match):
        ood_metrics(scores_in, scores_out)
    with pytest.raises(ValueError, match="tpr must be in"):
        fpr_at_tpr([1.0], [2.0], 1.5)


# ------------------------------------------------------------------------- selective
def test_risk_coverage_and_aurc_on_a_hand_case():
    # confidences 0.9 0.8 0.7 0.6 with correct, wrong, correct, wrong:
    # risks 0/1, 1/2, 1/3, 2/4 -> AURC = (0 + 1/2 + 1/3 + 1/2) / 4 = 1/3;
    # best order (both correct first): 0, 0, 1/3, 1/2 -> 5/24; E-AURC = 1/3 - 5/24 = 1/8
    coverage, risk = risk_coverage_curve([0.6, 0.9, 0.7, 0.8], [False, True, True, False])
    np.testing.assert_allclose(coverage, [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(risk, [0.0, 0.5, 1 / 3, 0.5])
    assert aurc([0.9, 0.8, 0.7, 0.6], [1, 0, 1, 0]) == pytest.approx(1 / 3)
    assert optimal_aurc([1, 0, 1, 0]) == pytest.approx(5 / 24)
    probs = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3], [0.4, 0.6]])
    labels = torch.tensor([0, 0, 0, 0])  # predictions 0, 1, 0, 1: correct, wrong, ...
    m = selective_metrics(probs, labels)
    assert m["aurc"] == pytest.approx(1 / 3)
    assert m["aurc_optimal"] == pytest.approx(5 / 24)
    assert m["eaurc"] == pytest.approx(1 / 8)
    with pytest.raises(ValueError, match="one entry per confidence"):
        aurc([0.9, 0.8], [1])


# -------------------------------------------------------------------------- OOD sets
def test_builtin_ood_sets_have_the_test_shape_dtype_and_normalisation(mnist_like):
    x, u = mnist_like
    sets = builtin_ood_sets(x, MNIST_MEAN, MNIST_STD, seed=0)
    assert (
        set(sets)
        == set(BUILTIN_OOD_SETS)
        >= {
            "rotated90",
            "uniform_noise",
            "digits_upsampled",
            "inverted",
            "vflip",
        }
    )
    for name, xo in sets.items():
        assert xo.shape == x.shape and xo.dtype == x.dtype, name
        assert torch.isfinite(xo).all(), name
    back = {k: to_pixels(v, MNIST_MEAN, MNIST_STD) for k, v in sets.items()}
    torch.testing.assert_close(back["rotated90"], torch.rot90(u, 1, dims=(-2, -1)))
    torch.testing.assert_close(back["vflip"], u.flip(-2))
    torch.testing.assert_close(back["inverted"], 1 - u, atol=1e-6, rtol=0)
    # uniform noise with the in-distribution pixel mean and std (normalised: 0 and 1)
    noise = back["uniform_noise"]
    assert noise.mean().item() == pytest.approx(MNIST_MEAN[0], abs=0.005)
    assert noise.std().item() == pytest.approx(MNIST_STD[0], abs=0.005)
    assert sets["uniform_noise"].abs().max() <= math.sqrt(3) + 1e-5
    # the digits: 0..16 -> [0, 1], bilinear to 28 x 28, MNIST-normalised
    digits = back["digits_upsampled"]
    assert digits.min() >= -1e-6 and digits.max() <= 1 + 1e-6
    all_digits = torch.from_numpy(load_digits().images.astype(np.float32) / 16).unsqueeze(1)
    up = F.interpolate(all_digits, size=(28, 28), mode="bilinear", align_corners=False)
    dist = (digits[:5, None] - up[None]).flatten(2).abs().amax(-1).min(1).values
    assert (dist < 1e-5).all()  # each image is one of the upsampled digits
    assert 0 <= back["gaussian_blobs"].min() and back["gaussian_blobs"].max() <= 1 + 1e-6
    # seeded: same seed, same sets; another seed, other noise
    again = builtin_ood_sets(x, MNIST_MEAN, MNIST_STD, seed=0, names=["uniform_noise"])
    assert torch.equal(again["uniform_noise"], sets["uniform_noise"])
    other = builtin_ood_sets(x, MNIST_MEAN, MNIST_STD, seed=1, names=["uniform_noise"])
    assert not torch.equal(other["uniform_noise"], sets["uniform_noise"])
    with pytest.raises(ValueError, match="unknown OOD set"):
        builtin_ood_sets(x, names=["svhn"])


def test_ood_sets_of_flat_per_feature_standardised_digits():
    d = load_digits_split(seed=0)
    x = d.test.tensors[0]
    mean, std = d.info["mean"], d.info["std"]
    sets = builtin_ood_sets(x, mean, std, seed=0, image_shape=(1, 8, 8), names=["uniform_noise"])
    xo = sets["uniform_noise"]
    assert xo.shape == x.shape == (359, 64)
    # per feature: uniform on (-sqrt 3, sqrt 3) once normalised
    assert xo.mean().item() == pytest.approx(0.0, abs=0.03)
    assert xo.std().item() == pytest.approx(1.0, abs=0.03)
    flipped = builtin_ood_sets(x, mean, std, image_shape=(1, 8, 8), names=["vflip"])["vflip"]
    pix = (flipped * std + mean).view(-1, 1, 8, 8)
    torch.testing.assert_close(pix, (x * std + mean).view(-1, 1, 8, 8).flip(-2))
    with pytest.raises(ValueError, match="image_shape"):
        builtin_ood_sets(x, mean, std, names=["vflip"])


def _write_idx(path: Path, images: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    head = struct.pack(">I", 0x0803) + struct.pack(">3I", *images.shape)
    path.write_bytes(head + images.astype(np.uint8).tobytes())


def test_folder_ood_sets_read_convert_and_report_missing_files(tmp_path):
    with pytest.raises(DatasetNotFoundError) as err:
        folder_ood_set("fashion_mnist", tmp_path)
    msg = str(err.value)
    assert "FashionMNIST/raw/t10k-images-idx3-ubyte" in msg and str(tmp_path) in msg
    with pytest.raises(DatasetNotFoundError, match="cifar-100-python/test"):
        folder_ood_set("CIFAR-100", tmp_path)
    with pytest.raises(ValueError, match="unknown OOD data set"):
        folder_ood_set("imagenet-o", tmp_path)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(7, 28, 28))
    _write_idx(tmp_path / "FashionMNIST" / "raw" / "t10k-images-idx3-ubyte", images)
    x = folder_ood_set("fashion_mnist", tmp_path)
    assert x.shape == (7, 1, 28, 28) and x.dtype == torch.float32
    expected = (torch.from_numpy(images).float() / 255 - MNIST_MEAN[0]) / MNIST_STD[0]
    torch.testing.assert_close(x[:, 0], expected)
    assert folder_ood_set("fashion_mnist", tmp_path, max_examples=3).shape[0] == 3
    assert folder_ood_set("fashion_mnist", tmp_path, (3, 32, 32), (0.5,) * 3, (0.25,) * 3).shape[
        1:
    ] == (3, 32, 32)
    # CIFAR-100 (colour, 32 px) to MNIST's grey 28 px: luma, then an antialiased resize
    data = rng.integers(0, 256, size=(4, 3072), dtype=np.uint8)
    (tmp_path / "cifar-100-python").mkdir()
    with open(tmp_path / "cifar-100-python" / "test", "wb") as f:
        pickle.dump({"data": data, "fine_labels": [0, 1, 2, 99]}, f)
    xc = folder_ood_set("cifar100", tmp_path, flatten=True)
    assert xc.shape == (4, 784)
    grey = resize_images(torch.from_numpy(data.reshape(4, 3, 32, 32)).float() / 255, (1, 28, 28))
    torch.testing.assert_close(xc, ((grey - MNIST_MEAN[0]) / MNIST_STD[0]).flatten(1))


# ----------------------------------------------------------------------- corruptions
@pytest.mark.parametrize("family", list(CORRUPTIONS))
def test_each_corruption_moves_further_with_the_severity_and_is_seeded(family, mnist_like):
    x, _ = mnist_like
    state = torch.get_rng_state()
    dist = []
    for s in SEVERITIES:
        xc = corrupt(x, family, s, MNIST_MEAN, MNIST_STD, seed=3)
        assert xc.shape == x.shape and xc.dtype == x.dtype
        pix = to_pixels(xc, MNIST_MEAN, MNIST_STD)
        assert pix.min() >= -1e-5 and pix.max() <= 1 + 1e-5  # clamped to the pixel range
        dist.append((xc - x).flatten(1).norm(dim=1).mean().item())
    assert all(b > a for a, b in zip(dist, dist[1:], strict=False)), dist
    assert dist[0] > 0
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is not used
    assert torch.equal(corrupt(x, family, 4, seed=3), corrupt(x, family, 4, seed=3))
    if family in ("gaussian_noise", "impulse_noise", "rotation", "translation"):
        assert not torch.equal(corrupt(x, family, 4, seed=3), corrupt(x, family, 4, seed=4))


def test_corruption_errors_and_the_cifar10c_loader(tmp_path, mnist_like):
    x, _ = mnist_like
    with pytest.raises(ValueError, match="unknown corruption 'fog'"):
        corrupt(x, "fog", 1)
    with pytest.raises(ValueError, match="severity must be one of"):
        corrupt(x, "rotation", 6)
    with pytest.raises(DatasetNotFoundError, match="labels.npy"):
        load_cifar10c(tmp_path, "fog", 1)
    images = np.random.default_rng(0).integers(0, 256, (10, 32, 32, 3), dtype=np.uint8)
    np.save(tmp_path / "fog.npy", images)
    np.save(tmp_path / "labels.npy", np.arange(10) % 10)
    xs, ys = load_cifar10c(tmp_path, "fog", 3, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    assert xs.shape == (2, 3, 32, 32) and ys.tolist() == [4, 5]
    torch.testing.assert_close(xs, torch.from_numpy(images[4:6]).permute(0, 3, 1, 2) / 255.0)


# ------------------------------------------------------------- the report, end to end
REPORT_KEYS = {"mean_mi_clean", "ood", "shift", "aurc", "clean", "num_draws", "eaurc"}
OOD_KEYS = {"entropy_auroc", "maxprob_auroc", "aupr", "fpr95"}


def test_report_of_a_deterministic_mlp_and_of_a_bnn_on_the_digits(tmp_path):
    d = load_digits_split(seed=0)
    x, y = d.test.tensors
    mean, std = d.info["mean"], d.info["std"]
    sets = builtin_ood_sets(
        x, mean, std, seed=0, image_shape=(1, 8, 8), names=["uniform_noise", "inverted"]
    )
    torch.manual_seed(0)
    net = MLP(64, (32,), 10)
    train_deterministic(net, make_loader(d.train, 64, shuffle=True), 15, 1e-2, progress=False)
    families = ["gaussian_noise", "rotation"]
    det = evaluate_uncertainty_net(
        net,
        x,
        y,
        ood_sets=sets,
        corruptions=families,
        pixel_mean=mean,
        pixel_std=std,
        image_shape=(1, 8, 8),
        chunk_size=100,  # several chunks
        return_scores=True,
    )
    assert REPORT_KEYS <= set(det)
    assert det["num_draws"] == 1 and det["mean_mi_clean"] == 0.0
    assert det["clean"]["accuracy"] > 0.85
    assert set(det["ood"]) == {"uniform_noise", "inverted"}
    for entry in det["ood"].values():
        assert set(entry) == OOD_KEYS  # no mi_auroc for a deterministic network
    assert det["ood"]["uniform_noise"]["entropy_auroc"] > 0.5
    assert set(det["shift"]) == set(families)
    for family in families:
        assert set(det["shift"][family]) == {"1", "2", "3", "4", "5"}
        assert set(det["shift"][family]["1"]) == {"accuracy", "nll", "ece"}
    noisy = det["shift"]["gaussian_noise"]
    assert noisy["5"]["accuracy"] < det["clean"]["accuracy"]
    assert 0 <= det["aurc"] < 0.1 and det["eaurc"] >= 0
    assert len(det["scores"]["clean"]["entropy"]) == len(y)
    # chunking does not change the numbers
    whole = evaluate_uncertainty_net(
        net, x, y, ood_sets=sets, corruptions=(), pixel_mean=mean, pixel_std=std
    )
    assert "scores" not in whole and set(whole["ood"]) == set(det["ood"])
    for name, entry in whole["ood"].items():
        assert entry == pytest.approx(det["ood"][name])

    # a small mean-field BNN: MI > 0 and an MI AUROC per OOD set
    torch.manual_seed(0)
    model = BNNModel(MLP(64, (32,), 10), prior=1.0, likelihood=Categorical(len(d.train)))
    guide = MeanFieldGuide(model, seed=0)
    fit(model, guide, make_loader(d.train, 128, shuffle=True), 25, 2e-2, progress=False)
    bnn = evaluate_uncertainty(
        model,
        guide,
        x,
        y,
        num_samples=8,
        seed=0,
        ood_sets=sets,
        corruptions=["contrast"],
        severities=(1, 5),
        pixel_mean=mean,
        pixel_std=std,
        image_shape=(1, 8, 8),
        chunk_size=200,
        return_scores=True,
    )
    assert REPORT_KEYS | {"draws"} <= set(bnn)
    assert bnn["num_draws"] == 8 and bnn["mean_mi_clean"] > 0
    for entry in bnn["ood"].values():
        assert set(entry) == OOD_KEYS | {"mi_auroc"}
        assert all(0 <= v <= 1 for v in entry.values())
    assert set(bnn["shift"]["contrast"]) == {"1", "5"}
    assert bnn["ood"]["uniform_noise"]["mi_auroc"] > 0.5

    # the figures
    hist = plot_score_histograms(bnn, tmp_path / "hist.png", score="mi")
    shift = plot_shift([det, bnn], tmp_path / "shift.png", "nll", labels=["MLP", "BNN"])
    for path in (hist, shift):
        assert path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="return_scores=True"):
        plot_score_histograms(whole, tmp_path / "none.png")


def test_report_rejects_mismatched_sets_and_predictions():
    from twodg_pyro.uncertainty import uncertainty_report

    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))

    def uniform(xb):
        return torch.full((2, xb.shape[0], 3), 1 / 3)

    with pytest.raises(ValueError, match="OOD set 'wide' has inputs of shape"):
        uncertainty_report(uniform, (x, y), {"wide": torch.randn(3, 5)}, None, bayesian=True)
    with pytest.raises(ValueError, match="predictions for"):
        uncertainty_report(lambda xb: torch.full((1, 2, 3), 1 / 3), (x, y), {}, (), bayesian=False)
    record = uncertainty_report(uniform, (x, y), {"n": torch.randn(3, 4)}, (), bayesian=True)
    assert record["mean_mi_clean"] == 0.0 and record["ood"]["n"]["entropy_auroc"] == 0.5


# ------------------------------------------ draws that do not depend on how data arrive
def _guides():
    torch.manual_seed(0)
    mf_model = BNNModel(MLP(64, (16,), 10), likelihood=Categorical(100))
    ssvi_model = BNNModel(MLP(64, (16,), 10), likelihood=Categorical(100))
    r1_model = Rank1BNNModel(MLP(64, (16,), 10), likelihood=100, components=2)
    return {
        "mean_field": (mf_model, MeanFieldGuide(mf_model, seed=0)),
        "ssvi": (ssvi_model, SSVIGuide(ssvi_model, density=0.5)),
        "rank1": (r1_model, Rank1Guide(r1_model, init_scale=0.3, seed=0)),
    }


@pytest.mark.parametrize("name", ["mean_field", "ssvi", "rank1"])
def test_seeded_predict_on_tensors_and_on_a_loader_gives_the_same_draws(name):
    model, guide = _guides()[name]
    d = load_digits_split(seed=0)
    x, y = d.test.tensors
    idx = torch.arange(len(y))
    ref = seeded_predict(model, guide, (x, y), 10, seed=3, batch_size=64, keep_samples=True)
    # a plain DataLoader draws its base seed from the global RNG when iterated
    plain = seeded_predict(model, guide, DataLoader(d.test, batch_size=64), 10, seed=3)
    assert torch.equal(plain.mean, ref.mean)
    assert torch.equal(plain.targets, y)
    # a shuffling loader (its sampler draws from the global RNG too), other batches:
    # the same per-example predictions, in the loader's order
    shuffled = DataLoader(TensorDataset(x, idx), batch_size=50, shuffle=True)
    pred = seeded_predict(model, guide, shuffled, 10, seed=3)
    assert not torch.equal(pred.targets, idx)
    torch.testing.assert_close(pred.mean, ref.mean[pred.targets], atol=1e-6, rtol=1e-5)
    # the weights the seed fixes do not depend on the global state before the call either
    torch.manual_seed(123)
    other = seeded_predict(model, guide, make_loader(d.test, 64), 10, seed=3)
    assert torch.equal(other.mean, ref.mean)
    # and predict itself leaves the caller's stream as the draws alone would
    from twodg_pyro.prediction import predict

    torch.manual_seed(5)
    a = predict(model, guide, (x, y), 10, batch_size=64).mean
    after_tensors = torch.rand(3)
    torch.manual_seed(5)
    b = predict(model, guide, DataLoader(d.test, batch_size=64), 10).mean
    assert torch.equal(a, b) and torch.equal(torch.rand(3), after_tensors)


def test_the_uncertainty_package_sits_below_the_pipeline():
    from test_architecture import import_graph

    graph = import_graph()
    mine = {m: deps for m, deps in graph.items() if m.startswith("twodg_pyro.uncertainty")}
    assert len(mine) >= 8  # the facade and its modules were read
    upward = {
        (m, d)
        for m, deps in mine.items()
        for d in deps
        if d.startswith("twodg_pyro.pipeline") or d in ("twodg_pyro.cli", "twodg_pyro.cli_parser")
    }
    assert not upward, upward
