"""T5 (Raffel et al., 2020), the second model family beside BERT: `config.py` (`T5Config`, presets), `modeling.py`
(`T5ForConditionalGeneration`: encoder-decoder, decoder-only and prefix-LM on the same blocks) and
`generate.py` (greedy and beam search with a key/value cache). Checkpoints are Hugging Face's layout.
"""

from .config import ARCHITECTURES, PRESETS, T5Config, preset

__all__ = ["ARCHITECTURES", "PRESETS", "T5Config", "preset", "T5ForConditionalGeneration", "T5Output"]


def __getattr__(name: str):
    # the model needs torch; the config (for `bertlab params`) does not
    if name in ("T5ForConditionalGeneration", "T5Output"):
        from . import modeling

        return getattr(modeling, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
