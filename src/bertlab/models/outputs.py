"""What an encoder returns, whatever its family: `EncoderOutput`, below the family folders so that code above
`models/` (the peer engines' wrapper in `infer/engines.py`) can build one without naming a family."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch


@dataclass
class EncoderOutput:
    last_hidden_state: torch.Tensor  # (B, T, H)
    pooler_output: torch.Tensor | None = None  # (B, H); None for encoders built without the pooler
    hidden_states: tuple[torch.Tensor, ...] | None = None  # L+1 of (B, T, H): embeddings, then each layer
    attentions: tuple[torch.Tensor, ...] | None = None  # L of (B, nh, T, T)

    @classmethod
    def of(cls, x: torch.Tensor, hidden_states: list | None, attentions: list | None,
           pooled: torch.Tensor | None = None) -> "EncoderOutput":
        """From an encoder's last state and its lists (None unless asked for)."""
        return cls(x, pooled, tuple(hidden_states) if hidden_states is not None else None,
                   tuple(attentions) if attentions is not None else None)

    def __getitem__(self, index: int) -> Any:
        """`out[0]` is the last hidden state, as with Hugging Face's outputs (None fields are skipped)."""
        return tuple(v for v in (getattr(self, f.name) for f in fields(self)) if v is not None)[index]
