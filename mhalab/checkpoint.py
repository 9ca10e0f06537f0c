"""Checkpoints: one ``torch.save`` dict holding everything a run needs to resume exactly (as in nanoGPT).

Keys: ``model``, ``optimizer``, ``step``, ``config`` (ModelConfig), ``train_config``, ``scheduler``,
``scaler``, ``history``, ``task``, ``precision``, ``rng`` (the global CPU and GPU states, which only the kind of
device named in ``device`` can continue, and ``data``: the training batches' generator, on the CPU everywhere).
Plain values only, so ``torch.load(weights_only=True)`` reads it; writing is atomic.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["FORMAT", "save_checkpoint", "load_checkpoint", "snapshot", "restore", "capture_rng", "restore_rng"]

# v2: train_config as asked for (v1 stored derived values as train_args); v3: the config in TransformerLens's
# vocabulary (positional_embedding_type, d_head filled in) and the norms named ln1, ln2 (ln3), as its blocks name them
FORMAT = "mhalab-checkpoint-v3"


def save_checkpoint(state: dict[str, Any], path: str | os.PathLike) -> None:
    """``torch.save(state)`` to a temporary file next to ``path``, then ``os.replace`` it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic: path holds the old file or the new one, nothing in between
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """The dict a :func:`mhalab.train.train` checkpoint holds (``History(**state["history"])`` rebuilds)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {str(path)!r}")
    state = torch.load(path, map_location="cpu", weights_only=True)
    found = state.get("format") if isinstance(state, dict) else None
    if found != FORMAT:
        raise ValueError(f"{str(path)!r} is not a checkpoint this mhalab reads (format {FORMAT}, found {found!r}); "
                         "delete it to train again, or train into a new checkpoint path")
    return state


def snapshot(parts: dict[str, Any], generator: torch.Generator, device: torch.device, **extra: Any) -> dict[str, Any]:
    """The checkpoint dict of a run in progress: ``state_dict()`` of each of ``parts`` (model, optimizer, ...),
    the random states, the ModelConfig; ``extra`` (step, train_config, history, ...) goes in as is."""
    config = getattr(parts["model"], "config", None)
    return {"format": FORMAT, **{name: part.state_dict() for name, part in parts.items()},
            "rng": {**capture_rng(device), "data": generator.get_state(), "device": device.type},
            "config": config.to_dict() if hasattr(config, "to_dict") else None, **extra}


def restore(state: dict[str, Any], parts: dict[str, Any], generator: torch.Generator, device: torch.device, *,
            path: str | os.PathLike = "the checkpoint") -> tuple[bool, bool]:
    """Put a :func:`snapshot` back into ``parts`` and the random states, after checking its ModelConfig.

    Returns whether (the data generator's stream, the global streams) continue. The data generator lives on the
    CPU, so its stream continues on any device; it does not from a checkpoint written before that (a CUDA
    generator's state). The global streams (dropout's) are ``device``'s own and continue only on the kind of
    device that wrote them (a run saved on ``cuda`` and resumed on ``cpu`` cannot continue them). A stream
    that does not continue is left alone for the caller to reseed; everything else (weights, optimizer,
    schedule) is restored either way."""
    config, saved = getattr(parts["model"], "config", None), state.get("config")
    if saved is not None and hasattr(config, "to_dict") and config.to_dict() != saved:
        diff = {k: (saved.get(k), v) for k, v in config.to_dict().items() if saved.get(k) != v}
        raise ValueError(
            f"checkpoint {str(path)!r} was written for another model configuration "
            f"(field: (checkpoint, this model)) {diff}; build the model with that config, "
            "or train into a new checkpoint path"
        )
    try:
        for name, part in parts.items():  # the model first: a mismatch there is the likely error
            part.load_state_dict(state[name])
    except RuntimeError as e:
        raise ValueError(f"checkpoint {str(path)!r} does not fit this model: {e}") from None
    try:
        generator.set_state(state["rng"]["data"])
        data = True
    except RuntimeError:  # a CUDA generator's state (checkpoints from before batches were drawn on the CPU)
        data = False
    saved_on = state["rng"].get("device")  # (None in checkpoints older than this key: then the data state tells)
    same_kind = saved_on == device.type if saved_on is not None else data
    if same_kind:
        restore_rng(state["rng"], device)
    return data, same_kind


def capture_rng(device: torch.device) -> dict[str, torch.Tensor]:
    """The global random states ``torch.manual_seed`` reseeds: ``torch`` (CPU), and ``cuda`` or ``mps``."""
    states = {"torch": torch.get_rng_state()}
    if device.type in ("cuda", "mps"):
        states[device.type] = getattr(torch, device.type).get_rng_state(device)
    return states


def restore_rng(states: dict[str, torch.Tensor], device: torch.device) -> None:
    """Set the states :func:`capture_rng` returned (those of ``device``'s kind; others are ignored)."""
    torch.set_rng_state(states["torch"])
    if device.type in ("cuda", "mps") and states.get(device.type) is not None:
        getattr(torch, device.type).set_rng_state(states[device.type], device)
