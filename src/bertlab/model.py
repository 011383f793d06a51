"""The BERT encoder (Devlin et al., 2018, section 3), readable top to bottom.

    input:  [CLS] tok_1 ... tok_n [SEP] (tok'_1 ... [SEP])
    x_0   = LayerNorm(E_token + E_position + E_segment)            # embeddings, then dropout
    x_l   = LayerNorm(x_{l-1} + MultiHeadAttention(x_{l-1}))        # post-LN residual blocks
    x_l   = LayerNorm(x_l + W_2 · GELU(W_1 · x_l + b_1) + b_2)
    pooled = tanh(W_p · x_L[:, 0] + b_p)                            # the [CLS] summary used by NSP

Module and parameter names follow Hugging Face's `BertModel` exactly (`encoder.layer.0.attention.self.query`),
so a `state_dict` moves between bertlab and `transformers` without renaming. Loading and saving live in
`checkpoint.py`; the task heads in `heads.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .config import BertConfig

ACTIVATIONS = {
    "gelu": nn.GELU(),  # exact: x · Φ(x), with the erf, as Google's `gelu`
    "gelu_new": nn.GELU(approximate="tanh"),
    "gelu_pytorch_tanh": nn.GELU(approximate="tanh"),
    "relu": nn.ReLU(),
    "silu": nn.SiLU(),
    "swish": nn.SiLU(),
    "tanh": nn.Tanh(),
}

# The same functions overwriting their input. Without autograd (inference) the FFN's widest tensor, (B, T, 4H),
# then needs one buffer instead of two: on a CPU a fresh buffer that size costs page faults, and the extra
# allocation was ~10% of a MiniLM forward pass.
INPLACE_ACTIVATIONS = {
    "gelu": torch.ops.aten.gelu_,
    "gelu_new": lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
    "relu": torch.relu_,
    "silu": lambda x: F.silu(x, inplace=True),
    "swish": lambda x: F.silu(x, inplace=True),
    "tanh": torch.tanh_,
}


@dataclass
class BertModelOutput:
    last_hidden_state: torch.Tensor  # (B, T, H)
    pooler_output: torch.Tensor | None = None  # (B, H); None for encoders built without the pooler
    hidden_states: tuple[torch.Tensor, ...] | None = None  # L+1 of (B, T, H): embeddings, then each layer
    attentions: tuple[torch.Tensor, ...] | None = None  # L of (B, nh, T, T)

    def __getitem__(self, index: int) -> Any:
        """`out[0]` is the last hidden state, as with Hugging Face's outputs (None fields are skipped)."""
        return tuple(v for v in (getattr(self, f.name) for f in fields(self)) if v is not None)[index]


def additive_attention_mask(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, 1, 1, T) bool, True = token  ->  additive mask in `dtype`: 0 for tokens, the dtype's minimum for padding.

    Additive rather than boolean: a row with no visible key (an all-padding sequence) then softmaxes to a
    uniform distribution instead of NaN. Built in the dtype attention runs in (bf16/fp16 under autocast),
    so the minimum is representable there.
    """
    return (~keep).to(dtype) * torch.finfo(dtype).min


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Inverted dropout. On the CPU the keep-mask comes from 16-bit slices of 64-bit random integers, which
    is ~10x faster than `F.dropout`'s per-element Bernoulli draws (dropout was a fifth of a BERT-Mini training
    step on CPU); p is quantised to 1/65536. Elsewhere, and in eval mode, it is `F.dropout`."""
    if not training or p == 0.0 or x.device.type != "cpu":
        return F.dropout(x, p, training)
    n = x.numel()
    bits = torch.randint(-2**63, 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64).view(torch.int16)[:n].view(x.shape)
    keep = bits >= round(p * 65536) - 32768  # P(int16 < t) = (t + 32768) / 65536 = p
    return x * (keep.to(x.dtype) * (1.0 / (1.0 - p)))


