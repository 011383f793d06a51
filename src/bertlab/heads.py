"""Moved to `bertlab.models.bert.heads`; this import path is kept for code written against earlier releases."""

import sys

from .models.bert import heads as _moved

sys.modules[__name__] = _moved
