"""mhalab.device: the device choice, its errors, and no CUDA work at import time."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from mhalab.device import autocast_dtype, describe_device, pick_device

HAS_CUDA = torch.cuda.is_available()
HAS_MPS = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())


def test_auto_picks_cuda_then_mps_then_cpu():
    expected = "cuda" if HAS_CUDA else "mps" if HAS_MPS else "cpu"
    assert pick_device("auto").type == expected
    assert pick_device().type == expected


@pytest.mark.skipif(HAS_CUDA or HAS_MPS, reason="this machine has a GPU: auto does not pick the cpu")
def test_auto_is_cpu_without_a_gpu():
    assert pick_device("auto") == torch.device("cpu")
    line = describe_device()
    assert line.startswith("cpu: no CUDA or MPS device found")
    assert autocast_dtype(pick_device()) is None


def test_explicit_cpu():
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_device(torch.device("cpu")) == torch.device("cpu")
    assert describe_device("cpu").startswith("cpu: asked for")


@pytest.mark.parametrize("name", ["gpu", "CPU", "tpu", "cuda0", ""])
def test_unknown_names(name):
    with pytest.raises(ValueError, match=rf"unknown device {name!r}: use one of auto, cpu, cuda, mps"):
        pick_device(name)


@pytest.mark.parametrize("name", ["cuda:x", "cpu:a", "cuda:-1:2"])
def test_unreadable_names(name):
    with pytest.raises(ValueError, match=rf"cannot read device {name!r}: write 'cpu', 'cuda', 'cuda:N'"):
        pick_device(name)


@pytest.mark.parametrize("value", [0, None, 1.5])
def test_not_a_string(value):
    with pytest.raises(TypeError, match="device must be a string such as 'auto', 'cpu' or 'cuda'"):
        pick_device(value)


@pytest.mark.skipif(HAS_CUDA, reason="CUDA is available here")
@pytest.mark.parametrize("name", ["cuda", "cuda:0", "cuda:1"])
def test_cuda_without_cuda(name):
    with pytest.raises(ValueError,
                       match=rf"device={name!r} was asked for but torch sees no CUDA GPU; use device='auto'"):
        pick_device(name)


@pytest.mark.skipif(HAS_MPS, reason="MPS is available here")
def test_mps_without_mps():
    with pytest.raises(ValueError, match="no usable MPS backend"):
        pick_device("mps")


@pytest.mark.gpu
def test_cuda():
    assert pick_device("cuda").type == "cuda"
    assert pick_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(ValueError, match="CUDA GPU"):
        pick_device(f"cuda:{torch.cuda.device_count()}")
    assert describe_device().startswith("cuda (")
    assert autocast_dtype(torch.device("cuda")) in (torch.bfloat16, torch.float16)


def test_importing_mhalab_does_not_initialise_cuda():
    """A fresh interpreter imports mhalab and every submodule; CUDA must still be untouched."""
    script = (
        "import importlib, pkgutil, torch, mhalab\n"
        "names = [m.name for m in pkgutil.walk_packages(mhalab.__path__, 'mhalab.')]\n"
        "for name in names: importlib.import_module(name)\n"
        "assert 'mhalab.attention' in names and 'mhalab.device' in names, names\n"
        "print(len(names), torch.cuda.is_initialized())\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    count, initialised = result.stdout.split()
    assert int(count) >= 3
    assert initialised == "False", "importing mhalab initialised CUDA"


def test_grouped_kv_heads_in_the_fused_kernel_only_where_torch_has_them():
    """MPS's scaled_dot_product_attention aborts the process on enable_gqa in torch 2.5 and 2.6
    (pytorch/pytorch#149132): there MultiHeadAttention repeats the K/V heads itself."""
    from mhalab.device import sdpa_shares_kv_heads

    cpu, cuda, mps = torch.device("cpu"), torch.device("cuda"), torch.device("mps")
    assert sdpa_shares_kv_heads(cpu, "2.5.1") and sdpa_shares_kv_heads(cuda, "2.5.1")
    assert not sdpa_shares_kv_heads(mps, "2.5.1") and not sdpa_shares_kv_heads(mps, "2.6.0")
    assert sdpa_shares_kv_heads(mps, "2.7.0") and not sdpa_shares_kv_heads(cpu, "2.4.1")
    assert sdpa_shares_kv_heads(cpu)  # this torch, at or above the declared floor


def test_mps_is_the_device_whose_fused_kernel_gives_nan_to_a_query_that_sees_no_key():
    """MultiHeadAttention zeroes such queries itself on MPS (pytorch/pytorch#156707, #167515); CPU and
    CUDA's kernels give zeros from torch 2.5 on. tests/test_attention.py checks the output, simulated."""
    from mhalab.device import sdpa_zeroes_blind_rows

    assert sdpa_zeroes_blind_rows(torch.device("cpu")) and sdpa_zeroes_blind_rows(torch.device("cuda"))
    assert not sdpa_zeroes_blind_rows(torch.device("mps"))
