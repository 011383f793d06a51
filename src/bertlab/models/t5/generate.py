"""Generation for T5: greedy decoding and beam search, batched, with a key/value cache.

Without a cache, decoding token t runs the decoder over all t tokens again -- quadratic in the output length.
With it (`CachedDecoder`), each step feeds only the newest token: the self-attention keys and values of earlier
positions are kept in buffers preallocated to the final length (written in place, attended through views), the
cross-attention keys and values of the encoder output are computed once, and the relative position bias of
every (query, key) pair is computed once and sliced per step. `RecomputingDecoder` is the quadratic reference
the tests compare it with.

Both searches follow `transformers`' `generate` step for step, so the same model and settings give the same ids:
  * greedy: the argmax each step; a row that has produced `</s>` continues with padding until all have;
  * beam search: each step keeps the best 2K of the K·V continuations (scores summed log-probabilities), moves
    the ones ending in `</s>` (or at the length limit) among the top K to the finished list, scored by
    sum / length^length_penalty, and continues with the best K unfinished; it stops when no running beam can
    beat the worst finished one (`early_stopping` False: judged at the current length; "never": at the longest
    length when length_penalty > 0; True: as soon as K beams have finished).
The result is (B, T) ids starting with the decoder start token, padded after `</s>` with the pad id.

The decoder-only architectures generate the same way: their prompt is the input followed by the decoder start
token (the same sequence they train on), and what they return is the part after the input.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...core.errors import BertlabError
from ...nn import AttentionMask
from ...nn.attention import get_kernel
from ...nn.cpu_kernels import argmax_rows, beam_topk

# The model (`model.T5ForConditionalGeneration`) is passed in, not imported: its `generate` method calls this
# module, which then needs nothing from model.py but the model object.
NEG_INF = -1.0e9  # transformers' "impossible" score in beam search; kept so that ties and sums behave the same


@dataclass
class LayerCache:
    """One decoder block's keys and values while generating: self-attention buffers preallocated to the longest
    sequence (filled up to the cache's `length`; the block writes each step's new positions), and the
    cross-attention keys and values of the encoder output, computed once."""

    self_k: torch.Tensor  # (B, T_max, inner)
    self_v: torch.Tensor
    cross_k: torch.Tensor | None = None  # (B or B·K, T_enc, inner): see CachedDecoder
    cross_v: torch.Tensor | None = None


# ---------------------------------------------------------------------------------------------- decoders
class CachedDecoder:
    """The decoder while generating `rows` = B·K sequences: feed it the newest tokens, get the next-token logits.

    The encoder runs once on the B inputs; its output's cross-attention keys and values are computed once per
    layer and shared by the K beams of each input (beams of one input never exchange them): one row per input
    where the attention kernel takes shared rows, else repeated for each beam."""

    def __init__(self, model, input_ids: torch.Tensor,
                 attention_mask: torch.Tensor | None, expand: int, max_new_tokens: int):
        config = model.config
        self.model = model
        B, T_in = input_ids.shape
        rows = B * expand
        inner, dtype, device = config.inner_dim, model.shared.weight.dtype, input_ids.device
        if attention_mask is not None and bool(attention_mask.all()):
            attention_mask = None
        if model.encoder is not None:
            encoder_states = model.encode(input_ids, attention_mask)  # (B, T_in, d)
            # Beams of one input share its cross-attention keys and values where the kernel takes shared rows
            # (K times less to compute, hold and read each step); otherwise each beam gets a copy.
            kernel = model.decoder.block[0].layer[1].EncDecAttention.attn_implementation
            if not get_kernel(kernel).shared_kv:
                encoder_states = encoder_states.repeat_interleave(expand, 0)  # (B·K, T_in, d)
            self.encoder_mask = AttentionMask.padding(
                attention_mask.repeat_interleave(expand, 0) if attention_mask is not None else None)
            self.prompt = None
            self.keep = None  # the decoder's own tokens: never padding (finished rows continue with pad tokens)
            T_max = 1 + max_new_tokens
        else:  # the prompt is [input ; start], as the decoder-only kinds train
            self.encoder_mask = None
            start = input_ids.new_full((B, 1), config.decoder_start_token_id)
            ids, keep, prefix = model.decoder_only_inputs(input_ids, attention_mask, start, None)
            self.prompt = ids.repeat_interleave(expand, 0)  # fed by the first step instead of the start token
            self.kind = config.decoder_mask_kind
            self.prefix = prefix.repeat_interleave(expand, 0) if self.kind == "prefix" else None
            T_max = T_in + 1 + max_new_tokens
            model.check_length(T_max, "input + generated tokens")
            self.keep = None
            if attention_mask is not None:  # input padding stays invisible for the whole generation
                self.keep = torch.ones(rows, T_max, dtype=torch.bool, device=device)
                self.keep[:, :T_in + 1] = keep.repeat_interleave(expand, 0).bool()
        self.layers = []
        for block in model.decoder.block:
            cache = LayerCache(self_k=torch.empty(rows, T_max, inner, dtype=dtype, device=device),
                               self_v=torch.empty(rows, T_max, inner, dtype=dtype, device=device))
            if model.encoder is not None:
                cross = block.layer[1].EncDecAttention
                cache.cross_k, cache.cross_v = cross.k(encoder_states), cross.v(encoder_states)
            self.layers.append(cache)
        # (1, nh, T_max, T_max), sliced per step; contiguous, so each step's slice goes to the kernels as it is
        self.bias = model.decoder.position_bias(T_max, T_max).contiguous()
        # each block's step of one new position in one C call, where it has one (CPU inference)
        self.steps = [block.decoding_step(rows) for block in model.decoder.block]
        self.length = 0  # positions in the cache
        self.spare = None  # one more self-attention buffer, for `reorder`

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (rows, 1), the newest -> (rows, V) logits for the next one."""
        if self.length == 0 and self.prompt is not None:
            tokens = self.prompt
        start, end = self.length, self.length + tokens.size(1)
        mask = self._mask(start, end)
        x = self.model.shared(tokens)  # (rows, n, d_model)
        h = self.model.decoder(x, mask, self.bias[:, :, start:end, :end], encoder_mask=self.encoder_mask,
                               cache=self.layers, start=start, steps=self.steps)
        self.length = end
        return self.model.lm_logits(h[:, -1])

    def _mask(self, start: int, end: int) -> AttentionMask | None:
        if start > 0 or self.prompt is None:
            # One query at the newest position: the causal (and prefix) rule lets it see every key so far, so
            # only padding (in a decoder-only prompt) needs masking.
            return AttentionMask(keep=self.keep[:, :end]) if self.keep is not None else None
        keep = self.keep[:, :end] if self.keep is not None else None
        return AttentionMask(self.kind, keep, self.prefix)

    def reorder(self, index: torch.Tensor) -> None:
        """Beam search moved rows: row i continues what row index[i] was. Cross-attention keys and values need
        no move (beams of one input share them). Each self-attention buffer is gathered into a spare one, which
        takes its place, and the old one becomes the spare for the next: one copy of the filled part (gathering
        into a temporary and copying back made two) for one extra buffer in all."""
        n = self.length
        for cache in self.layers:
            for name in ("self_k", "self_v"):
                buf = getattr(cache, name)
                if self.spare is None:
                    self.spare = torch.empty_like(buf)
                torch.index_select(buf[:, :n], 0, index, out=self.spare[:, :n])
                setattr(cache, name, self.spare)
                self.spare = buf


