"""Moved: `BertConfig` and its presets to `bertlab.models.bert.config`, what every family's config shares
(`read_json_object`, `JsonConfig`) to `bertlab.jsonconfig`. This import path is kept for code written against
earlier releases."""

from .core.jsonconfig import KNOWN_ACTIVATIONS, MAX_MATRIX_ELEMENTS, JsonConfig, is_type, read_json_object  # noqa: F401
from .models.bert.config import *  # noqa: F401,F403
