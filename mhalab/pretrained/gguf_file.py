"""Read a llama.cpp GGUF file: its settings, its tokenizer tables and its tensors, dequantized to float32.

Matrices are ``[out, in]`` (``nn.Linear``'s layout). llama.cpp's converter stores each head's W_Q and
W_K rows *permuted* so that rotary embedding rotates adjacent pairs (0, 1), (2, 3), ... instead of Hugging
Face's halves (i, i + d_head/2); :class:`mhalab.MultiHeadAttention` rotates adjacent pairs, so the rows
are used exactly as stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .files import INSTALL_HINT

__all__ = ["GGUFContents", "read_gguf"]


@dataclass
class GGUFContents:
    """``metadata``: every key-value setting; ``tensors``: name -> float32 array (``[out, in]`` for matrices)."""

    metadata: dict
    tensors: dict[str, np.ndarray] = field(repr=False)

    def get(self, key: str):
        if key not in self.metadata:
            raise KeyError(f"the GGUF file has no {key!r} setting; it has {sorted(self.metadata)[:12]} ...")
        return self.metadata[key]


def read_gguf(path: str | Path, *, tensors: bool = True) -> GGUFContents:
    """Read ``path`` with the ``gguf`` package; quantized tensors (Q4_1, Q8_0, ...) are dequantized."""
    try:
        import gguf
    except ImportError as error:
        raise ModuleNotFoundError(f"reading a GGUF file needs the gguf package: {INSTALL_HINT}") from error
    reader = gguf.GGUFReader(str(path))
    metadata = {key: value.contents() for key, value in reader.fields.items() if not key.startswith("GGUF.")}
    # float32 copies, so the memory-mapped file can be closed.
    arrays = {t.name: np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
              for t in (reader.tensors if tensors else [])}
    return GGUFContents(metadata, arrays)