class RecomputingDecoder:
    """The quadratic reference: every step runs the whole model's forward over all tokens so far."""

    def __init__(self, model, input_ids: torch.Tensor,
                 attention_mask: torch.Tensor | None, expand: int, max_new_tokens: int):
        self.model = model
        self.input_ids = input_ids.repeat_interleave(expand, 0)
        self.attention_mask = attention_mask.repeat_interleave(expand, 0) if attention_mask is not None else None
        self.tokens = None

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        self.tokens = tokens if self.tokens is None else torch.cat([self.tokens, tokens], dim=1)
        out = self.model(self.input_ids, self.attention_mask, decoder_input_ids=self.tokens)
        return out.logits[:, -1]

    def reorder(self, index: torch.Tensor) -> None:
        self.tokens = self.tokens.index_select(0, index)


# ---------------------------------------------------------------------------------------------- searches
def greedy_search(decoder, start: torch.Tensor, max_new_tokens: int, eos: torch.Tensor, pad: int) -> torch.Tensor:
    """start: (B, 1) -> (B, 1 + n) ids, n <= max_new_tokens: the argmax each step until every row has ended."""
    sequences = [start]
    tokens = start
    unfinished = torch.ones(start.size(0), dtype=torch.bool, device=start.device)
    for _ in range(max_new_tokens):
        logits = decoder(tokens)  # (B, V)
        tokens = found if (found := argmax_rows(logits)) is not None else logits.argmax(-1)  # (B,)
        tokens = torch.where(unfinished, tokens, pad)[:, None]  # (B, 1)
        sequences.append(tokens)
        unfinished &= ~torch.isin(tokens[:, 0], eos)
        if not bool(unfinished.any()):
            break
    return torch.cat(sequences, dim=1)


