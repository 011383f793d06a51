"""The BERT encoder (Devlin et al., 2018, section 3), readable top to bottom.

    input:  [CLS] tok_1 ... tok_n [SEP] (tok'_1 ... [SEP])
    x_0   = LayerNorm(E_token + E_position + E_segment)            # embeddings, then dropout
    x_l   = LayerNorm(x_{l-1} + MultiHeadAttention(x_{l-1}))        # post-LN residual blocks
    x_l   = LayerNorm(x_l + W_2 · GELU(W_1 · x_l + b_1) + b_2)
    pooled = tanh(W_p · x_L[:, 0] + b_p)                            # the [CLS] summary used by NSP

Module and parameter names follow Hugging Face's `BertModel` exactly (`encoder.layer.0.attention.self.query`),
so a `state_dict` moves between bertlab and `transformers` without renaming. Reading and writing files live in
`checkpoint/`; the task heads in `heads.py`; attention's kernels, the unpadded token layout and the fast
element-wise ops in `nn/`.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ...checkpoint.pretrained import load_pretrained, save_pretrained
from .config import BertConfig
from ..outputs import EncoderOutput
from ...nn import AttentionMask, Dropout, TokenLayout, add_and_norm, attention
from ...nn.attention import takes_rows
from ...nn.elementwise import linear_activate
from ...nn.encoder_layer import post_ln_layer

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
    """Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + mask) V, in `num_attention_heads` heads of size H / nh.

    The formula itself is `nn.attention`, with the kernel this model was configured with
    (`config.attn_implementation`: sdpa by default, eager for the probabilities)."""

    # CPU inference stacks these three into one layer in `stacked`: one GEMM for the three, int8
    # (nn/int8_linear.py) or oneDNN-packed fp32/bf16 (nn/packed_linear.py)
    stacked_projections = ("query", "key", "value")

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.stacked: nn.Module | None = None
        # the projections, H -> H each, under the names of the family's checkpoints (DistilBERT: q_lin, ...)
        for name in self.stacked_projections:
            setattr(self, name, nn.Linear(config.hidden_size, config.hidden_size))
        self.dropout_p = config.attention_probs_dropout_prob
        self.attn_implementation = config.attn_implementation

    def forward(self, x: torch.Tensor, mask: AttentionMask | None, output_attentions: bool = False,
                layout: TokenLayout | None = None, bias: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, T, H); or (N, H), the real tokens only, when `layout` says where they sit in (B, T). `bias`:
        an additive (1 | B, nh, T, T) term of the scores (a relative position bias, MPNet's).
        Returns the heads' output in the same shape as x, and the probabilities if asked for."""
        projections = [getattr(self, name) for name in self.stacked_projections]
        if self.training:
            # The three projections as one matmul against the stacked (3H, H) weight -- one pass over x
            # instead of three, forward and backward, ~10% faster than three matmuls on a CPU. The parameters
            # stay three (Hugging Face's names), concatenated per step (3H² floats, cheap).
            w = torch.cat([p.weight for p in projections])
            b = torch.cat([p.bias for p in projections])
            q, k, v = F.linear(x, w, b).chunk(3, dim=-1)  # 3 x (..., H)
        elif self.stacked is not None:  # CPU inference: one GEMM for the three (int8: x quantized once)
            q, k, v = self.stacked(x).chunk(3, dim=-1)
        else:  # inference: each projection may be a pre-packed layer (nn/packed_linear.py)
            q, k, v = (p(x) for p in projections)
        return attention(q, k, v, self.num_heads, mask, bias, layout=layout, kernel=self.attn_implementation,
                         dropout_p=self.dropout_p, training=self.training, need_weights=output_attentions)


class BertSelfOutput(nn.Module):
    """Project the heads back to H, dropout, add the residual, LayerNorm (post-LN)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return add_and_norm(self.dropout(self.dense(y)), residual, self.LayerNorm)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)  # the name Hugging Face's checkpoints use
        self.output = BertSelfOutput(config)

    def forward(self, x, mask, output_attentions=False, layout=None):
        y, probs = self.self(x, mask, output_attentions, layout)
        return self.output(y, x), probs


class BertIntermediate(nn.Module):
    """The first half of the position-wise FFN: GELU(x W_1 + b_1), widening H -> intermediate_size."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.hidden_act = config.hidden_act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, T, 4H); the activation in place when autograd allows, or in the fp32 GEMM's epilogue
        return linear_activate(self.dense, x, self.hidden_act)


