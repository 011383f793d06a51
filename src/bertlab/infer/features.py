"""Contextual features: the hidden states of chosen layers for every token or word (Google's extract_features.py).

Layers are indices into the encoder's L+1 hidden states, Hugging Face's `output_hidden_states` order:
0 is the embedding layer's output, 1..L the Transformer layers, and negative indices count from the top
(-1 the last layer, -2 the one before; Google's `--layers=-1,-2,-3,-4`).

Units, `align=`:
    token   every word piece, [CLS] and [SEP] included (Google's output)
    first   one vector per word: its first piece's (the paper's choice for NER, section 5.3)
    mean    one vector per word: the mean of its pieces
A word is what the tokenizer's basic step splits (punctuation separate), or -- with `split_into_words` --
the caller's own words (CoNLL tokens), whose pieces never cross a word boundary. A word left with no piece
(truncated away, or made only of characters the tokenizer drops) gets a zero vector, counted in a warning.

`FeatureExtractor.extract` yields `(index, units, array)` per input in input order, `array` of shape
(units, len(layers), H) float32; inputs are length-bucketed within chunks of `chunk_size` rows, so memory
is bounded by a chunk whatever the input size. `write_features` sends them to JSON Lines (Google's
layout) or streams them to `.npy` / safetensors (rows of all inputs back to back plus an offsets array).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from ..core.errors import BertlabError
from . import length_buckets
from .inputs import encode
from .outputs import NpyWriter, SafetensorsWriter, json_line, output_kind, text_output
from .runtime import InferenceOptions, length_limit, load_encoder, load_tokenizer

log = logging.getLogger(__name__)

ALIGNMENTS = ("token", "first", "mean")
PAIR_SEPARATOR = " ||| "  # Google's extract_features.py: "text_a ||| text_b" on one line


def parse_layers(spec: str | Sequence[int], num_layers: int) -> list[int]:
    """'-1,-2,-3,-4' (or a list of ints) -> the layer indices, checked against the model's L+1 states."""
    if isinstance(spec, str):
        try:
            layers = [int(x) for x in spec.replace(" ", "").split(",") if x]
        except ValueError:
            raise BertlabError(f"--layers: expected comma-separated integers like -1,-2,-3,-4, got {spec!r}") \
                from None
    else:
        layers = [int(x) for x in spec]
    if not layers:
        raise BertlabError("--layers: no layer given")
    for layer in layers:
        if not -(num_layers + 1) <= layer <= num_layers:
            raise BertlabError(f"--layers: layer {layer} does not exist; the model has {num_layers} layers "
                               f"(0 = embeddings, 1..{num_layers}, or -1..-{num_layers + 1} from the top)")
    return layers


