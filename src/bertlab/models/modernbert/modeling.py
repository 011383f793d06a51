"""The ModernBERT encoder (Warner et al., 2024, "Smarter, Better, Faster, Longer"), readable top to bottom.

    x_0 = LayerNorm(E_token[input_ids])                                   # no positions added: rotary below
    x_l = x_{l-1} + W_o · Attention(RoPE(LayerNorm(x_{l-1})))             # pre-norm; layer 0's norm is identity
    x_l = x_l + W_o' · (act(x_l W_i,value) ⊙ (x_l W_i,gate))              # GeGLU, after its own LayerNorm
    out = LayerNorm(x_L)                                                  # final norm

    * no biases anywhere by default (`attention_bias`, `mlp_bias`, `norm_bias`: LayerNorms have a gain only);
    * rotary positions (Su et al.) on q and k, base θ = 160,000 on global layers and 10,000 on local ones;
    * attention alternates: layer i is global when i % 3 == 0 (`layer_types`), else local -- a query at i sees
      the keys j with |i - j| <= local_attention // 2 (64 of the release's 128) and nothing else.

Positions are 0 .. T-1 along the padded row, as in `transformers` (so a right-padded row's tokens have the
positions they have alone). Module and parameter names are Hugging Face's `ModernBertModel`'s
(`layers.0.attn.Wqkv`, `layers.1.mlp.Wi`), so a state_dict moves between bertlab and `transformers` as it is.

The local window holds in every path: the padded rectangle (every CPU kernel of `nn/attention.py`, fp32 / bf16
/ int8), the unpadded token layout of training, and variable-length FlashAttention on a GPU (its
`window=(left, right)`). Past two windows' length a local layer computes block by block, each block of
queries against its keys and the window on either side, so it does the window's work in memory
proportional to the tokens rather than a T x T score matrix (`local_attention`); a traced export (ONNX) records
the same blocks as shapes computed from each input's length (`traced_local_attention`), so the exported graph
keeps that memory too. CPU inference (fp32; bf16 and int8 where the CPU has AVX-512 BF16 but no AMX) skips the
blocks: the C loops take the window themselves, each tile of queries computing only the key blocks it reaches
(`window_attention`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..bert.modeling import BertPreTrainedModel
from ..outputs import EncoderOutput
from ...nn import AttentionMask, Dropout, TokenLayout, attention
from ...nn.attention import get_kernel, takes_rows, varlen_flash, varlen_flash_runs, window_attention
from ...nn.elementwise import activate, add_residual
from ...nn.cpu_kernels import rotate_qk_
from .config import ModernBertConfig


# ----------------------------------------------------------------------------------------------- rotary
def rotary_tables(config: ModernBertConfig, layer_type: str, T: int, dtype: torch.dtype,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each (T, hs), for positions 0 .. T-1: angle(t, i) = t · θ^(-2i/hs), the hs/2 frequencies
    written twice (the rotation pairs dimension i with i + hs/2). In fp32, then cast to the model's dtype, as
    `transformers` computes them."""
    hs = config.head_size
    inv_freq = 1.0 / (config.rope_theta(layer_type) ** (torch.arange(0, hs, 2, dtype=torch.float) / hs))  # (hs/2,)
    freqs = torch.arange(T, device=device).float()[:, None] * inv_freq.to(device)  # (T, hs/2)
    angles = torch.cat((freqs, freqs), dim=-1)  # (T, hs)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x · cos + rotate_half(x) · sin, in fp32, back in x's dtype. x (..., nh, hs); cos, sin (..., 1, hs)."""
    xf = x.float()
    half = xf.size(-1) // 2
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


