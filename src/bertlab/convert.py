"""Moved to `bertlab.models.bert.convert`; this import path is kept for code written against earlier releases."""

import sys

from .models.bert import convert as _moved

sys.modules[__name__] = _moved
