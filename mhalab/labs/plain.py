"""What an answer returned, as plain data: JSON-able values plus numbered arrays (:func:`encode`), and back
(:func:`decode`). The grader's transport sends it between the grading kernel and the grader this way (JSON and an
``.npz``, never pickle); ``q.check`` passes what an answer returned through the same :func:`round_trip`, so that
the check and the grade judge the same value (an ``np.int64`` is an int in both, a tensor stays a tensor, an object
plain data cannot carry is only its description in both). A leaf module (it imports nothing of ``mhalab.labs`` but
:mod:`.invoke`), copied into the grading kernel with the package.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import numpy as np
import torch

from .invoke import Opaque, describe

__all__ = ["decode", "encode", "round_trip"]


def encode(value: Any, arrays: list, depth: int = 0) -> Any:
    """``value`` as JSON-able data; tensors and arrays go to ``arrays`` (numbered). Models of ``mhalab.models``
    travel as their class, config and weights, mhalab's dataclasses (configs) as their class and fields;
    anything else unknown as its description."""
    if isinstance(value, np.generic):  # np.float64 and np.str_ are a float and a str
        value = value.item()
    if value is None or isinstance(value, (bool, int, str)):
        big = isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**62
        return {"__int__": str(value)} if big else value
    if isinstance(value, float):
        return value if np.isfinite(value) else {"__float__": repr(value)}
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        dtype = str(t.dtype).replace("torch.", "")
        if t.dtype == torch.bfloat16 or t.is_complex() and t.dtype == torch.complex32:
            t = t.float()
        arrays.append(t.resolve_conj().resolve_neg().contiguous().numpy())
        return {"__tensor__": len(arrays) - 1, "dtype": dtype}
    if isinstance(value, np.ndarray) and value.dtype != object:
        arrays.append(np.ascontiguousarray(value))
        return {"__ndarray__": len(arrays) - 1}
    if depth < 8 and isinstance(value, (tuple, list)):  # torch.Size and named tuples become tuples
        items = [encode(v, arrays, depth + 1) for v in value]
        return items if isinstance(value, list) else {"__tuple__": items}
    if depth < 8 and type(value) is dict:
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return {k: encode(v, arrays, depth + 1) for k, v in value.items()}
        return {"__dict__": [[encode(k, arrays, depth + 1), encode(v, arrays, depth + 1)] for k, v in value.items()]}
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and _travels(type(value).__module__):
        # a config of mhalab's (a model's sizes): its class and its fields, rebuilt in the grading kernel
        return {"__config__": f"{type(value).__module__}:{type(value).__qualname__}",
                "fields": encode({f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}, arrays,
                                 depth + 1)}
    config = getattr(value, "config", None)
    if (isinstance(value, torch.nn.Module) and type(value).__module__.startswith("mhalab.")
            and dataclasses.is_dataclass(config)):
        return {"__model__": f"{type(value).__module__}:{type(value).__qualname__}",
                "config_class": f"{type(config).__module__}:{type(config).__qualname__}",
                "config": encode(dataclasses.asdict(config), arrays, depth + 1),
                "state": encode(dict(value.state_dict()), arrays, depth + 1), "training": value.training}
    return {"__opaque__": describe(value)}


def _travels(module: str) -> bool:
    return module.startswith("mhalab.") and not module.startswith("mhalab.labs")


def _mhalab_class(path: str):
    module, _, name = str(path).partition(":")
    if not module.startswith("mhalab.") or module.startswith("mhalab.labs"):
        raise ValueError(f"refusing to build {path!r}: only models of mhalab travel")
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def decode(value: Any, arrays: Any, *, models: bool = False) -> Any:
    """The inverse of :func:`encode` (``arrays``: ``{"a0": array, ...}``, as ``np.load`` gives them). Tensors come
    back as tensors, arrays as arrays, other objects as :class:`Opaque`; a model or config is rebuilt only with
    ``models=True`` (the grading kernel, from the grader)."""
    if isinstance(value, list):
        return [decode(v, arrays, models=models) for v in value]
    if not isinstance(value, dict):
        return value
    if "__tensor__" in value:
        t = torch.from_numpy(np.array(arrays[f"a{int(value['__tensor__'])}"]))
        dtype = getattr(torch, str(value.get("dtype")), None)
        return t.to(dtype) if isinstance(dtype, torch.dtype) and dtype != t.dtype else t
    if "__ndarray__" in value:
        return np.array(arrays[f"a{int(value['__ndarray__'])}"])
    if "__tuple__" in value:
        return tuple(decode(v, arrays, models=models) for v in value["__tuple__"])
    if "__dict__" in value:
        return {_hashable(decode(k, arrays, models=models)): decode(v, arrays, models=models)
                for k, v in value["__dict__"]}
    if "__int__" in value:
        return int(value["__int__"])
    if "__float__" in value:
        return float(value["__float__"])
    if "__opaque__" in value:
        return Opaque(value["__opaque__"])
    if "__config__" in value:
        if not models:
            return Opaque("a config")
        return _mhalab_class(value["__config__"])(**decode(value["fields"], arrays))
    if "__model__" in value:
        if not models:
            return Opaque("a model")
        config = _mhalab_class(value["config_class"])(**decode(value["config"], arrays))
        model = _mhalab_class(value["__model__"])(config)
        model.load_state_dict(decode(value["state"], arrays))
        return model.train(bool(value.get("training")))
    return {k: decode(v, arrays, models=models) for k, v in value.items()}


def _hashable(key: Any) -> Any:
    if isinstance(key, (list, tuple)):
        return tuple(_hashable(k) for k in key)
    return repr(key) if isinstance(key, (dict, Opaque)) else key


def round_trip(value: Any) -> Any:
    """``value`` as the grader receives it from the grading kernel: encoded, then decoded (no bytes in between,
    which change nothing: JSON keeps what :func:`encode` makes, ``.npz`` keeps arrays exactly)."""
    arrays: list = []
    data = encode(value, arrays)
    return decode(data, {f"a{i}": a for i, a in enumerate(arrays)})