# ----------------------------------------------------------------------------------------------- attention
def band_bias(T_q: int, T_k: int, q_start: int, k_start: int, window: int, keep: torch.Tensor | None,
              dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The additive mask of local attention for queries at q_start .. q_start + T_q - 1 against keys at
    k_start .. k_start + T_k - 1: 0 where |i - j| <= window and the key is a real token, the dtype's minimum
    elsewhere. (B | 1, 1, T_q, T_k); `keep` (B, T_k) marks the real keys (None: all are)."""
    i = torch.arange(q_start, q_start + T_q, device=device)[:, None]
    j = torch.arange(k_start, k_start + T_k, device=device)[None, :]
    allowed = ((i - j).abs() <= window)[None, None]  # (1, 1, T_q, T_k)
    if keep is not None:
        allowed = allowed & keep[:, None, None, :]
    return (~allowed).to(dtype) * torch.finfo(dtype).min


def local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int, window: int,
                    keep: torch.Tensor | None, *, layout: TokenLayout | None = None, kernel: str = "sdpa",
                    dropout_p: float = 0.0, training: bool = False, need_weights: bool = False
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention where query i sees only the keys j with |i - j| <= window, over q, k, v (B, T, H) -- or (N, H)
    rows of real tokens with `layout`. `keep` (B, T) marks the real tokens (None: no padding).

    On a GPU with variable-length FlashAttention the rows go to it as they are, with its window. A CPU inference
    kernel with a windowed form takes the padded rows in one call (`nn.attention.window_attention`: each tile of
    queries computes only the key blocks its window reaches). Elsewhere the rows are padded and attention runs in
    blocks of 2·window queries, each against the keys from window before its first query to window after its
    last, through the model's kernel (`nn.attention.attention`) with the band as an additive mask: (2w x 4w)
    scores a block, not (T x T). Short rows (or the probabilities asked for) are one call with the whole band."""
    p = dropout_p if training else 0.0
    if layout is not None:
        N, H = q.shape
        hs = H // num_heads
        if not need_weights and get_kernel(kernel).unpadded and varlen_flash_runs(q.device, q.dtype, hs):
            rows = [t.view(N, num_heads, hs) for t in (q, k, v)]  # (N, nh, hs)
            return varlen_flash(*rows, layout, p, None, window=(window, window)).reshape(N, H), None
        y, probs = local_attention(layout.pad(q), layout.pad(k), layout.pad(v), num_heads, window, layout.keep(),
                                   kernel=kernel, dropout_p=dropout_p, training=training, need_weights=need_weights)
        return layout.unpad(y), probs
    B, T, H = q.shape
    block = 2 * window if window > 0 else 1
    run = lambda qs, ks, vs, bias: attention(qs, ks, vs, num_heads, None, bias, kernel=kernel,  # noqa: E731
                                             dropout_p=dropout_p, training=training, need_weights=need_weights)
    if torch.jit.is_tracing() and window > 0 and not need_weights:
        # a traced export: the loop below would be unrolled for the tracing example's length, so the blocks
        # are shapes the graph computes for each input instead
        return traced_local_attention(q, k, v, num_heads, window, keep), None
    if not (need_weights or p > 0) and (y := window_attention(q, k, v, num_heads, window, keep, kernel)) is not None:
        return y, None  # a CPU inference kernel with the window in its loops: the whole row in one call
    # one call with the whole band: short rows and the probabilities
    if need_weights or T <= block + 2 * window or torch.jit.is_tracing():
        return run(q, k, v, band_bias(T, T, 0, 0, window, keep, q.dtype, q.device))
    out = q.new_empty(B, T, H)
    biases: dict[tuple[int, int, int], torch.Tensor] = {}  # every inner block has the same band: made once
    for start in range(0, T, block):
        end = min(T, start + block)
        k0, k1 = max(0, start - window), min(T, end + window)
        if keep is not None:
            bias = band_bias(end - start, k1 - k0, start, k0, window, keep[:, k0:k1], q.dtype, q.device)
        else:
            shape = (end - start, k1 - k0, start - k0)
            if shape not in biases:
                biases[shape] = band_bias(end - start, k1 - k0, start, k0, window, None, q.dtype, q.device)
            bias = biases[shape]
        out[:, start:end] = run(q[:, start:end], k[:, k0:k1], v[:, k0:k1], bias)[0]  # (B, block, H)
    return out, None


def traced_local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int, window: int,
                           keep: torch.Tensor | None) -> torch.Tensor:
    """`local_attention`'s blocks in operators a trace records with the length as a variable, so an exported
    graph (ONNX) does the window's work for every input length: (2w x 4w) scores a block, memory proportional
    to the tokens, where one call with the band would hold T x T scores and a T x T mask on each local layer.
    q, k, v (B, T, H); `keep` (B, T) marks the real tokens (None: all are) -> (B, T, H).

    The row is padded to whole blocks of 2w queries; the keys, padded by w more on the left, then fall in
    blocks of 2w too, and block n's keys (w before its first query to w after its last) are key blocks n and
    n + 1 side by side -- reshapes, a slice and a concatenation, no gather. Keys past the row's end or at
    padding are masked, as the band does."""
    B, T, H = q.shape
    nh, hs, w = num_heads, H // num_heads, window
    block = 2 * w
    pad = (block - T % block) % block  # traced: the graph computes it from each input's length
    nb = (T + pad) // block
    real = keep if keep is not None else torch.ones(B, T, dtype=torch.bool, device=q.device)

    def query_blocks(t: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, nh, nb, 2w, hs)
        return F.pad(t, (0, 0, 0, pad)).view(B, nb, block, nh, hs).permute(0, 3, 1, 2, 4)

    def key_blocks(t: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, nh, nb, 4w, hs): block n's keys
        t = F.pad(t, (0, 0, w, pad + w)).view(B, nb + 1, block, nh, hs).permute(0, 3, 1, 2, 4)
        return torch.cat((t[:, :, :-1], t[:, :, 1:]), dim=3)

    scores = torch.matmul(query_blocks(q), key_blocks(k).transpose(-1, -2)) * (1.0 / math.sqrt(hs))
    # query r of a block sits at key column r + w of its (4w) keys: it sees columns r .. r + 2w
    r = torch.arange(block, device=q.device)[:, None]
    c = torch.arange(2 * block, device=q.device)[None, :]
    band = (c >= r) & (c <= r + block)  # (2w, 4w), the same for every block
    real = F.pad(real, (w, pad + w), value=False).view(B, nb + 1, block)
    real = torch.cat((real[:, :-1], real[:, 1:]), dim=2)  # (B, nb, 4w): each block's keys that are tokens
    allowed = band[None, None, None] & real[:, None, :, None, :]  # (B, 1, nb, 2w, 4w)
    scores = scores + (~allowed).to(scores.dtype) * torch.finfo(scores.dtype).min
    y = torch.matmul(scores.softmax(dim=-1), key_blocks(v))  # (B, nh, nb, 2w, hs)
    return y.permute(0, 2, 3, 1, 4).reshape(B, nb * block, H)[:, :T]


