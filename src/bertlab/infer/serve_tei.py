"""Moved to `bertlab.infer.serve.routes_tei`; this import path is kept for code written against earlier releases."""

import sys

from .serve import routes_tei as _moved

sys.modules[__name__] = _moved