class BertOutput(nn.Module):
    """The second half of the FFN, intermediate_size -> H, then dropout, residual and LayerNorm."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return add_and_norm(self.dropout(self.dense(h)), residual, self.LayerNorm)


class BertLayer(nn.Module):
    """One Transformer block: self-attention sub-layer, then feed-forward sub-layer, each post-LN."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x, mask, output_attentions=False, layout=None):
        if not (self.training or output_attentions) and layout is None and (y := self.in_one_call(x, mask)) is not None:
            return y, None
        x, probs = self.attention(x, mask, output_attentions, layout)  # x: (B, T, H), or (N, H) with a layout
        return self.output(self.intermediate(x), x), probs

    def in_one_call(self, x: torch.Tensor, mask: AttentionMask | None) -> torch.Tensor | None:
        """The block in one C call (CPU fp32 inference with packed layers: `nn.encoder_layer`), the same bits as
        the modules above; None where that does not apply."""
        attn = self.attention.self
        if attn.stacked is None:
            return None
        return post_ln_layer(x, mask, attn.stacked, attn.num_heads, attn.attn_implementation,
                             self.attention.output.dense, self.attention.output.LayerNorm, self.intermediate.dense,
                             self.intermediate.hidden_act, self.output.dense, self.output.LayerNorm)