class ModernBertAttention(nn.Module):
    """Multi-head self-attention with rotary positions on q and k; global, or local within `window` tokens."""

    def __init__(self, config: ModernBertConfig, layer_id: int):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.layer_type = config.layer_types[layer_id]
        self.window = config.sliding_window if self.layer_type == "sliding_attention" else None
        self.Wqkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.attention_bias)
        self.Wo = nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)
        self.dropout_p = config.attention_dropout
        self.out_drop = Dropout(config.attention_dropout)
        self.attn_implementation = config.attn_implementation

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], keep: torch.Tensor | None,
                mask: AttentionMask | None, layout: TokenLayout | None = None, output_attentions: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, T, H), or (N, H) with `layout`; rope: cos, sin (T, 1, hs) or (N, 1, hs)."""
        shape, H = x.shape[:-1], x.size(-1)
        qkv = self.Wqkv(x).view(*shape, 3, self.num_heads, H // self.num_heads)  # (..., 3, nh, hs)
        cos, sin = rope
        rotated = rotate_qk_(qkv, cos.squeeze(-2), sin.squeeze(-2))  # fp32 / bf16 inference: one C pass, in place
        q, k, v = qkv.unbind(-3)  # 3 x (..., nh, hs)
        if not rotated:
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        q, k, v = (t.reshape(*shape, H) for t in (q, k, v))  # (..., H): heads side by side again
        common = dict(layout=layout, kernel=self.attn_implementation, dropout_p=self.dropout_p,
                      training=self.training, need_weights=output_attentions)
        if self.window is None:
            y, probs = attention(q, k, v, self.num_heads, mask, **common)
        else:
            y, probs = local_attention(q, k, v, self.num_heads, self.window, keep, **common)
        return self.out_drop(self.Wo(y)), probs


class ModernBertMLP(nn.Module):
    """GeGLU: Wo · (act(x W_value) ⊙ x W_gate), both halves from one matrix `Wi` (value first, gate second)."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.Wi = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.activation = config.hidden_activation
        self.drop = Dropout(config.mlp_dropout)
        self.Wo = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = self.Wi(x).chunk(2, dim=-1)  # 2 x (..., I)
        # the activation written over the value half where autograd does not need it: one (..., I) buffer
        return self.Wo(self.drop(activate(value, self.activation) * gate))


