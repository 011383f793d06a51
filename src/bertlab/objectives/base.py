"""Moved to `bertlab.nn.objective` (the objective interface is family-neutral: every family's objectives implement
it, T5's inside its folder); this import path is kept for code written against earlier releases."""

import sys

from ..models import objective as _moved

sys.modules[__name__] = _moved
