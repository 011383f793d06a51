"""Text-to-text generation with a model folder of a family that generates text (T5's): texts in, generated texts
out, and T5's span filling.

    "The <extra_id_0> walks in <extra_id_1> park"  --model-->  "<extra_id_0> cute dog <extra_id_1> the <extra_id_2>"
                                                 --spans-->  {"<extra_id_0>": "cute dog", "<extra_id_1>": "the"}
                                                 --filled->  "The cute dog walks in the park"

The model class and the tokenizer are the folder's family's (`Family.text_to_text`; T5's tokenizer is SentencePiece
from `spiece.model`, else WordPiece plus sentinels from `vocab.txt`); the tokenizer's end and pad ids must be the
model's.
Inputs are sorted by length and generated in buckets (`length_buckets.run_bucketed`), so short texts do not wait
for padding. An input over the model's length (`n_positions`, or the tokenizer's limit, or `--max-seq-length`) is
refused in one line naming it (`--on-long truncate` cuts it, keeping `</s>`, with a warning).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from ..core.errors import BertlabError
from ..models.registry import family_of
from ..models.text_to_text import SENTINEL_PATTERN, TextToTextTokenizer, sentinel_token
from . import length_buckets
from .runtime import InferenceOptions, check_model_dir, load_model

log = logging.getLogger(__name__)


def load_generation_tokenizer(model_dir: str | Path, config) -> TextToTextTokenizer:
    """The model folder's text-to-text tokenizer (its family's), checked against the model: the ids it ends and
    pads sequences with are the ones generation stops on and pads with."""
    _, load_tokenizer = family_of(model_dir).text_to_text("generation", model_dir)
    tokenizer = load_tokenizer(model_dir)
    for name in ("eos_token_id", "pad_token_id"):
        if getattr(tokenizer, name) != getattr(config, name):
            raise BertlabError(f"{model_dir}: the tokenizer's {name} is {getattr(tokenizer, name)} but config.json "
                               f"says {getattr(config, name)}; they must agree")
    return tokenizer


# ---------------------------------------------------------------------------------------------- generation
class Generator:
    """A text-to-text model folder (T5's) as a text-to-text function: `generate(texts)` and `fill_spans(texts)`."""

    def __init__(self, model, tokenizer: TextToTextTokenizer, options: InferenceOptions | None = None,
                 max_new_tokens: int = 20, num_beams: int = 1, length_penalty: float = 1.0,
                 early_stopping: bool | str = False):
        self.model, self.tokenizer = model, tokenizer
        self.options = options or InferenceOptions()
        self.settings = dict(max_new_tokens=max_new_tokens, num_beams=num_beams, length_penalty=length_penalty,
                             early_stopping=early_stopping)
        self.device = next(model.parameters()).device
        limits = [model.config.n_positions, tokenizer.model_max_length]
        if self.options.max_seq_length is not None:
            if self.options.max_seq_length > model.config.n_positions:
                raise BertlabError(f"--max-seq-length {self.options.max_seq_length} is over the model's limit "
                                   f"(n_positions = {model.config.n_positions})")
            limits.append(self.options.max_seq_length)
        self.max_length = min(limits)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, options: InferenceOptions | None = None, **settings: Any
                        ) -> "Generator":
        options = options or InferenceOptions()
        model_dir = check_model_dir(Path(model_dir))
        model_class, _ = family_of(model_dir).text_to_text("generation", model_dir)  # an encoder's: one line
        model = load_model(model_class, model_dir, options)
        return cls(model, load_generation_tokenizer(model_dir, model.config), options, **settings)

    def encode(self, texts: Sequence[str], where: Callable[[int], str] | None = None) -> list[list[int]]:
        where = where or (lambda i: f"text {i + 1}")
        rows = []
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise BertlabError(f"{where(i)}: expected text, got {type(text).__name__}")
            ids = self.tokenizer.encode(text)
            if len(ids) > self.max_length:
                if self.options.on_long == "reject":
                    raise BertlabError(f"{where(i)}: {len(ids)} tokens, longer than the model allows ({self.max_length}"
                                       "; --on-long truncate cuts it)")
                log.warning("%s: %d tokens, cut to %d", where(i), len(ids), self.max_length)
                ids = ids[:self.max_length - 1] + ids[-1:]  # keep </s>
            rows.append(ids)
        return rows

    def generate_ids(self, rows: Sequence[Sequence[int]]) -> list[list[int]]:
        """Token-id rows -> generated ids per row (without the decoder start token, up to and including </s>)."""
        def batch(indices: list[int]) -> list[list[int]]:
            ids = length_buckets.pad_rows([rows[i] for i in indices], self.model.config.pad_token_id).to(self.device)
            mask = length_buckets.pad_rows([[1] * len(rows[i]) for i in indices], 0, ids.size(1)).to(self.device)
            out = self.model.generate(ids, attention_mask=mask, **self.settings)[:, 1:].tolist()
            return [_until_eos(row, self.model.config.eos_token_id) for row in out]

        return length_buckets.run_bucketed(batch, [len(r) for r in rows], self.options.max_tokens,
                                     self.options.max_batch, max_waste=self.options.max_waste)

    @torch.inference_mode()
    def generate(self, texts: Sequence[str], where: Callable[[int], str] | None = None) -> list[dict[str, Any]]:
        """Per text: {"generated": text, "token_ids": [...]}, and for a text with `<extra_id_N>` sentinels also
        {"spans": {sentinel: span}, "filled": the text with each sentinel replaced by its span}."""
        results = []
        for text, ids in zip(texts, self.generate_ids(self.encode(texts, where))):
            result: dict[str, Any] = {"generated": decode(ids, self.tokenizer), "token_ids": ids}
            if SENTINEL_PATTERN.search(text):
                result.update(fill_spans(text, ids, self.tokenizer))
            results.append(result)
        return results

    def iter_predict(self, items: Sequence[Any], where: Callable[[int], str] | None = None,
                     chunk_size: int = 256) -> Iterator[dict[str, Any]]:
        """`bertlab predict` over a T5 folder: each item a text or {"text": ...}; `generate`'s rows, in order,
        a chunk at a time (the same interface as `infer.predict.Predictor`)."""
        where = where or (lambda i: f"input {i + 1}")
        texts = []
        for i, item in enumerate(items):
            text = item.get("text") if isinstance(item, dict) else item
            if not isinstance(text, str):
                raise BertlabError(f"{where(i)}: expected a text or a JSON object with a 'text' field")
            texts.append(text)
        for start in range(0, len(texts), chunk_size):
            yield from self.generate(texts[start:start + chunk_size], lambda i, s=start: where(s + i))

    def fill_spans(self, texts: Sequence[str], where: Callable[[int], str] | None = None) -> list[dict[str, Any]]:
        """`generate` for texts that must hold a sentinel (fill-mask's rule for [MASK])."""
        where = where or (lambda i: f"text {i + 1}")
        for i, text in enumerate(texts):
            if not SENTINEL_PATTERN.search(text):
                raise BertlabError(f"{where(i)}: no <extra_id_N> sentinel in the text; put <extra_id_0> where a span "
                                   "should be filled")
        return self.generate(texts, where)