class BertEncoder(nn.Module):
    """`num_hidden_layers` blocks, one after the other: x_l = Layer_l(x_{l-1})."""

    # Training on padded batches computes the position-wise layers on the real tokens only (`TokenLayout`);
    # the same numbers as computing everywhere. False: compute on every position (for comparisons). Where
    # attention takes the real tokens as they are (varlen on a GPU), inference unpads as well.
    unpad_in_training: bool = True
    # the block; a family with BERT's post-LN math under its own names (DistilBERT) sets its own
    layer_class: type[nn.Module] = BertLayer

    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(self.layer_class(config) for _ in range(config.num_hidden_layers))

    def blocks(self) -> list[nn.Module]:
        """The blocks in the order they run, each `block(x, mask, output_attentions, layout) -> (x, probs)`; a
        block may appear more than once (ALBERT shares one block across layers)."""
        return list(self.layer)

    def block_arguments(self, x: torch.Tensor, mask: AttentionMask) -> dict[str, torch.Tensor]:
        """What every block takes besides x and the mask, made once per forward from the (B, T, H) input: none
        for BERT; MPNet's relative position bias."""
        return {}

    def attention_takes_rows(self, x: torch.Tensor) -> bool:
        """Whether the blocks' attention kernel takes x's real tokens as they are (variable-length attention on
        a GPU): then inference unpads too, and no layer computes on padding or builds a (B, T) rectangle."""
        attn = next((m for m in self.blocks()[0].modules() if isinstance(getattr(m, "attn_implementation", None), str)
                     and hasattr(m, "num_heads")), None)
        return attn is not None and takes_rows(attn.attn_implementation, x, x.size(-1) // attn.num_heads)

    def forward(self, x: torch.Tensor, mask: AttentionMask, attention_mask: torch.Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False
                ) -> tuple[torch.Tensor, list[torch.Tensor] | None, list[torch.Tensor] | None]:
        """x: (B, T, H) embeddings -> (last hidden state (B, T, H), every layer's output, every layer's
        attention probabilities); the lists are None unless asked for."""
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        layout = None
        extra = self.block_arguments(x, mask)  # before unpadding: from the (B, T) rectangle
        if (mask.keep is not None or mask.documents is not None) and not (output_hidden_states or output_attentions):
            if (self.training and self.unpad_in_training) or self.attention_takes_rows(x):
                layout = TokenLayout.of(attention_mask, packed=mask.documents is not None)
                x = layout.unpad(x)  # (N, H): the layers compute on real tokens only (see TokenLayout)
        for layer in self.blocks():
            x, probs = layer(x, mask, output_attentions, layout, **extra)
            if hidden_states is not None:
                hidden_states.append(x)
            if attentions is not None:
                attentions.append(probs)
        if layout is not None:
            x = layout.pad(x)  # (B, T, H) again, zeros at padding
        return x, hidden_states, attentions


class BertPooler(nn.Module):
    """pooled = tanh(W_p · h_[CLS] + b_p): the sequence summary NSP and sentence classification read."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))


class BertPreTrainedModel(nn.Module):
    """What every bertlab BERT model shares: the config, Google's initialisation, and the HF-layout checkpoints
    (`checkpoint/` reads and writes the files; the rules that are BERT's are the class attributes here)."""

    config_class = BertConfig
    # Hugging Face's prefix of the encoder's weights inside a `BertFor*` checkpoint (`bert.encoder...`).
    base_model_prefix = "bert"
    # The encoder's own parts: every weight under them must be in a checkpoint, except the optional ones
    # (a masked-LM or token-level model has no pooler). Weights outside them belong to heads.
    base_model_parts: tuple[str, ...] = ("embeddings.", "encoder.", "pooler.")
    optional_base_parts: tuple[str, ...] = ("pooler.",)
    # Buffers older `transformers` versions saved; they carry no learned value.
    ignored_checkpoint_keys: tuple[str, ...] = ("embeddings.position_ids", "embeddings.token_type_ids")
    # Parameters in the checkpoint that are aliases of others (tied); saved once, re-tied on load.
    tied_weight_keys: tuple[str, ...] = ()

    @staticmethod
    def read_tf_checkpoint(path: Path) -> dict[str, torch.Tensor]:
        """Google's TensorFlow checkpoint as a state dict under these classes' names (`tf_names.py`): the
        family's hook, through which `checkpoint/` reads `.index` files without knowing BERT's names."""
        from .tf_names import read_tf_state_dict  # TensorFlow's reader is loaded only for these files

        return read_tf_state_dict(path)

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config

    def init_weights(self, module: nn.Module | None = None) -> None:
        """Google's initialisation: truncated normal(0, initializer_range) cut at 2σ; LayerNorm 1 and 0; biases 0
        (a layer marked `untruncated_init`, a task's added output layer: untruncated normal, see
        `heads.TaskOutputLayer`).

        Also used on a model whose storage was just allocated (`checkpoint.materialize`), so it must set
        every parameter of `module`, leaving none uninitialised."""
        std = self.config.initializer_range
        for m in (module or self).modules():
            if getattr(m, "untruncated_init", False):
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
        """Load from a Hugging Face–layout folder (`config.json` + `model.safetensors`); see `checkpoint/`."""
        return load_pretrained(cls, path, config=config, **kwargs)

    def save_pretrained(self, path, vocab_file=None) -> None:
        """Write `config.json` + `model.safetensors` (and `vocab.txt`) atomically; see `checkpoint/`."""
        save_pretrained(self, path, vocab_file=vocab_file)

    def num_parameters(self) -> int:
        """Distinct parameters (tied weights counted once)."""
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())


class BertModel(BertPreTrainedModel):
    """The bidirectional encoder: embeddings, `num_hidden_layers` blocks, and (optionally) the pooler.

    `model(input_ids, attention_mask=None, token_type_ids=None)` -> `EncoderOutput` with
    `.last_hidden_state` (B, T, H) and `.pooler_output` (B, H); `output_hidden_states=True` adds the
    embeddings and every layer's output, `output_attentions=True` every layer's attention probabilities.
    """

    # The parts a family on BERT's encoder changes (RoBERTa: positions counted from after the padding id; MPNet:
    # a relative position bias in every block)
    embeddings_class: type[nn.Module] = BertEmbeddings
    encoder_class: type[nn.Module] = BertEncoder

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = self.embeddings_class(config)
        self.encoder = self.encoder_class(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.init_weights()

    def embed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
              position_ids: torch.Tensor | None) -> torch.Tensor:
        """The encoder's input (B, T, H): the embeddings (a family with narrower ones projects them here)."""
        return self.embeddings(input_ids, token_type_ids, position_ids)

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T) token ids
        attention_mask: torch.Tensor | None = None,  # (B, T) 1 for tokens, 0 for padding
        token_type_ids: torch.Tensor | None = None,  # (B, T) segment A = 0, segment B = 1
        position_ids: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> EncoderOutput:
        x = self.embed(input_ids, token_type_ids, position_ids)  # (B, T, H)
        # Bidirectional: every query sees every real key. No mask at all when nothing is padded, so a fused
        # kernel may run without one.
        mask = AttentionMask.padding(attention_mask)
        x, hidden_states, attentions = self.encoder(x, mask, attention_mask, output_hidden_states, output_attentions)
        return EncoderOutput.of(x, hidden_states, attentions, self.pooler(x) if self.pooler is not None else None)
