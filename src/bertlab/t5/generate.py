"""Moved to `bertlab.models.t5.generate`; this import path is kept for code written against earlier releases."""

import sys

from ..models.t5 import generate as _moved

sys.modules[__name__] = _moved
