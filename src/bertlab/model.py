"""Moved to `bertlab.models.bert.modeling`; this import path is kept for code written against earlier releases."""

import sys

from .models.bert import modeling as _moved

sys.modules[__name__] = _moved