def add_residual(y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """y + residual, written into y: neither a linear layer's nor dropout's backward needs its own output, so
    the sum can take y's buffer instead of a new (B, T, H) one. (Under autocast y may be bf16 and the residual
    fp32; the sum then needs the wider type and a new tensor.)"""
    if y.dtype != torch.promote_types(y.dtype, residual.dtype):
        return y + residual
    return y.add_(residual)


@dataclass(frozen=True)
class TokenLayout:
    """Where the N real tokens of a padded (B, T) batch sit: rows of the flattened (B*T, ...) batch.

    In training the encoder runs every position-wise part of a layer -- projections, FFN, dropout, residual,
    LayerNorm; 12H² of a token's 12H² + 4TH multiply-adds, ~92% at H 512, T 128 -- on the (N, H) real tokens only, and pads to (B, T) just for attention,
    which needs the rectangle. Padding is dead weight there: on WikiText-2 segment pairs 7% of the positions
    of a batch are padding. (The outputs at padded positions, which nothing reads, are then zeros.)"""

    index: torch.Tensor  # (N,) flat positions b * T + t of the real tokens, ascending
    batch_size: int
    seq_len: int

    @classmethod
    def of(cls, attention_mask: torch.Tensor) -> TokenLayout:
        B, T = attention_mask.shape
        return cls(attention_mask.reshape(-1).nonzero().squeeze(1), B, T)

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (N, D)."""
        return x.reshape(-1, x.size(-1)).index_select(0, self.index)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(N, D) -> (B, T, D), zeros at the padded positions."""
        full = x.new_zeros(self.batch_size * self.seq_len, x.size(-1)).index_copy(0, self.index, x)
        return full.view(self.batch_size, self.seq_len, x.size(-1))


class Dropout(nn.Dropout):
    """`nn.Dropout` through `dropout` above."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


class BertEmbeddings(nn.Module):
    """E = LayerNorm(word[input_ids] + position[0..T-1] + token_type[segment ids]), then dropout."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        B, T = input_ids.shape
        if T > self.position_embeddings.num_embeddings:
            raise ValueError(
                f"sequence length {T} exceeds max_position_embeddings ({self.position_embeddings.num_embeddings})"
            )
        if position_ids is None:
            position_ids = torch.arange(T, device=input_ids.device)[None, :]  # (1, T)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids) \
            + self.token_type_embeddings(token_type_ids)  # (B, T, H)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    """Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + mask) V, in `num_attention_heads` heads of size H / nh."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_size = config.head_size
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None, output_attentions: bool = False,
                layout: TokenLayout | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, T, H); or (N, H), the real tokens only, when `layout` says where they sit in (B, T).
        Returns the heads' output in the same shape as x, and the probabilities if asked for."""
        if torch.is_grad_enabled() and self.query.weight.requires_grad:
            # Training: the three projections as one matmul against the stacked (3H, H) weight -- one pass
            # over x instead of three, forward and backward, ~10% faster than three matmuls on a CPU. The
            # parameters stay three (Hugging Face's names), concatenated per step (3H² floats, cheap).
            w = torch.cat([self.query.weight, self.key.weight, self.value.weight])
            b = torch.cat([self.query.bias, self.key.bias, self.value.bias])
            qkv = F.linear(x, w, b)  # (..., 3H)
            q, k, v = (layout.pad(qkv) if layout is not None else qkv).chunk(3, dim=-1)
        else:  # inference: each projection may be a pre-packed layer (infer/onednn.py)
            q, k, v = self.query(x), self.key(x), self.value(x)
            if layout is not None:
                q, k, v = (layout.pad(t) for t in (q, k, v))
        # attention needs the (B, T) rectangle: padded above, the padding dropped again at the end
        B, T, H = q.shape
        # (B, T, H) -> (B, nh, T, hs)
        q, k, v = (t.view(B, T, self.num_heads, self.head_size).transpose(1, 2) for t in (q, k, v))
        mask = additive_attention_mask(keep, q.dtype) if keep is not None else None  # (B, 1, 1, T)
        dropout_p = self.dropout_p if self.training else 0.0
        if output_attentions or (dropout_p > 0 and x.device.type == "cpu"):
            # The explicit path, for callers who want the probabilities themselves, and for CPU training,
            # where SDPA would take this same math path but with the slow dropout.
            # In place: the matmul's backward needs q and k, not its output, so scaling and masking may
            # overwrite it instead of allocating two more (B, nh, T, T) tensors.
            scores = (q @ k.transpose(-2, -1)).mul_(1.0 / math.sqrt(self.head_size))  # (B, nh, T, T)
            if mask is not None:
                scores.add_(mask)
            probs = scores.softmax(dim=-1)
            y = dropout(probs, dropout_p, self.training) @ v  # (B, nh, T, hs)
        else:
            probs = None
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        y = y.transpose(1, 2).reshape(B, T, H)  # re-assemble the heads side by side
        return (layout.unpad(y) if layout is not None else y), probs


class BertSelfOutput(nn.Module):
    """Project the heads back to H, dropout, add the residual, LayerNorm (post-LN)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(add_residual(self.dropout(self.dense(y)), residual))


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)  # the name Hugging Face's checkpoints use
        self.output = BertSelfOutput(config)

    def forward(self, x, keep, output_attentions=False, layout=None):
        y, probs = self.self(x, keep, output_attentions, layout)
        return self.output(y, x), probs


class BertIntermediate(nn.Module):
    """The first half of the position-wise FFN: GELU(x W_1 + b_1), widening H -> intermediate_size."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = ACTIVATIONS[config.hidden_act]
        self.act_ = INPLACE_ACTIVATIONS[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dense(x)  # (B, T, 4H)
        if torch.is_grad_enabled() and h.requires_grad:
            return self.act(h)  # autograd keeps h for the backward pass
        return self.act_(h)


class BertOutput(nn.Module):
    """The second half of the FFN, intermediate_size -> H, then dropout, residual and LayerNorm."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(add_residual(self.dropout(self.dense(h)), residual))


class BertLayer(nn.Module):
    """One Transformer block: self-attention sub-layer, then feed-forward sub-layer, each post-LN."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x, keep, output_attentions=False, layout=None):
        x, probs = self.attention(x, keep, output_attentions, layout)  # x: (B, T, H), or (N, H) with a layout
        return self.output(self.intermediate(x), x), probs


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))


