"""T5, the text-to-text Transformer (Raffel et al., 2020, section 2.1), readable top to bottom.

    x_0 = Dropout(E[ids])                                     # no position embeddings: positions enter as a bias
    x   = x + Dropout(SelfAttention(RMSNorm(x), bias=b_rel))  # pre-norm blocks; attention without 1/sqrt(d)
    x   = x + Dropout(CrossAttention(RMSNorm(x), encoder))    # decoder only
    x   = x + Dropout(W_o · Dropout(act(W_i · RMSNorm(x))))   # v1.0: ReLU; v1.1: GELU(W_i0 x) * (W_i1 x)
    h   = Dropout(RMSNorm(x_L))
    logits = E · (h · d_model^-0.5)    (v1.0, tied)   |   W_lm · h    (v1.1, untied)

No linear layer has a bias. The relative position bias b_rel is one (num_buckets, num_heads) table per stack,
held by the stack's first layer and added in every layer (bidirectional buckets in the encoder,
one-directional in the decoder); cross-attention has none.

The three architectures of the paper's section 3.2 are one switch, `config.architecture`, on these blocks:
    encoder-decoder  the encoder reads the input with a fully visible mask; the decoder generates the target
                     with a causal mask and attends to the encoder (T5)
    decoder-only     one stack, no cross-attention, over [input ; target] with a causal mask (a language model)
    prefix-lm        the same stack with a prefix mask: fully visible over the input, causal over the target
Every architecture is called the same way -- `model(input_ids, attention_mask, decoder_input_ids | labels)` --
and returns logits for the target positions, so an objective or a task does not care which one it trains.
The decoder-only stacks hold their own relative position table; prefix-lm uses bidirectional buckets (keys
after a query exist inside the prefix), decoder-only one-directional ones, as a decoder.

Module and parameter names follow Hugging Face's `T5ForConditionalGeneration` exactly
(`encoder.block.0.layer.0.SelfAttention.q.weight`), so `state_dict`s move between bertlab and `transformers`
without renaming; files are `checkpoint/`'s business, generation `generate.py`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...checkpoint.pretrained import load_pretrained, save_pretrained
from ...core.errors import BertlabError
from ...nn import AttentionMask, Dropout, attention
from ...nn.decoder_layer import DecoderLayerStep, decoder_layer_step
from ...nn.elementwise import activate
from ...nn.relative_position import relative_position_bias
from ...nn.rms_norm import RMSNorm
from .config import T5Config


@dataclass
class T5Output:
    logits: torch.Tensor  # (B, T_dec, V)
    loss: torch.Tensor | None = None  # mean cross-entropy over labels != -100
    last_hidden_state: torch.Tensor | None = None  # (B, T_dec, d_model): the decoder's output, before the LM head
    encoder_last_hidden_state: torch.Tensor | None = None  # (B, T_in, d_model); None for the decoder-only kinds


# ---------------------------------------------------------------------------------------------- feed-forward
class T5DenseActDense(nn.Module):
    """v1.0's FFN: W_o · Dropout(ReLU(W_i · x)), d_model -> d_ff -> d_model, no biases."""

    def __init__(self, config: T5Config):
        super().__init__()
        self.wi = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.wo = nn.Linear(config.d_ff, config.d_model, bias=False)
        self.dropout = Dropout(config.dropout_rate)
        self.act = config.dense_act_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wo(self.dropout(activate(self.wi(x), self.act)))  # (B, T, d_ff) in between


class T5DenseGatedActDense(nn.Module):
    """v1.1's gated FFN (Shazeer, 2020, "GLU variants"): W_o · Dropout(GELU(W_i0 · x) * (W_i1 · x))."""

    def __init__(self, config: T5Config):
        super().__init__()
        self.wi_0 = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.wi_1 = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.wo = nn.Linear(config.d_ff, config.d_model, bias=False)
        self.dropout = Dropout(config.dropout_rate)
        self.act = config.dense_act_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = activate(self.wi_0(x), self.act)  # (B, T, d_ff)
        # the product in place when autograd does not keep h for the backward pass (inference)
        h = h * self.wi_1(x) if h.requires_grad else h.mul_(self.wi_1(x))
        return self.wo(self.dropout(h))


