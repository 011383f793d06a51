"""Moved to `bertlab.models.t5.config`; this import path is kept for code written against earlier releases."""

import sys

from ..models.t5 import config as _moved

sys.modules[__name__] = _moved
