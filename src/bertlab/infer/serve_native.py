"""Moved to `bertlab.infer.serve.routes_native`; this import path is kept for code written against earlier releases."""

import sys

from .serve import routes_native as _moved

sys.modules[__name__] = _moved
