"""Where the real tokens of a padded (B, T) batch sit, and which sequence each belongs to, so position-wise
layers can skip the padding and variable-length attention can take the tokens as they are."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenLayout:
    """Where the N real tokens of a padded (B, T) batch sit: rows of the flattened (B*T, ...) batch, and the
    sequences they form.

    In training the encoder runs every position-wise part of a layer -- projections, FFN, dropout, residual,
    LayerNorm; 12H² of a token's 12H² + 4TH multiply-adds, ~92% at H 512, T 128 -- on the (N, H) real tokens
    only, and pads to (B, T) just for a kernel that needs the rectangle. Padding is dead weight there: on
    WikiText-2 segment pairs 7% of the positions of a batch are padding. (The outputs at padded positions,
    which nothing reads, are then zeros.)

    A sequence is what attention keeps to itself: a row, or -- in a packed row, whose attention mask numbers
    its documents 1, 2, 3, ... -- one document of the row. `cu_seqlens` / `max_seqlen` describe the sequences
    the way variable-length attention kernels take them; `sequences()` is the same tokens as one padded
    rectangle per sequence, for a kernel that needs rectangles."""

    index: torch.Tensor  # (N,) flat positions b * T + t of the real tokens, ascending
    batch_size: int
    seq_len: int
    # (S + 1,) int32 sequence boundaries in the (N, ...) tensor: 0, len_0, len_0 + len_1, ... -- a sequence's
    # tokens are contiguous there whatever their positions in the row. Made once per batch, shared by every
    # layer (and made eagerly: a compiled layer then only reads it)
    cu_seqlens: torch.Tensor
    # packed rows: the same tokens one sequence per row of an (S, T) rectangle, the layout a rectangle kernel
    # pads to; None when each row is one sequence
    packed_sequences: TokenLayout | None = None

    @classmethod
    def of(cls, attention_mask: torch.Tensor, packed: bool | None = None) -> TokenLayout:
        """From a (B, T) mask: 0 at padding; 1 at real tokens, or 1, 2, ... numbering a packed row's documents
        (each document's tokens contiguous). `packed`: whether any row holds several documents, where the caller
        knows (`AttentionMask.documents`); None reads it off the mask (one more wait for the device)."""
        B, T = attention_mask.shape
        flat = attention_mask.reshape(-1)
        index = flat.nonzero().squeeze(1)
        if not (bool((flat > 1).any()) if packed is None else packed):
            lengths = torch.bincount(index // T, minlength=B)  # (B,)
            return cls(index, B, T, _boundaries(lengths[lengths > 0]))
        # a new sequence wherever the row or the document number changes from the token before
        doc = flat.index_select(0, index).long() + (index // T) * (int(flat.max()) + 1)  # unique per (row, doc)
        starts = torch.ones_like(doc, dtype=torch.bool)
        starts[1:] = doc[1:] != doc[:-1]
        sequence = starts.cumsum(0) - 1  # (N,) 0 .. S-1
        cu = _boundaries(torch.bincount(sequence))
        offset = torch.arange(index.numel(), device=index.device) - cu.long()[sequence]
        sequences = cls(sequence * T + offset, int(cu.numel()) - 1, T, cu)
        return cls(index, B, T, cu, sequences)

    @property
    def max_seqlen(self) -> int:
        """An upper bound on a sequence's length: the padded width T. A bound rather than the longest length:
        reading that would wait for the device, and kernels only size their grid by it."""
        return self.seq_len

    @property
    def packed(self) -> bool:
        """Whether some row holds more than one sequence."""
        return self.packed_sequences is not None

    @property
    def sequences(self) -> TokenLayout:
        """The tokens one sequence per row: the layout a rectangle kernel pads to (a plain batch's is its own)."""
        return self.packed_sequences if self.packed_sequences is not None else self

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (N, D)."""
        return x.reshape(-1, x.size(-1)).index_select(0, self.index)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(N, D) -> (B, T, D), zeros at the padded positions."""
        full = x.new_zeros(self.batch_size * self.seq_len, x.size(-1)).index_copy(0, self.index, x)
        return full.view(self.batch_size, self.seq_len, x.size(-1))

    def keep(self) -> torch.Tensor:
        """(B, T) bool, True at the real tokens."""
        keep = torch.zeros(self.batch_size * self.seq_len, dtype=torch.bool, device=self.index.device)
        return keep.index_fill_(0, self.index, True).view(self.batch_size, self.seq_len)


def _boundaries(lengths: torch.Tensor) -> torch.Tensor:
    """(S,) sequence lengths -> (S + 1,) int32 cumulative boundaries 0, len_0, len_0 + len_1, ..."""
    return torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