class FeatureExtractor:
    """Hidden states of `layers` per token or word, from a `BertModel` and its tokenizer."""

    def __init__(self, model, tokenizer, layers: Sequence[int] | str = (-1,), align: str = "token",
                 max_length: int | None = None, options: InferenceOptions | None = None, chunk_size: int = 4096):
        if align not in ALIGNMENTS:
            raise BertlabError(f"unknown alignment {align!r}; expected one of {', '.join(ALIGNMENTS)}")
        self.model, self.tokenizer, self.align = model, tokenizer, align
        self.layers = parse_layers(layers, model.config.num_hidden_layers)
        self.options = options or InferenceOptions()
        self.max_length = max_length or length_limit(None, model.config, tokenizer, None)
        self.chunk_size = chunk_size
        self.device = next(model.parameters()).device
        self.missing_words = 0

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, layers: Sequence[int] | str = (-1,), align: str = "token",
                        options: InferenceOptions | None = None) -> "FeatureExtractor":
        options = options or InferenceOptions()
        model = load_encoder(Path(model_dir), options)
        tokenizer = load_tokenizer(Path(model_dir))
        return cls(model, tokenizer, layers, align,
                   length_limit(None, model.config, tokenizer, options.max_seq_length), options)

    @property
    def row_shape(self) -> tuple[int, int]:
        return len(self.layers), self.model.config.hidden_size

    def extract(self, inputs: Sequence[str] | Sequence[Sequence[str]], split_into_words: bool = False,
                where=None) -> Iterator[tuple[int, list[str], np.ndarray]]:
        """For each input (a text, `"a ||| b"` pair, or a list of words): (index, unit strings, features)."""
        self.missing_words = 0
        for start in range(0, len(inputs), self.chunk_size):
            chunk = inputs[start:start + self.chunk_size]
            at = (lambda i, s=start: where(s + i)) if where else (lambda i, s=start: f"input {s + i + 1}")
            yield from ((start + i, units, feats) for i, units, feats in self._chunk(chunk, split_into_words, at))
        if self.missing_words:
            log.warning("%d words have no word piece (truncated, or only characters the tokenizer drops); "
                        "their features are zeros", self.missing_words)

    def _chunk(self, inputs, split_into_words: bool, where):
        texts, pairs = list(inputs), None
        if not split_into_words and any(PAIR_SEPARATOR in t for t in texts):
            split = [t.split(PAIR_SEPARATOR, 1) for t in texts]
            texts, pairs = [s[0] for s in split], [s[1] if len(s) > 1 else None for s in split]
        need_words = self.align != "token"
        enc = encode(self.tokenizer, texts, self.max_length, self.options.on_long, pairs=pairs,
                     offsets=need_words and not split_into_words, words=need_words,
                     split_into_words=split_into_words, where=where)
        results: list = [None] * len(enc)
        for batch in length_buckets.plan_batches(enc.lengths, self.options.max_tokens, self.options.max_batch,
                                           max_waste=self.options.max_waste):
            states = self._forward([enc.input_ids[i] for i in batch], [enc.token_type_ids[i] for i in batch])
            for row, i in enumerate(batch):
                n = len(enc.input_ids[i])
                feats = states[row, :n]  # (n, layers, H)
                if not need_words:
                    units = self.tokenizer.convert_ids_to_tokens(enc.input_ids[i])
                    results[i] = (i, units, feats.numpy())
                    continue
                words = list(inputs[i]) if split_into_words else None
                results[i] = (i, *self._words(feats, enc.word_ids[i], words, texts[i], pairs, enc, i))
        return results

    @torch.inference_mode()
    def _forward(self, rows, types) -> torch.Tensor:
        """(B, T, len(layers), H) float32 on the CPU."""
        inputs = length_buckets.model_inputs(rows, types, self.device)
        hidden = self.model(**inputs, output_hidden_states=True).hidden_states  # L+1 of (B, T, H)
        return torch.stack([hidden[layer] for layer in self.layers], dim=2).float().cpu()

    def _words(self, feats: torch.Tensor, word_ids: list, words: list[str] | None, text: str, pairs, enc, i):
        """Per-word features of one row: first piece or mean of pieces (first sequence of a pair only)."""
        if pairs is not None:  # words of the second text restart at 0; keep the first text's
            types = enc.token_type_ids[i]
            word_ids = [w if types[t] == 0 else None for t, w in enumerate(word_ids)]
        n_words = len(words) if words is not None else 1 + max((w for w in word_ids if w is not None), default=-1)
        index = torch.tensor([-1 if w is None else w for w in word_ids])  # (T,)
        keep = index >= 0
        out = torch.zeros(n_words, *feats.shape[1:])
        count = torch.bincount(index[keep], minlength=n_words)[:n_words]
        if self.align == "mean":
            out.index_add_(0, index[keep], feats[keep])
            out /= count.clamp(min=1).view(-1, 1, 1).to(out.dtype)
        else:  # first piece: the earliest position of each word
            positions = torch.nonzero(keep).flatten()
            first = torch.full((n_words,), len(word_ids)).scatter_reduce(0, index[keep], positions, "amin")
            present = count > 0
            out[present] = feats[first[present]]
        self.missing_words += int((count == 0).sum())
        if words is None:  # the words' text, cut from the input through the offsets
            spans: dict[int, list[int]] = {}
            for w, (s, e) in zip(word_ids, enc.offsets[i]):
                if w is not None:
                    span = spans.setdefault(w, [s, e])
                    span[1] = e
            words = [text[spans[w][0]:spans[w][1]] if w in spans else "" for w in range(n_words)]
        return words, out.numpy()


def write_features(extractor: FeatureExtractor, inputs: Sequence, output: str | Path | None,
                   split_into_words: bool = False, where=None, model_name: str = "",
                   ids: Sequence | None = None) -> int:
    """Run `extractor` over `inputs` and write the result by the output's suffix; returns the rows written.
    `ids`: a table's row ids, written as each JSON line's "id" (or FILE.ids.json beside an array)."""
    from ..core.progress import track

    kind = output_kind(output)
    items = track(extractor.extract(inputs, split_into_words, where), len(inputs), "features", "input")
    unit_key = "token" if extractor.align == "token" else "word"
    if kind == "jsonl":
        with text_output(output) as f:
            for index, units, feats in items:
                head = {"id": ids[index]} if ids is not None else {}
                f.write(json_line({**head, "linex_index": index, "features": [
                    {unit_key: unit, "layers": [{"index": layer, "values": [round(float(x), 6) for x in vec]}
                                                for layer, vec in zip(extractor.layers, unit_feats)]}
                    for unit, unit_feats in zip(units, feats)]}))
        return len(inputs)
    if ids is not None:
        from .input_files import write_ids

        write_ids(output, list(ids))
    offsets = [0]
    metadata = {"layers": ",".join(map(str, extractor.layers)), "align": extractor.align, "model": model_name,
                "layout": "features[offsets[i]:offsets[i+1]] are input i's units; shape (units, layers, hidden)"}
    if kind == "npy":
        # The offsets go beside the array: FILE.npy (units, layers, H) and FILE.offsets.npy (N+1,)
        with NpyWriter(output, extractor.row_shape) as w:
            for _, _, feats in items:
                w.write(feats)
                offsets.append(offsets[-1] + feats.shape[0])
        np.save(Path(output).with_suffix(".offsets.npy"), np.asarray(offsets, dtype=np.int64))
        return len(inputs)
    w = SafetensorsWriter(output, "features", extractor.row_shape)
    try:
        for _, _, feats in items:
            w.write(feats)
            offsets.append(offsets[-1] + feats.shape[0])
    except BaseException:
        w.abort()
        raise
    w.close({"offsets": np.asarray(offsets, dtype=np.int64)}, metadata)
    return len(inputs)
