"""Fill-mask: the masked LM's top-k tokens, with probabilities, for every [MASK] in a text.

The MLM head (transform + tied vocabulary projection) runs only at the [MASK] positions -- the projection
to the 30k-word vocabulary is the costly part and every other position would be thrown away. Each mask is
predicted independently from one forward pass (the model sees all masks at once, as in pre-training);
`sequence` fills that one mask with the candidate and leaves any others as [MASK].
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..core.errors import BertlabError
from ..core.labels import IGNORE_INDEX
from . import length_buckets
from .inputs import encode
from .runtime import InferenceOptions, length_limit, load_head, load_tokenizer


class FillMasker:
    """Texts with [MASK] -> per text, per mask, the top-k {token, token_id, score, sequence}."""

    def __init__(self, model, tokenizer, max_length: int | None = None, options: InferenceOptions | None = None):
        if tokenizer.mask_token_id is None:
            raise BertlabError(f"the vocabulary has no {tokenizer.mask_token} token")
        self.model, self.tokenizer = model, tokenizer
        self.options = options or InferenceOptions()
        self.max_length = max_length or length_limit(None, model.config, tokenizer, None)
        self.device = next(model.parameters()).device

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, options: InferenceOptions | None = None) -> "FillMasker":
        options = options or InferenceOptions()
        model = load_head("masked-lm", Path(model_dir), options, purpose="fill-mask")
        tokenizer = load_tokenizer(Path(model_dir))
        return cls(model, tokenizer, length_limit(None, model.config, tokenizer, options.max_seq_length), options)

    def fill(self, texts: Sequence[str], top_k: int = 5, where=None) -> list[list[list[dict[str, Any]]]]:
        if top_k < 1:
            raise BertlabError(f"--top-k must be at least 1, got {top_k}")
        where = where or (lambda i: f"text {i + 1}")
        mask = self.tokenizer.mask_token
        for i, t in enumerate(texts):
            if mask not in t:
                raise BertlabError(f"{where(i)}: no {mask} in the text; put {mask} where a word should be predicted")
        enc = encode(self.tokenizer, texts, self.max_length, self.options.on_long, where=where)
        for i, ids in enumerate(enc.input_ids):
            if self.tokenizer.mask_token_id not in ids:
                raise BertlabError(f"{where(i)}: every {mask} was truncated away (limit {self.max_length} tokens)")
        return length_buckets.run_bucketed(lambda b: self._batch([enc.input_ids[i] for i in b], top_k),
                                     enc.lengths, self.options.max_tokens, self.options.max_batch,
                                     max_waste=self.options.max_waste)

    def logits(self, input_ids: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """(masks, V) MLM logits at each row's [MASK] positions, fp32 (what `fill` ranks)."""
        return self._logits(input_ids)[1]

    @torch.inference_mode()
    def _logits(self, rows):
        inputs = length_buckets.model_inputs(rows, None, self.device)
        at = inputs["input_ids"] == self.tokenizer.mask_token_id  # (B, T)
        # Any family's masked-LM head: given labels, it projects the labelled rows only (the [MASK]s), in order
        logits = self.model(**inputs, labels=torch.where(at, inputs["input_ids"], IGNORE_INDEX)).prediction_logits
        logits = (logits[at] if logits.dim() == 3 else logits).float().cpu()  # (masks in the batch, V)
        counts = at.sum(1).tolist()
        return at.cpu(), list(torch.split(logits, counts))

    def _batch(self, rows, top_k: int) -> list[list[list[dict[str, Any]]]]:
        at, logits = self._logits(rows)
        k = min(top_k, logits[0].shape[-1])
        out = []
        for row, mask_logits, mask_at in zip(rows, logits, at):
            probs = mask_logits.softmax(-1)
            top = probs.topk(k, dim=-1)
            positions = torch.nonzero(mask_at[:len(row)]).flatten().tolist()
            masks = []
            for pos, scores, ids in zip(positions, top.values.tolist(), top.indices.tolist()):
                cands = []
                for score, tid in zip(scores, ids):
                    filled = list(row)
                    filled[pos] = tid
                    cands.append({"token": self.tokenizer.convert_ids_to_tokens(tid), "token_id": tid,
                                  "score": score,
                                  "sequence": self.tokenizer.decode(filled[1:-1], clean_up_tokenization_spaces=True)})
                masks.append(cands)
            out.append(masks)
        return out