class ModernBertEncoderLayer(nn.Module):
    """x + Attention(norm(x)), then + MLP(norm(x)): pre-norm. Layer 0 reads the embeddings' norm directly."""

    def __init__(self, config: ModernBertConfig, layer_id: int):
        super().__init__()
        self.attn_norm = nn.Identity() if layer_id == 0 else norm(config)
        self.attn = ModernBertAttention(config, layer_id)
        self.mlp_norm = norm(config)
        self.mlp = ModernBertMLP(config)

    def forward(self, x, rope, keep, mask, layout=None, output_attentions=False):
        y, probs = self.attn(self.attn_norm(x), rope, keep, mask, layout, output_attentions)
        x = add_residual(y, x)  # into y, a fresh output: no third (..., H) buffer
        return add_residual(self.mlp(self.mlp_norm(x)), x), probs


def norm(config: ModernBertConfig) -> nn.LayerNorm:
    return nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)


class ModernBertEmbeddings(nn.Module):
    """LayerNorm(E_token[input_ids]), then dropout: no position or type table (positions are rotary)."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.norm = norm(config)
        self.drop = Dropout(config.embedding_dropout)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.drop(self.norm(self.tok_embeddings(input_ids)))


# ----------------------------------------------------------------------------------------------- models
class ModernBertPreTrainedModel(BertPreTrainedModel):
    """The config, ModernBERT's initialisation, and the Hugging Face–layout checkpoints (`checkpoint/`)."""

    config_class = ModernBertConfig
    base_model_prefix = "model"  # `ModernBertFor*` hold the encoder as `model.`
    base_model_parts = ("embeddings.", "layers.", "final_norm.")
    optional_base_parts = ()
    ignored_checkpoint_keys = ()
    read_tf_checkpoint = None  # no TensorFlow release

    def init_weights(self, module: nn.Module | None = None) -> None:
        """Hugging Face's initialisation: weights truncated normal at `initializer_cutoff_factor` σ, σ =
        initializer_range for inputs (embeddings, Wqkv, Wi), σ / √(2L) for outputs (attention and MLP Wo, the
        prediction head's dense, the decoder), hidden_size^-½ for a task's classifier; biases 0, norms 1 and 0."""
        c = self.config
        cutoff = c.initializer_cutoff_factor
        stds = {"in": c.initializer_range, "out": c.initializer_range / math.sqrt(2.0 * c.num_hidden_layers),
                "final_out": c.hidden_size ** -0.5}

        def init(layer: nn.Module, std: float) -> None:
            nn.init.trunc_normal_(layer.weight, mean=0.0, std=std, a=-cutoff * std, b=cutoff * std)
            if getattr(layer, "bias", None) is not None:
                nn.init.zeros_(layer.bias)

        for m in (module or self).modules():
            if isinstance(m, ModernBertEmbeddings):
                init(m.tok_embeddings, stds["in"])
            elif isinstance(m, ModernBertAttention):
                init(m.Wqkv, stds["in"])
                init(m.Wo, stds["out"])
            elif isinstance(m, ModernBertMLP):
                init(m.Wi, stds["in"])
                init(m.Wo, stds["out"])
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif getattr(m, "tied_decoder", False):  # the weight is the embeddings': only the bias is its own
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif getattr(m, "initializer_std", None) is not None:  # a head's layer: its own σ
                init(m, stds[m.initializer_std])
            elif isinstance(getattr(m, "bias", None), nn.Parameter) and not isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)


