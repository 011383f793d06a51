"""Moved to `bertlab.models.t5.denoising` (T5's corruption transforms are the family's); this import path is kept
for code written against earlier releases."""

import sys

from ..models.t5 import denoising as _moved

sys.modules[__name__] = _moved
