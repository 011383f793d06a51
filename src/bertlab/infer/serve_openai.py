"""Moved to `bertlab.infer.serve.routes_openai`; this import path is kept for code written against earlier releases."""

import sys

from .serve import routes_openai as _moved

sys.modules[__name__] = _moved