FEED_FORWARDS: dict[bool, type[nn.Module]] = {False: T5DenseActDense, True: T5DenseGatedActDense}  # by is_gated_act


class T5LayerFF(nn.Module):
    def __init__(self, config: T5Config):
        super().__init__()
        self.DenseReluDense = FEED_FORWARDS[config.is_gated_act](config)  # Hugging Face's name for both kinds
        self.layer_norm = RMSNorm(config.d_model, eps=config.layer_norm_epsilon)
        self.dropout = Dropout(config.dropout_rate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.dropout(self.DenseReluDense(self.layer_norm(x)))


# ---------------------------------------------------------------------------------------------- attention
class T5Attention(nn.Module):
    """softmax(Q Kᵀ + b_rel + mask) V in `num_heads` heads of size d_kv -- no 1/sqrt(d_kv): T5 folds it into the
    initialisation of q. The formula is `nn.attention` with scale 1.0 and the bias."""

    def __init__(self, config: T5Config, has_relative_attention_bias: bool = False):
        super().__init__()
        self.num_heads = config.num_heads
        self.q = nn.Linear(config.d_model, config.inner_dim, bias=False)
        self.k = nn.Linear(config.d_model, config.inner_dim, bias=False)
        self.v = nn.Linear(config.d_model, config.inner_dim, bias=False)
        self.o = nn.Linear(config.inner_dim, config.d_model, bias=False)
        if has_relative_attention_bias:  # the stack's table: (num_buckets, num_heads)
            self.relative_attention_bias = nn.Embedding(config.relative_attention_num_buckets, config.num_heads)
        self.dropout_p = config.dropout_rate
        self.attn_implementation = config.attn_implementation

    def forward(self, x: torch.Tensor, mask: AttentionMask | None, bias: torch.Tensor | None,
                k: torch.Tensor, v: torch.Tensor, q: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T_q, d_model) queries' input; k, v: (B, T_k, inner) projected keys and values; q: the
        projected queries when the caller has them already (self-attention's stacked projection)."""
        y, _ = attention(self.q(x) if q is None else q, k, v, self.num_heads, mask, bias,
                         kernel=self.attn_implementation,
                         dropout_p=self.dropout_p, training=self.training, scale=1.0)
        return self.o(y)  # (B, T_q, d_model)


class T5LayerSelfAttention(nn.Module):
    def __init__(self, config: T5Config, has_relative_attention_bias: bool = False):
        super().__init__()
        self.SelfAttention = T5Attention(config, has_relative_attention_bias)
        # q, k and v read the same input here (not in cross-attention): CPU inference stacks them into one
        # layer in `stacked`, one GEMM for the three (nn/int8_linear.py, nn/packed_linear.py)
        self.SelfAttention.stacked_projections = ("q", "k", "v")
        self.SelfAttention.stacked = None
        self.layer_norm = RMSNorm(config.d_model, eps=config.layer_norm_epsilon)
        self.dropout = Dropout(config.dropout_rate)

    def forward(self, x, mask, bias, cache=None, start: int = 0):
        """`cache`: while generating, this block's `generate.LayerCache`; `start` positions are already in it."""
        h = self.layer_norm(x)
        attn = self.SelfAttention
        q = None
        if attn.stacked is not None:
            q, k, v = attn.stacked(h).chunk(3, dim=-1)  # (B, T, inner) each
        else:
            k, v = attn.k(h), attn.v(h)  # (B, T, inner)
        if cache is not None:  # append the new positions, attend over everything so far (views, no copies)
            end = start + h.size(1)
            cache.self_k[:, start:end] = k
            cache.self_v[:, start:end] = v
            k, v = cache.self_k[:, :end], cache.self_v[:, :end]
        return x + self.dropout(attn(h, mask, bias, k, v, q))


class T5LayerCrossAttention(nn.Module):
    def __init__(self, config: T5Config):
        super().__init__()
        self.EncDecAttention = T5Attention(config)
        self.layer_norm = RMSNorm(config.d_model, eps=config.layer_norm_epsilon)
        self.dropout = Dropout(config.dropout_rate)

    def forward(self, x, encoder_states, encoder_mask, cache=None):
        attn = self.EncDecAttention
        if cache is not None:  # the encoder's keys and values do not change while decoding
            k, v = cache.cross_k, cache.cross_v
        else:
            k, v = attn.k(encoder_states), attn.v(encoder_states)
        return x + self.dropout(attn(self.layer_norm(x), encoder_mask, None, k, v))


# ---------------------------------------------------------------------------------------------- blocks, stacks
class T5Block(nn.Module):
    """layer[0] self-attention, layer[1] cross-attention (decoders of an encoder-decoder only), layer[-1] FFN."""

    def __init__(self, config: T5Config, has_relative_attention_bias: bool, cross_attention: bool):
        super().__init__()
        self.layer = nn.ModuleList([T5LayerSelfAttention(config, has_relative_attention_bias)])
        if cross_attention:
            self.layer.append(T5LayerCrossAttention(config))
        self.layer.append(T5LayerFF(config))

    def decoding_step(self, rows: int) -> DecoderLayerStep | None:
        """This block's decoding step over `rows` sequences (one new position each) in one C call, for CPU
        inference (nn/decoder_layer.py); None where it does not apply (then `forward` runs)."""
        attn, ffn = self.layer[0].SelfAttention, self.layer[-1]
        dense = ffn.DenseReluDense
        gated = type(dense) is T5DenseGatedActDense  # act(wi_0 x) * (wi_1 x), else act(wi x)
        cross = self.layer[1] if len(self.layer) == 3 else None
        return decoder_layer_step(
            rows, attn.num_heads, self.layer[0].layer_norm, attn.stacked, attn.o, ffn.layer_norm,
            dense.wi_0 if gated else dense.wi, dense.act, dense.wo, attn.attn_implementation,
            norm_cross=cross.layer_norm if cross else None, cross_q=cross.EncDecAttention.q if cross else None,
            cross_out=cross.EncDecAttention.o if cross else None, ffn_gate=dense.wi_1 if gated else None, scale=1.0)

    def forward(self, x, mask, bias, encoder_states=None, encoder_mask=None, cache=None, start: int = 0):
        x = self.layer[0](x, mask, bias, cache, start)
        if len(self.layer) == 3:
            x = self.layer[1](x, encoder_states, encoder_mask, cache)
        return self.layer[-1](x)


class T5Stack(nn.Module):
    """`num_layers` blocks between the embedding dropout and the final RMSNorm + dropout. The relative position
    table lives in block 0's self-attention (Hugging Face's place for it); the bias made from it is computed once
    per forward pass and added in every block."""

    def __init__(self, config: T5Config, num_layers: int, bidirectional_positions: bool, cross_attention: bool):
        super().__init__()
        self.block = nn.ModuleList(T5Block(config, i == 0, cross_attention) for i in range(num_layers))
        self.final_layer_norm = RMSNorm(config.d_model, eps=config.layer_norm_epsilon)
        self.dropout = Dropout(config.dropout_rate)
        self.bidirectional_positions = bidirectional_positions
        self.max_distance = config.relative_attention_max_distance

    def position_bias(self, query_length: int, key_length: int, query_offset: int = 0) -> torch.Tensor:
        """(1, nh, T_q, T_k): the relative position bias of T_q queries from position `query_offset` on, over
        keys 0..T_k-1."""
        table = self.block[0].layer[0].SelfAttention.relative_attention_bias
        return relative_position_bias(table, query_length, key_length, self.bidirectional_positions,
                                      self.max_distance, query_offset)

    def forward(self, x: torch.Tensor, mask: AttentionMask | None, bias: torch.Tensor | None = None,
                encoder_states: torch.Tensor | None = None, encoder_mask: AttentionMask | None = None,
                cache: list | None = None, start: int = 0, steps: list | None = None) -> torch.Tensor:
        """x: (B, T, d_model) embeddings of the new positions (which follow `start` cached ones) -> (B, T, d_model).
        `cache`: while generating, one `generate.LayerCache` per block (generate.py owns the cache: the model
        only writes the new keys and values into it and reads the rest). `steps`: the blocks' `decoding_step`s
        for these rows (None where a block has none), which a step of one new position without a mask runs."""
        if bias is None:
            bias = self.position_bias(x.size(1), start + x.size(1), start)
        x = self.dropout(x)
        one_call = steps is not None and cache is not None and mask is None and x.size(1) == 1
        cross_add = None
        if one_call and encoder_mask is not None:
            cross_add = encoder_mask.additive(1, cache[0].cross_k.size(1), x.dtype, x.device)
        for i, block in enumerate(self.block):
            if one_call and steps[i] is not None:
                c = cache[i]
                if (y := steps[i](x, c.self_k, c.self_v, start, bias, c.cross_k, c.cross_v, cross_add)) is not None:
                    x = y
                    continue
            x = block(x, mask, bias, encoder_states, encoder_mask, cache[i] if cache is not None else None, start)
        return self.dropout(self.final_layer_norm(x))


def share_blocks(encoder: T5Stack, decoder: T5Stack) -> None:
    """Paper, Table 2 "Enc-dec, shared": decoder block i computes its self-attention and FFN with encoder block
    i's weights (the same modules, so one parameter each); its cross-attention, the relative position table
    (one-directional buckets, where the encoder's are bidirectional) and the final norm remain the decoder's."""
    for enc, dec in zip(encoder.block, decoder.block):
        mine, theirs = dec.layer[0], enc.layer[0]
        for name in ("q", "k", "v", "o"):
            setattr(mine.SelfAttention, name, getattr(theirs.SelfAttention, name))
        mine.layer_norm = theirs.layer_norm
        dec.layer[-1] = enc.layer[-1]  # the FFN with its norm


# ---------------------------------------------------------------------------------------------- the model
def _init_attention(m: T5Attention, c: T5Config) -> None:
    nn.init.normal_(m.q.weight, std=c.initializer_factor * (c.d_model * c.d_kv) ** -0.5)  # the folded 1/sqrt(d)
    nn.init.normal_(m.k.weight, std=c.initializer_factor * c.d_model ** -0.5)
    nn.init.normal_(m.v.weight, std=c.initializer_factor * c.d_model ** -0.5)
    nn.init.normal_(m.o.weight, std=c.initializer_factor * c.inner_dim ** -0.5)
    if hasattr(m, "relative_attention_bias"):
        nn.init.normal_(m.relative_attention_bias.weight, std=c.initializer_factor * c.d_model ** -0.5)


def _init_ffn(m: nn.Module, c: T5Config) -> None:
    for name in ("wi", "wi_0", "wi_1"):
        if hasattr(m, name):
            nn.init.normal_(getattr(m, name).weight, std=c.initializer_factor * c.d_model ** -0.5)
    nn.init.normal_(m.wo.weight, std=c.initializer_factor * c.d_ff ** -0.5)


def _init_model(m: T5ForConditionalGeneration, c: T5Config) -> None:
    nn.init.normal_(m.shared.weight, std=c.initializer_factor)
    if not c.tie_word_embeddings:
        nn.init.normal_(m.lm_head.weight, std=c.initializer_factor)


# Mesh TensorFlow's initialisation, as Hugging Face writes it (`initializer_factor` 1.0): module type -> init.
INITIALIZERS = {
    RMSNorm: lambda m, c: nn.init.constant_(m.weight, c.initializer_factor),
    T5Attention: _init_attention,
    T5DenseActDense: _init_ffn,
    T5DenseGatedActDense: _init_ffn,
}


class T5PreTrainedModel(nn.Module):
    """The config, the initialisation and Hugging Face–layout checkpoints (the rules in `checkpoint/`)."""

    config_class = T5Config
    base_model_prefix = "transformer"  # Hugging Face's; T5ForConditionalGeneration files carry no prefix
    # Every weight is the model's own: a checkpoint must have them all.
    base_model_parts: tuple[str, ...] = ("shared.", "encoder.", "decoder.", "lm_head.")
    optional_base_parts: tuple[str, ...] = ()

    def __init__(self, config: T5Config):
        super().__init__()
        self.config = config

    @property
    def tied_weight_keys(self) -> tuple[str, ...]:
        """v1.0's LM head is the embedding matrix: saved once (as `shared.weight`), re-tied on load."""
        return ("lm_head.weight",) if self.config.tie_word_embeddings else ()

    # Keys files may hold that carry nothing of ours: the stacks' aliases of `shared`, and a cross-attention
    # position table that old `transformers` versions saved and never used.
    ignored_checkpoint_keys = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
                               "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight")

    def init_weights(self, module: nn.Module | None = None) -> None:
        """Sets every parameter of `module` (also on storage just allocated by `checkpoint.materialize`)."""
        for m in (module or self).modules():
            init = INITIALIZERS.get(type(m)) or (_init_model if isinstance(m, T5ForConditionalGeneration) else None)
            if init is not None:
                init(m, self.config)

    @classmethod
    def from_pretrained(cls, path, config: T5Config | None = None, **kwargs):
        """Load from a Hugging Face–layout folder (`config.json` + `model.safetensors`); see `checkpoint/`."""
        return load_pretrained(cls, path, config=config, **kwargs)

    def save_pretrained(self, path, vocab_file=None, extra_files: dict[str, str] | None = None) -> None:
        """Write `config.json` + `model.safetensors` atomically; `transformers` loads them as they are."""
        save_pretrained(self, path, vocab_file=vocab_file, extra_files=extra_files)

    def num_parameters(self) -> int:
        """Distinct parameters (tied weights counted once)."""
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())


