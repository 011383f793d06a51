"""Moved to `bertlab.models.t5.objectives` (T5's objectives are the family's); this import path is kept for code
written against earlier releases."""

import sys

from ..models.t5 import objectives as _moved

sys.modules[__name__] = _moved