class BertPooler(nn.Module):
    """pooled = tanh(W_p · h_[CLS] + b_p): the sequence summary NSP and sentence classification read."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))


class TaskOutputLayer(nn.Linear):
    """The one layer a fine-tuning task adds on the encoder (classifier, QA start/end scores). An `nn.Linear`
    (same parameter names), told apart only so `init_weights` can initialise it N(0, σ²) untruncated, as
    Hugging Face's heads do, where Google's code truncates at 2σ: on CoNLL-2003 (MiniLM-L6, 800 sentences,
    6 seeds) the untruncated start gave dev F1 0.525 against 0.481, better in all 6 seed pairs."""


class BertPreTrainedModel(nn.Module):
    """What every bertlab model shares: the config, Google's initialisation, and the HF-layout checkpoints."""

    # Parameters in the checkpoint that are aliases of others (tied); saved once, re-tied on load.
    tied_weight_keys: tuple[str, ...] = ()

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config

    def init_weights(self, module: nn.Module | None = None) -> None:
        """Google's initialisation: truncated normal(0, initializer_range) cut at 2σ; LayerNorm 1 and 0; biases 0
        (a task's added output layer: untruncated normal, see `TaskOutputLayer`).

        Also used on a model whose storage was just allocated (`checkpoint.materialize`), so it must set
        every parameter of `module`, leaving none uninitialised."""
        std = self.config.initializer_range
        for m in (module or self).modules():
            if isinstance(m, TaskOutputLayer):
                nn.init.normal_(m.weight, mean=0.0, std=std)
                nn.init.zeros_(m.bias)
            elif isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.trunc_normal_(m.weight, mean=0.0, std=std, a=-2 * std, b=2 * std)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(getattr(m, "bias", None), nn.Parameter):  # a free-standing bias (the MLM output bias)
                nn.init.zeros_(m.bias)

    @classmethod
    def from_pretrained(cls, path, config: BertConfig | None = None, **kwargs):
        """Load from a Hugging Face–layout folder (`config.json` + `model.safetensors`); see `checkpoint.py`."""
        from .checkpoint import load_pretrained  # checkpoint.py imports this module; defer the reverse edge

        return load_pretrained(cls, path, config=config, **kwargs)

    def save_pretrained(self, path, vocab_file=None) -> None:
        """Write `config.json` + `model.safetensors` (and `vocab.txt`) atomically; see `checkpoint.py`."""
        from .checkpoint import save_pretrained

        save_pretrained(self, path, vocab_file=vocab_file)

    def num_parameters(self) -> int:
        """Distinct parameters (tied weights counted once)."""
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())


class BertModel(BertPreTrainedModel):
    """The bidirectional encoder: embeddings, `num_hidden_layers` blocks, and (optionally) the pooler.

    `model(input_ids, attention_mask=None, token_type_ids=None)` -> `BertModelOutput` with
    `.last_hidden_state` (B, T, H) and `.pooler_output` (B, H); `output_hidden_states=True` adds the
    embeddings and every layer's output, `output_attentions=True` every layer's attention probabilities.
    """

    # Training on padded batches computes the position-wise layers on the real tokens only (`TokenLayout`);
    # the same numbers as computing everywhere. False: compute on every position (for comparisons).
    unpad_in_training: bool = True

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T) token ids
        attention_mask: torch.Tensor | None = None,  # (B, T) 1 for tokens, 0 for padding
        token_type_ids: torch.Tensor | None = None,  # (B, T) segment A = 0, segment B = 1
        position_ids: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> BertModelOutput:
        x = self.embeddings(input_ids, token_type_ids, position_ids)  # (B, T, H)
        # No mask at all when nothing is padded: SDPA may then pick its fastest kernel.
        keep = None
        if attention_mask is not None and not bool(attention_mask.all()):
            keep = attention_mask[:, None, None, :].bool()  # (B, 1, 1, T): which keys each query may see
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        layout = None
        if keep is not None and self.unpad_in_training and self.training and torch.is_grad_enabled() \
                and not (output_hidden_states or output_attentions):
            layout = TokenLayout.of(attention_mask)
            x = layout.unpad(x)  # (N, H): the layers compute on real tokens only (see TokenLayout)
        for layer in self.encoder.layer:
            x, probs = layer(x, keep, output_attentions, layout)
            if hidden_states is not None:
                hidden_states.append(x)
            if attentions is not None:
                attentions.append(probs)
        if layout is not None:
            x = layout.pad(x)  # (B, T, H) again, zeros at padding
        return BertModelOutput(
            last_hidden_state=x,
            pooler_output=self.pooler(x) if self.pooler is not None else None,
            hidden_states=tuple(hidden_states) if hidden_states is not None else None,
            attentions=tuple(attentions) if attentions is not None else None,
        )