class T5ForConditionalGeneration(T5PreTrainedModel):
    """T5 with its LM head. `model(input_ids, attention_mask=None, decoder_input_ids=None | labels=None)` ->
    `T5Output` with `.logits` (B, T_dec, V) and, given labels, `.loss`; `model.generate(input_ids, ...)` ->
    token ids (B, T) starting with the decoder start token (see `generate.py`)."""

    def __init__(self, config: T5Config):
        super().__init__(config)
        self.shared = nn.Embedding(config.vocab_size, config.d_model)
        if config.is_encoder_decoder:
            self.encoder = T5Stack(config, config.num_layers, bidirectional_positions=True, cross_attention=False)
            self.decoder = T5Stack(config, config.num_decoder_layers, bidirectional_positions=False,
                                   cross_attention=True)
        else:
            self.encoder = None
            self.decoder = T5Stack(config, config.num_decoder_layers, cross_attention=False,
                                   bidirectional_positions=config.architecture == "prefix-lm")
        if config.share_encoder_decoder:
            share_blocks(self.encoder, self.decoder)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_word_embeddings:  # one matrix for the input embedding and the output projection
            self.lm_head.weight = self.shared.weight
        self.init_weights()

    # -------------------------------------------------------------------------------- pieces
    def check_length(self, length: int, what: str = "input") -> None:
        if length > self.config.n_positions:
            raise BertlabError(f"{what} of {length} tokens is longer than the model allows "
                               f"(n_positions = {self.config.n_positions})")

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The encoder: (B, T) ids -> (B, T, d_model), every query seeing every real key."""
        self.check_length(input_ids.size(1))
        return self.encoder(self.shared(input_ids), AttentionMask.padding(attention_mask))

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, T, d_model) decoder output -> (B, T, V). Tied (v1.0): the embedding matrix, with the output first
        rescaled by d_model^-0.5 (Mesh TensorFlow's; the embeddings are N(0, 1)); untied (v1.1): lm_head."""
        if self.config.scales_decoder_output:
            hidden = hidden * self.config.d_model ** -0.5
        return self.lm_head(hidden)

    def shift_right(self, labels: torch.Tensor) -> torch.Tensor:
        """Teacher forcing's decoder input: [start, y_1, ..., y_{n-1}], ignored labels (-100) as padding."""
        shifted = labels.new_full(labels.shape, self.config.decoder_start_token_id)
        shifted[:, 1:] = labels[:, :-1]
        return shifted.masked_fill_(shifted == -100, self.config.pad_token_id)

    def decoder_only_inputs(self, input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None,
                            decoder_input_ids: torch.Tensor, decoder_attention_mask: torch.Tensor | None
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[input ; target] as one sequence for the decoder-only kinds: (ids, keep (B, T) 1/0, prefix lengths).

        The input's padding is moved to the front of each row, so input and target meet without a gap: relative
        positions depend only on offsets, and the padding is masked, so a row computes exactly as unpadded. The
        prefix is the whole input block (its padding included; masked anyway)."""
        B, T_dec = decoder_input_ids.shape
        target_keep = decoder_attention_mask if decoder_attention_mask is not None else \
            torch.ones_like(decoder_input_ids)
        if input_ids is None:
            return decoder_input_ids, target_keep, decoder_input_ids.new_zeros(B)
        keep = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        order = torch.sort(keep.to(torch.int8), dim=1, stable=True).indices  # padding first, tokens in order
        ids = torch.cat([input_ids.gather(1, order), decoder_input_ids], dim=1)
        keep = torch.cat([keep.gather(1, order).to(target_keep.dtype), target_keep], dim=1)
        return ids, keep, decoder_input_ids.new_full((B,), input_ids.size(1))

    # -------------------------------------------------------------------------------- forward
    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # (B, T_in)
        attention_mask: torch.Tensor | None = None,  # (B, T_in) 1 for tokens, 0 for padding
        decoder_input_ids: torch.Tensor | None = None,  # (B, T_dec); made from labels when absent
        labels: torch.Tensor | None = None,  # (B, T_dec) target ids, -100 where no loss is wanted
        decoder_attention_mask: torch.Tensor | None = None,  # (B, T_dec)
        encoder_outputs: torch.Tensor | None = None,  # (B, T_in, d_model): skip the encoder
    ) -> T5Output:
        if decoder_input_ids is None:
            if labels is None:
                raise ValueError("T5 needs decoder_input_ids or labels (the decoder's input is the shifted target)")
            decoder_input_ids = self.shift_right(labels)
        encoder_states = None
        if self.encoder is not None:
            encoder_states = encoder_outputs if encoder_outputs is not None else self.encode(input_ids, attention_mask)
            hidden = self.decoder(self.shared(decoder_input_ids),
                                  AttentionMask.padding(decoder_attention_mask, kind="causal"),
                                  encoder_states=encoder_states, encoder_mask=AttentionMask.padding(attention_mask))
        else:
            ids, keep, prefix = self.decoder_only_inputs(input_ids, attention_mask, decoder_input_ids,
                                                         decoder_attention_mask)
            self.check_length(ids.size(1), "input + target")
            kind = self.config.decoder_mask_kind
            mask = AttentionMask.padding(keep, kind, prefix if kind == "prefix" else None)
            hidden = self.decoder(self.shared(ids), mask)[:, -decoder_input_ids.size(1):]  # the target positions
        logits = self.lm_logits(hidden)  # (B, T_dec, V)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1), ignore_index=-100)
        return T5Output(logits=logits, loss=loss, last_hidden_state=hidden, encoder_last_hidden_state=encoder_states)

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any
                 ) -> torch.Tensor:
        """Greedy (num_beams=1) or beam search decoding; see `bertlab.models.t5.generate.generate`."""
        from .generate import generate

        return generate(self, input_ids, attention_mask, **kwargs)
