"""Moved to `bertlab.infer.serve.routes_metrics`; this import path is kept for code written against earlier releases."""

import sys

from .serve import routes_metrics as _moved

sys.modules[__name__] = _moved
