"""T5 as a family: what the registry (`models/registry.py`) hands to recipes and inference.

T5 has no bare encoder and no one-layer task heads: every task is text to text through
`T5ForConditionalGeneration` (`bertlab finetune-t5`, `generate`), so `base_model` is None and `heads` empty.
"""

from __future__ import annotations

from pathlib import Path

from .tokenizer import T5Tokenizer, load_text_to_text_tokenizer
from ..family import Family
from .config import T5Config, preset
from .params import PARAMETERS


def corpus_tokenizer(vocab: Path) -> T5Tokenizer:
    """`prepare`'s tokenizer for a SentencePiece vocabulary: corpus text is text, so "<extra_id_0>" or "</s>"
    written in it does not become a sentinel or an eos."""
    return T5Tokenizer.from_pretrained(vocab, split_special_tokens=True)


def text_to_text_model() -> type:
    """`T5ForConditionalGeneration`, imported when a model is built."""
    from .modeling import T5ForConditionalGeneration  # torch only when a model is built

    return T5ForConditionalGeneration


def random_start(model: str, vocab: str | None, folder: Path) -> None:
    """A T5 model of a preset's size, its vocabulary size and special ids the tokenizer's (as pre-training's
    are), or of a folder's shape (`Family.random_start`)."""
    from ...checkpoint.pretrained import save_model_folder
    from .modeling import T5ForConditionalGeneration

    tokenizer = load_text_to_text_tokenizer(vocab or model)
    if vocab:
        config = preset(model, vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_token_id,
                        eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.pad_token_id)
    else:
        config = T5Config.from_json_file(model)
    save_model_folder(T5ForConditionalGeneration(config), folder, tokenizer)


FAMILY = Family(model_type="t5", name="T5", config_class=T5Config, base_model=None, heads={},
                tokenizer=T5Tokenizer.from_pretrained, parameters=PARAMETERS, data_tokenizer="sentencepiece",
                pretrain_command="pretrain-t5", corpus_tokenizer=corpus_tokenizer,
                generates_text=True, text_to_text_model=text_to_text_model,
                text_to_text_tokenizer=load_text_to_text_tokenizer, random_start=random_start)
