"""Moved to `bertlab.models.t5.sentinels` (T5's tokenizer binding is the family's); this import path is kept for code
written against earlier releases. The family imports the tokenizer layer, so this alias finds it by name rather
than importing it (which would make the tokenizer layer import a model family)."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("bertlab.models.t5.sentinels")
