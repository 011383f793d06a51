"""Moved to `bertlab.models.t5`; this import path (and `bertlab.t5.config`, `.model`, `.generate`) is kept for
code written against earlier releases."""

from ..models.t5 import ARCHITECTURES, PRESETS, T5Config, __getattr__, preset  # noqa: F401

__all__ = ["ARCHITECTURES", "PRESETS", "T5Config", "preset", "T5ForConditionalGeneration", "T5Output"]
