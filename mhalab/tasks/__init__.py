"""Synthetic sequence tasks whose answers come from known positions, so we can tell which head learned what.

Batches are drawn from a seeded generator on its device, and ``Batch.sources`` records, for each
relation and query position, the position it points to: the ground truth heads are scored against.
Shapes: ``B`` batch, ``T`` sequence length, ``R`` targets per position, ``V`` vocabulary.

One module per kind of relation: :mod:`.base` (``Task``, ``Batch``, ``IGNORE``), :mod:`.offsets` (by position),
:mod:`.lookups` (by content), :mod:`.repeats` (induction), :mod:`.seq2seq` (encoder-decoder).
"""

from .base import IGNORE, Batch, Task
from .lookups import KeyValueRecall, TableLookup
from .offsets import MultiRelationTask
from .repeats import RepeatedSegments
from .seq2seq import Seq2SeqBatch, Seq2SeqTask

__all__ = ["Batch", "Task", "MultiRelationTask", "KeyValueRecall", "TableLookup", "RepeatedSegments", "Seq2SeqBatch",
           "Seq2SeqTask", "IGNORE"]