class ModernBertModel(ModernBertPreTrainedModel):
    """`model(input_ids, attention_mask=None)` -> `.last_hidden_state` (B, T, H), after the final norm; no pooler."""

    # Training on padded batches computes the position-wise layers on the real tokens only (`TokenLayout`);
    # inference too where attention takes the rows as they are (variable-length attention on a GPU).
    unpad_in_training: bool = True

    def __init__(self, config: ModernBertConfig):
        super().__init__(config)
        self.embeddings = ModernBertEmbeddings(config)
        self.layers = nn.ModuleList(ModernBertEncoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.final_norm = norm(config)
        self.init_weights()

    def blocks(self) -> list[nn.Module]:
        """The layers in the order they run (gradual unfreezing and sharding walk them)."""
        return list(self.layers)

    def unfreezing_groups(self) -> list[nn.Module]:
        """Gradual unfreezing's groups, bottom to top: the embeddings, each layer, and the final norm with the
        top layer -- it normalises that layer's output, as the top block's own LayerNorm does in BERT's
        post-norm layers; left out, it would train from the first step beside the new head."""
        *lower, top = self.blocks()
        return [self.embeddings, *lower, nn.ModuleList([top, self.final_norm])]

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        attention_mask: torch.Tensor | None = None,  # (B, T) 1 for tokens, 0 for padding
        token_type_ids: torch.Tensor | None = None,  # accepted for the shared call surface; ModernBERT has none
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> EncoderOutput:
        B, T = input_ids.shape
        if T > self.config.max_position_embeddings:
            raise ValueError(f"sequence length {T} exceeds max_position_embeddings "
                             f"({self.config.max_position_embeddings})")
        x = self.embeddings(input_ids)  # (B, T, H)
        mask = AttentionMask.padding(attention_mask)
        if mask.documents is not None:
            raise ValueError("ModernBERT takes an attention mask of 0 and 1 (no packed rows: positions count "
                             "along the row)")
        keep = mask.keep  # (B, T) bool, or None without padding
        layout = None
        if keep is not None and not (output_hidden_states or output_attentions):
            hs = self.config.head_size
            if (self.training and self.unpad_in_training) or takes_rows(self.config.attn_implementation, x, hs):
                layout = TokenLayout.of(attention_mask, packed=False)
                x = layout.unpad(x)  # (N, H): every position-wise layer on the real tokens only
        ropes = {}
        for layer_type in set(self.config.layer_types):
            cos, sin = rotary_tables(self.config, layer_type, T, x.dtype, x.device)  # (T, hs) each
            if layout is not None:  # each real token's own position: its place along the padded row
                where = layout.index % T
                cos, sin = cos[where], sin[where]  # (N, hs)
            ropes[layer_type] = (cos.unsqueeze(-2), sin.unsqueeze(-2))  # (T | N, 1, hs): broadcast over heads
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        for layer in self.layers:
            x, probs = layer(x, ropes[layer.attn.layer_type], keep, mask, layout, output_attentions)
            if hidden_states is not None:
                hidden_states.append(x)
            if attentions is not None:
                attentions.append(probs)
        x = self.final_norm(x)
        if hidden_states is not None:  # the last entry is the final norm's output, as in transformers
            hidden_states[-1] = x
        if layout is not None:
            x = layout.pad(x)  # (B, T, H), zeros at padding
        return EncoderOutput.of(x, hidden_states, attentions)
