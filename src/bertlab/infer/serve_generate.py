"""Moved to `bertlab.infer.serve.routes_generate`; this import path is kept for code written against earlier releases."""

import sys

from .serve import routes_generate as _moved

sys.modules[__name__] = _moved