def beam_search(decoder, start: torch.Tensor, num_beams: int, max_new_tokens: int, eos: torch.Tensor, pad: int,
                length_penalty: float = 1.0, early_stopping: bool | str = False) -> torch.Tensor:
    """start: (B·K, 1) -> (B, 1 + n) ids, the best finished beam of each input (see the module docstring)."""
    K = num_beams
    B = start.size(0) // K
    device = start.device
    max_length = 1 + max_new_tokens
    keep_k = max(2, 1 + eos.numel()) * K  # enough candidates that K stay unfinished if the top K all end
    top_k_mask = torch.arange(keep_k, device=device) < K  # (2K,): only the top K may enter the finished list

    running = torch.full((B, K, max_length), pad, dtype=torch.long, device=device)
    running[:, :, 0] = start.view(B, K)
    running_scores = torch.zeros(B, K, device=device)
    running_scores[:, 1:] = NEG_INF  # all beams start equal: only the first one's continuations count
    # The step at which each beam's parent was chosen, as batch-flat rows: where a sequence's generated tokens end.
    running_parents = torch.full((B, K, max_new_tokens), -1, dtype=torch.long, device=device)
    finished = running.clone()
    finished_scores = torch.full((B, K), NEG_INF, device=device)
    finished_parents = running_parents.clone()
    is_finished = torch.zeros(B, K, dtype=torch.bool, device=device)
    can_improve = torch.ones(B, 1, dtype=torch.bool, device=device)
    batch_offset = torch.arange(B, device=device)[:, None] * K  # (B, 1)

    for cur_len in range(1, max_length):
        logits = decoder(running[:, :, cur_len - 1].reshape(B * K, 1))  # (B·K, V)
        V = logits.size(-1)
        # the best 2K sums log_softmax(logits) + running score over each input's K·V continuations: (B, 2K), in
        # C (the log-softmax on the way; ties to the lower index), or in torch
        logits = logits.float()
        found = beam_topk(logits, running_scores, keep_k, log_softmax=True)
        if found is None:
            log_probs = F.log_softmax(logits, dim=-1).view(B, K, V) + running_scores[:, :, None]
            found = log_probs.view(B, K * V).topk(keep_k)
        top_scores, top_index = found
        parent, token = top_index // V, top_index % V
        cand = running.gather(1, parent[:, :, None].expand(-1, -1, max_length)).clone()  # (B, 2K, max_length)
        cand[:, :, cur_len] = token
        cand_parents = running_parents.gather(1, parent[:, :, None].expand(-1, -1, max_new_tokens)).clone()
        cand_parents[:, :, cur_len - 1] = parent + batch_offset
        ends = torch.isin(token, eos) | (cur_len + 1 >= max_length)  # (B, 2K)

        # the best K candidates that did not end continue
        cont_scores = top_scores + ends.float() * NEG_INF
        nxt = cont_scores.topk(K).indices  # (B, K)
        running = cand.gather(1, nxt[:, :, None].expand(-1, -1, max_length))
        running_scores = cont_scores.gather(1, nxt)
        running_parents = cand_parents.gather(1, nxt[:, :, None].expand(-1, -1, max_new_tokens))

        # the ones that ended among the top K join the finished list if they beat its worst
        just_ended = ends & top_k_mask
        scores = top_scores / (cur_len ** length_penalty)  # length: generated tokens, the start token excluded
        full = is_finished.all(-1, keepdim=True) & (early_stopping is True)
        scores = scores + full.float() * NEG_INF + (~can_improve).float() * NEG_INF + (~just_ended).float() * NEG_INF
        merged_scores = torch.cat([finished_scores, scores], dim=1)  # (B, 3K)
        best = merged_scores.topk(K).indices
        finished = torch.cat([finished, cand], 1).gather(1, best[:, :, None].expand(-1, -1, max_length))
        finished_parents = torch.cat([finished_parents, cand_parents], 1).gather(
            1, best[:, :, None].expand(-1, -1, max_new_tokens))
        finished_scores = merged_scores.gather(1, best)
        is_finished = torch.cat([is_finished, just_ended], 1).gather(1, best)

        decoder.reorder(running_parents[:, :, cur_len - 1].reshape(-1))

        # stop when no running beam can still beat the worst finished one (transformers' heuristic)
        gen_len = max_length - 1 if early_stopping == "never" and length_penalty > 0.0 else cur_len
        best_running = running_scores[:, :1] / (gen_len ** length_penalty)
        worst_finished = torch.where(is_finished, finished_scores.min(dim=1, keepdim=True).values, NEG_INF)
        can_improve = can_improve & (best_running > worst_finished).any(-1, keepdim=True)
        if not bool(can_improve.any()) or (early_stopping is True and bool(is_finished.all())) or bool(ends.all()):
            break

    lengths = (finished_parents[:, 0] >= 0).sum(-1)  # (B,) generated tokens of each input's best beam
    out = finished[:, 0, :1 + int(lengths.max())].clone()
    after = torch.arange(out.size(1), device=device)[None, :] > lengths[:, None]
    return out.masked_fill_(after, pad)  # padding after each sequence's end


