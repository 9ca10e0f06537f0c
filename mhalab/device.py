"""Choosing where tensors live and in which precision training computes. Nothing here runs at import time."""

from __future__ import annotations

import contextlib
import functools
import itertools

import torch

__all__ = ["pick_device", "describe_device", "autocast_dtype", "resolve_precision", "autocast", "synchronize",
           "foreach_supported", "moved_to", "sdpa_shares_kv_heads", "sdpa_zeroes_blind_rows", "PRECISIONS"]

_CHOICES = ("auto", "cpu", "cuda", "mps")
PRECISIONS = ("fp32", "bf16", "fp16", "auto")


def pick_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` picks cuda, then mps, then cpu; anything else is checked and returned."""
    if isinstance(device, torch.device):
        device = str(device)
    if not isinstance(device, str):
        raise TypeError(f"device must be a string such as 'auto', 'cpu' or 'cuda', got {type(device).__name__}")
    if device == "auto":
        mps = torch.backends.mps.is_available()
        return torch.device("cuda" if torch.cuda.is_available() else "mps" if mps else "cpu")
    kind = device.split(":")[0]
    if kind not in _CHOICES:
        raise ValueError(f"unknown device {device!r}: use one of {', '.join(_CHOICES)} (or 'cuda:N')")
    try:
        chosen = torch.device(device)
    except RuntimeError:
        raise ValueError(f"cannot read device {device!r}: write 'cpu', 'cuda', 'cuda:N' (N a GPU number) "
                         "or 'mps'") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was asked for but torch sees no CUDA GPU; use device='auto' or 'cpu'")
    if kind == "cuda" and chosen.index is not None and chosen.index >= torch.cuda.device_count():
        raise ValueError(
            f"device={device!r} was asked for but torch sees {torch.cuda.device_count()} CUDA GPU(s): "
            f"use 'cuda:0' to 'cuda:{torch.cuda.device_count() - 1}'"
        )
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device='mps' was asked for but this torch has no usable MPS backend; use 'auto' or 'cpu'")
    return chosen


def describe_device(device: str | torch.device = "auto") -> str:
    """One line: which device ``pick_device(device)`` gives and why."""
    chosen = pick_device(device)
    if chosen.type == "cuda":
        name = torch.cuda.get_device_name(chosen)
        fast = "bf16 autocast" if torch.cuda.is_bf16_supported() else "fp16 autocast with a gradient scaler"
        why = "a CUDA GPU is available" if str(device) == "auto" else "asked for"
        return f"cuda ({name}): {why}; training runs in float32 (precision='auto' opts in to {fast})"
    if chosen.type == "mps":
        return "mps (Apple GPU): no CUDA GPU, but Metal is available; training runs in float32"
    why = "no CUDA or MPS device found" if str(device) == "auto" else "asked for"
    return f"cpu: {why}; training runs in float32 (every notebook is sized for a 2-core CPU)"


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The fastest autocast dtype on ``device`` (``precision="auto"``): bf16 or fp16 on CUDA, None (off) elsewhere."""
    return resolve_precision("auto", device)[1]


def resolve_precision(precision: str, device: torch.device) -> tuple[str, torch.dtype | None]:
    """``(name, autocast dtype or None)`` for ``precision`` on ``device``; raises on impossible choices.
    ``"bf16"``/``"fp16"``: CUDA autocast, opted in to for speed; ``"fp32"``: the same numbers anywhere."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "auto":
        precision = "fp32" if device.type != "cuda" else "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    elif precision != "fp32" and device.type != "cuda":
        raise ValueError(
            f"precision={precision!r} (autocast) is only used on CUDA GPUs, but training runs on {device}; "
            "use precision='fp32' (the default) or 'auto'"
        )
    elif precision == "bf16" and not torch.cuda.is_bf16_supported():
        raise ValueError("this GPU has no bfloat16 support; use precision='fp16' (with a gradient scaler) or 'fp32'")
    return precision, {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def autocast(device: torch.device, dtype: torch.dtype | None):
    """``torch.autocast`` to ``dtype`` on ``device``, or a context that does nothing when ``dtype`` is None."""
    return torch.autocast(device_type=device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work (CUDA and MPS are asynchronous): call it before reading a clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


@contextlib.contextmanager
def moved_to(module: torch.nn.Module, device: torch.device):
    """``module`` on ``device`` inside the block and back on the device it was on after it, also on an error.
    (A module with neither parameters nor buffers has nowhere to go back to and stays on ``device``.)"""
    first = next(itertools.chain(module.parameters(), module.buffers()), None)
    home = None if first is None else first.device  # read now: .to() moves a parameter's data, not the parameter
    module.to(device)
    try:
        yield module
    finally:
        if home is not None:
            module.to(home)


def foreach_supported(device: torch.device) -> bool:
    """Whether torch runs its multi-tensor ("foreach") kernels on ``device``: CPU and CUDA yes, MPS no (there
    ``clip_grad_norm_(foreach=True)`` raises). Asked of torch itself: the very check ``clip_grad_norm_`` makes."""
    try:
        from torch.utils._foreach_utils import _device_has_foreach_support
    except ImportError:  # a private helper; should it move, fall back to what it answered when this was written
        return device.type in ("cpu", "cuda")
    return bool(_device_has_foreach_support(device))


def sdpa_zeroes_blind_rows(device: torch.device) -> bool:
    """Whether ``F.scaled_dot_product_attention`` gives zeros (not NaN) to a query whose mask row is all
    ``-inf`` on ``device``: on CPU and CUDA yes (the safe softmax of torch 2.5, the floor); on MPS no: its
    general kernel returned NaN until torch 2.9 (pytorch/pytorch#156707), and its no-grad kernels for short
    queries still may (pytorch/pytorch#167515), so :class:`mhalab.MultiHeadAttention` zeroes such rows itself."""
    return device.type != "mps"


def sdpa_shares_kv_heads(device: torch.device, version: str | None = None) -> bool:
    """Whether ``F.scaled_dot_product_attention(..., enable_gqa=True)`` can be used on ``device`` with this
    torch (or ``version``): from 2.5 on, but on MPS only from 2.7; MPS's kernel of torch 2.5 and 2.6 aborts
    the whole process on grouped K/V heads ("incompatible dimensions", pytorch/pytorch#149132)."""
    return _sdpa_gqa(device.type, version or torch.__version__)


@functools.cache  # asked on every attention call: parse the version once per device kind
def _sdpa_gqa(kind: str, version: str) -> bool:
    from torch.torch_version import TorchVersion

    release = TorchVersion(version)
    return release >= (2, 5) and (kind != "mps" or release >= (2, 7))
