"""Tests for the network architectures in ``twodg_pyro.models``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import twodg_pyro.models as M
from twodg_pyro.models import build_network


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.fixture(autouse=True)
def _no_downloads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to fetch pretrained weights fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a network tried to download weights")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", refuse)
    monkeypatch.setattr(torch.hub, "download_url_to_file", refuse)


# --------------------------------------------------------------------------- MLP
@pytest.mark.parametrize(
    ("kwargs", "x_shape", "n_out"),
    [
        ({"in_features": 64}, (5, 64), 10),
        ({"in_features": 64, "hidden": (), "num_classes": 3}, (5, 64), 3),
        ({"in_features": 784, "hidden": (32, 16), "activation": "tanh"}, (4, 1, 28, 28), 10),
    ],
)
def test_mlp_shapes(kwargs: dict, x_shape: tuple[int, ...], n_out: int) -> None:
    net = M.MLP(**kwargs)
    out = net(torch.randn(x_shape))
    assert out.shape == (x_shape[0], n_out)
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == len(kwargs.get("hidden", (128,))) + 1


def test_mlp_parameter_count_and_activation() -> None:
    net = M.MLP(64, hidden=(128,), num_classes=10)
    assert n_params(net) == 64 * 128 + 128 + 128 * 10 + 10
    assert isinstance(net.layers[1], nn.ReLU)
    assert isinstance(M.MLP(64, activation="tanh").layers[1], nn.Tanh)
    with pytest.raises(ValueError, match="activation"):
        M.MLP(64, activation="swishy")
    with pytest.raises(ValueError):
        M.MLP(64, hidden=(0,))


# --------------------------------------------------------------------------- LeNet-5
@pytest.mark.parametrize(
    ("channels", "size", "fc1_in", "paddings"),
    [(1, 8, 64, (2, 2)), (1, 28, 400, (2, 0)), (3, 32, 400, (0, 0))],
)
def test_lenet5_shapes(channels: int, size: int, fc1_in: int, paddings: tuple[int, int]) -> None:
    net = M.LeNet5(num_classes=10, in_channels=channels, input_size=size)
    assert net.fc1.in_features == fc1_in
    assert (net.conv1.padding[0], net.conv2.padding[0]) == paddings
    assert net(torch.randn(3, channels, size, size)).shape == (3, 10)
    # flat input (e.g. digits as 64-vectors) is reshaped to an image
    assert net(torch.randn(2, channels * size * size)).shape == (2, 10)


def test_lenet5_too_small() -> None:
    with pytest.raises(ValueError):
        M.LeNet5(input_size=2)


# --------------------------------------------------------------------------- CIFAR ResNets
RESNET20_PARAMS = 269_722  # option A, 10 classes (He et al.: 0.27M)


def test_resnet20_parameter_count() -> None:
    net = M.resnet20(num_classes=10)
    count = n_params(net)
    assert count == RESNET20_PARAMS
    assert 260_000 <= count <= 280_000
    # option B: a 1x1 projection conv + BatchNorm on the two downsampling blocks
    assert n_params(M.resnet20(shortcut="B")) == RESNET20_PARAMS + (16 * 32 + 2 * 32) + (
        32 * 64 + 2 * 64
    )


@pytest.mark.parametrize(
    ("name", "count"),
    [("resnet32", 464_154), ("resnet44", 658_586), ("resnet56", 853_018)],
)
def test_deeper_cifar_resnets(name: str, count: int) -> None:
    net = build_network(name, num_classes=10)
    assert n_params(net) == count
    convs = [m for m in net.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) + 1 == net.depth  # stem + 2 per block, + fc
    with torch.inference_mode():
        assert net.eval()(torch.randn(1, 3, 16, 16)).shape == (1, 10)


def test_resnet20_structure_and_inputs() -> None:
    net = M.resnet20(num_classes=100)
    assert [len(s) for s in (net.layer1, net.layer2, net.layer3)] == [3, 3, 3]
    assert [s[-1].conv2.out_channels for s in (net.layer1, net.layer2, net.layer3)] == [16, 32, 64]
    assert sum(isinstance(m, nn.BatchNorm2d) for m in net.modules()) == 19
    assert sum(isinstance(m, M.PadShortcut) for m in net.modules()) == 2
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 100)
    mnist_net = M.resnet20(num_classes=10, in_channels=1).eval()
    with torch.inference_mode():
        assert mnist_net(torch.randn(1, 1, 28, 28)).shape == (1, 10)


def test_pad_shortcut_zero_channels() -> None:
    x = torch.randn(2, 16, 8, 8)
    y = M.PadShortcut(16, 32, 2)(x)
    assert y.shape == (2, 32, 4, 4)
    assert torch.equal(y[:, :16], x[:, :, ::2, ::2])
    assert torch.count_nonzero(y[:, 16:]) == 0


def test_cifar_resnet_bad_arguments() -> None:
    with pytest.raises(ValueError):
        M.resnet_cifar(21)
    with pytest.raises(ValueError):
        M.resnet20(shortcut="C")


# --------------------------------------------------------------------------- torchvision nets
@pytest.mark.parametrize(
    ("name", "kwargs", "x_shape"),
    [
        ("resnet18", {"num_classes": 7}, (2, 3, 64, 64)),
        ("resnet18", {"num_classes": 10, "in_channels": 1}, (2, 1, 32, 32)),
        ("resnet50", {"num_classes": 5}, (1, 3, 64, 64)),
        ("resnet101", {"num_classes": 3}, (1, 3, 64, 64)),
    ],
)
def test_torchvision_resnets(name: str, kwargs: dict, x_shape: tuple[int, ...]) -> None:
    net = build_network(name, **kwargs).eval()
    assert net.fc.out_features == kwargs["num_classes"]
    assert net.conv1.in_channels == x_shape[1]
    with torch.inference_mode():
        assert net(torch.randn(x_shape)).shape == (x_shape[0], kwargs["num_classes"])


def test_vit_b_16() -> None:
    net = build_network("vit_b_16", num_classes=10).eval()
    assert net.heads.head.out_features == 10
    assert 85_000_000 < n_params(net) < 86_500_000
    with torch.inference_mode():
        assert net(torch.randn(1, 3, 224, 224)).shape == (1, 10)


def test_vit_small_image_and_channels() -> None:
    net = M.vit_b_16(num_classes=4, image_size=32, in_channels=1).eval()
    with torch.inference_mode():
        assert net(torch.randn(2, 1, 32, 32)).shape == (2, 4)
    with pytest.raises(ValueError):
        M.vit_b_16(image_size=30)


# --------------------------------------------------------------------------- registry
def test_registry_names() -> None:
    assert M.available_networks() == [
        "mlp",
        "lenet5",
        "resnet20",
        "resnet32",
        "resnet44",
        "resnet56",
        "resnet18",
        "resnet50",
        "resnet101",
        "vit_b_16",
    ]
    assert isinstance(build_network("MLP", in_features=64), M.MLP)
    assert isinstance(build_network("lenet5", input_size=8), M.LeNet5)
    assert isinstance(build_network("ResNet20"), M.CifarResNet)


def test_registry_unknown_name() -> None:
    with pytest.raises(ValueError) as info:
        build_network("resnet7")
    message = str(info.value)
    assert "resnet7" in message
    for name in M.available_networks():
        assert name in message


def test_networks_are_deterministic() -> None:
    torch.manual_seed(0)
    net = M.LeNet5(input_size=8).eval()
    x = torch.randn(4, 1, 8, 8)
    assert torch.equal(net(x), net(x))