DECODERS = {True: CachedDecoder, False: RecomputingDecoder}  # by use_cache


@torch.inference_mode()
def generate(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
             max_new_tokens: int = 20, num_beams: int = 1, length_penalty: float = 1.0,
             early_stopping: bool | str = False, eos_token_id: int | list[int] | None = None,
             use_cache: bool = True) -> torch.Tensor:
    """(B, T) input ids -> (B, 1 + n) generated ids starting with the decoder start token, n <= max_new_tokens.

    num_beams 1 is greedy decoding; more is beam search with `length_penalty` (scores divided by
    length^length_penalty) and `early_stopping` (False, True or "never", as in transformers). `use_cache=False`
    recomputes the decoder over the whole output every step (the reference the cache is tested against)."""
    config = model.config
    if max_new_tokens < 1:
        raise BertlabError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if num_beams < 1:
        raise BertlabError(f"num_beams must be at least 1, got {num_beams}")
    if early_stopping not in (True, False, "never"):
        raise BertlabError(f"early_stopping must be true, false or 'never', got {early_stopping!r}")
    eos_ids = config.eos_token_id if eos_token_id is None else eos_token_id
    eos = torch.tensor([eos_ids] if isinstance(eos_ids, int) else list(eos_ids), device=input_ids.device)
    was_training = model.training
    if any(m.training for m in model.modules()):  # (eval() on a model already in eval mode: ~3 ms of setattr)
        model.eval()
    try:
        decoder = DECODERS[use_cache](model, input_ids, attention_mask, num_beams, max_new_tokens)
        start = input_ids.new_full((input_ids.size(0) * num_beams, 1), config.decoder_start_token_id)
        if num_beams == 1:
            return greedy_search(decoder, start, max_new_tokens, eos, config.pad_token_id)
        return beam_search(decoder, start, num_beams, max_new_tokens, eos, config.pad_token_id, length_penalty,
                           early_stopping)
    finally:
        if was_training:
            model.train()