def decode(ids: Sequence[int], tokenizer: TextToTextTokenizer, spans: bool = False) -> str:
    """Generated ids -> text without pad and </s> (sentinels written out, unless decoding a span). Ids past the
    tokenizer's vocabulary (T5 checkpoints pad the embedding to a multiple of 128: never produced once trained)
    are left out."""
    drop = {tokenizer.pad_token_id, tokenizer.eos_token_id}
    return tokenizer.decode([i for i in ids if i not in drop and 0 <= i < tokenizer.vocab_size],
                            skip_special_tokens=spans)


def fill_spans(text: str, ids: Sequence[int], tokenizer: TextToTextTokenizer) -> dict[str, Any]:
    """The text's sentinels filled from the model's output: {"spans": {sentinel: span}, "filled": text}. A sentinel
    the model left out gets an empty span."""
    found = spans_by_sentinel(ids, tokenizer)
    spans = {m.group(0): found.get(m.group(0), "") for m in SENTINEL_PATTERN.finditer(text)}
    filled = SENTINEL_PATTERN.sub(lambda m: spans[m.group(0)], text)
    return {"spans": spans, "filled": re.sub(r" {2,}", " ", filled).strip()}


def _until_eos(ids: list[int], eos: int) -> list[int]:
    return ids[:ids.index(eos) + 1] if eos in ids else ids


def spans_by_sentinel(ids: Sequence[int], tokenizer: TextToTextTokenizer) -> dict[str, str]:
    """T5's target format, `<extra_id_0> span <extra_id_1> span ...`, as {sentinel: decoded span}; tokens before
    the first sentinel belong to none and are dropped."""
    spans: dict[str, list[int]] = {}
    current: list[int] | None = None
    for i in ids:
        index = tokenizer.sentinel_index(i)
        if index is not None:
            current = spans.setdefault(sentinel_token(index), [])
        elif current is not None:
            current.append(i)
    return {s: decode(span, tokenizer, spans=True).strip() for s, span in spans.items()}
