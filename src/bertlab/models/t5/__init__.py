"""T5 (Raffel et al., 2020), the second model family beside BERT:

    config.py      `T5Config`, presets
    modeling.py    `T5ForConditionalGeneration`: encoder-decoder, decoder-only and prefix-LM on the same blocks
    generate.py    greedy and beam search with a key/value cache
    sentinels.py   the text-to-text tokenizer interface T5's objectives and data use (sentinels, eos, pad) and
                   `SentinelTokenizer`, which implements it once over a base tokenizer
    tokenizer.py   `T5Tokenizer` (a SentencePiece model, read through `bertlab.tokenizer.sentencepiece`),
                   `WordPieceT5Tokenizer` (a BERT vocabulary plus sentinels), `load_text_to_text_tokenizer`,
                   and T5's SentencePiece trainer settings (`bertlab vocab train --kind sentencepiece`)
    denoising.py   T5's seven corruption objectives as pure data transforms, registered by name
                   (`DENOISING_OBJECTIVES`: what `prepare --objective` writes)
    objectives.py  one `Objective` per transform (`pretrain --objective NAME`: the model, the loss, held-out
                   metrics), listed in the objective registry `bertlab.objectives` under the transforms' names

Checkpoints are Hugging Face's layout. What T5 needs from the layers above the family stays there: its packed
shards and batches (`data/t5_data.py`, `data/t5_loader.py`, on the shard store and loader), GLUE and SQuAD as
text (`tasks/text_to_text.py`, on those tasks) and the `finetune-t5` recipe (`train/text_to_text.py`).
"""

from .config import ARCHITECTURES, PRESETS, T5Config, preset

__all__ = ["ARCHITECTURES", "PRESETS", "T5Config", "preset", "T5ForConditionalGeneration", "T5Output"]


def __getattr__(name: str):
    # the model needs torch; the config (for `bertlab params`) does not
    if name in ("T5ForConditionalGeneration", "T5Output"):
        from . import modeling

        return getattr(modeling, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
