"""The DeBERTa-v2/v3 encoder (He et al., 2021, "DeBERTa: Decoding-enhanced BERT with Disentangled Attention",
section 3; v3: He et al., 2023), readable top to bottom.

    x_0 = LayerNorm(E_token [+ E_position] [+ E_segment]) · mask          # no absolute positions in v2/v3 models
    x_l = LayerNorm(x' + FFN(x')),  x' = LayerNorm(x_{l-1} + DisentangledAttention(x_{l-1}))   # post-LN blocks
    (layer 1 only, with conv_kernel_size > 0: x_1 = LayerNorm(x_1 + act(Conv1d(x_0))) · mask)

Disentangled attention (section 3.1, eq. 2-4): a token is its content H and its relative position to the other
token, δ(i, j) = clamp(i - j, -k, k) (bucketed logarithmically beyond ±k/2 when position_buckets is set: v3).
With P the (2k, H) relative embeddings (LayerNorm'd in v3), per head:

    Q_c = H W_q,  K_c = H W_k,  V_c = H W_v,   Q_r = P W_q,r,  K_r = P W_k,r  (v3 shares: W_q,r = W_q, W_k,r = W_k)
    Ã_ij = Q_c,i · K_c,jᵀ                      content -> content
         + Q_c,i · K_r,δ(i,j)ᵀ                 content -> position   ("c2p")
         + K_c,j · Q_r,δ(j,i)ᵀ                 position -> content   ("p2c")
    H_o = softmax(Ã / √(3d)) V_c               √(d · (1 + number of relative terms)) in general

Module and parameter names follow `transformers`' `DebertaV2Model` exactly (`encoder.layer.0.attention.self
.query_proj`, `encoder.rel_embeddings`), so a state dict moves between bertlab and `transformers` without
renaming, and the arithmetic follows its order of operations (the tests hold every head to a relative error of
1e-6 in fp32), including two of its conventions: padding rows of the attention see every key with equal weight
(their outputs are never read), and the embeddings are zeroed at padding.

The attention is computed here rather than through `nn.attention`'s kernels: the relative terms are a (T, T) bias
per head that depends on the query, the key and the layer's weights, so there is no kernel to hand it to beyond the
eager one. An inference pass also skips what does not depend on its input: the position projections K_r = P W_k,r
and Q_r = P W_q,r (2k x H each, a layer) are kept from the pass before while P and the projections' weights stand
(`weights_version`: a write, a load or a `.to()` makes them anew), and c2p / p2c are multiplied only against the
rows of the table the input's length reaches (k + δ_min .. k + δ_max: 143 of 512 for 72 tokens under v3's 256
buckets). On a CPU it is then one C call at every precision (`cpu_kernels.relative_attention`; a bf16 model's values
widened to fp32 for it, the context rounded back once): each (row, head) multiplies its queries and keys by those
rows in scratch and adds the terms to each score as it is made -- no (B, heads, T, T) scores and no (B, heads, T,
rows) products in memory (DeBERTa-v3-base, one thread: 1.11x ONNX Runtime on 256-512 tokens, where the torch
operators around a C softmax pass were level; docs/benchmarks.md, "DeBERTa-v3-base's shape"). Elsewhere without
gradients (no C kernels, heads the C call does not take) the torch formulas run a block of queries at a time, each
block's scores, relative terms and probabilities at most `BLOCK_SCORES` floats, so a layer holds O(B · heads · T ·
2k) beside one block instead of several (B, heads, T, T) tensors at once (the same numbers: every score is computed
from the same operands in the same order); a pass that needs gradients, or the probabilities themselves, takes the
whole (T, T) at once.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from ...nn import ACTIVATIONS, Dropout, add_and_norm
from ...nn.cpu_kernels import relative_attention, tracing
from ...nn.elementwise import linear_activate
from ..bert.modeling import BertPreTrainedModel
from ..outputs import EncoderOutput
from .config import DebertaV2Config


# Without gradients, a block of queries whose (B, heads, rows, T) scores hold at most this many floats (16 MB in
# fp32) runs at a time: a 512-token row is one block, a 2,048-token row 12 blocks of 170 queries
BLOCK_SCORES = 1 << 22
# The C attention's (query, key) pairs a call: the row numbers of both terms, 8 bytes a pair (16 MB at most)
INDEX_PAIRS = 1 << 21


# ---------------------------------------------------------------------------------------------- relative positions
def inference_pass(module: nn.Module) -> bool:
    """Whether what `module` computes from its weights alone may be kept from one pass to the next: no gradients,
    eval mode (no dropout), and no trace recording the operators (an ONNX export's graph computes it itself)."""
    return not (module.training or torch.is_grad_enabled() or tracing())


def weights_version(*modules: nn.Module) -> "WeightsVersion | None":
    """What identifies the values of every parameter and buffer of `modules` (`WeightsVersion`), so that what was
    computed from them alone can be kept while it stands; None where a tensor keeps no version counter (one made
    under `torch.inference_mode`): nothing is kept then."""
    tensors = [t for module in modules for t in (*module.parameters(), *module.buffers())]
    try:
        return WeightsVersion(tuple((t, t._version, t.data_ptr()) for t in tensors),
                              tuple(t.untyped_storage() for t in tensors))
    except RuntimeError:
        return None


class WeightsVersion:
    """Each tensor with its version counter (moved by every in-place write: an optimizer step, `load_state_dict`)
    and its data's address (moved when `.to()` gives it new data, the dtype or device changed), and its storage
    held: while held, no other data can come to lie at that address."""

    def __init__(self, tensors: tuple, storages: tuple):
        self.tensors, self.storages = tensors, storages

    def __eq__(self, other) -> bool:
        return isinstance(other, WeightsVersion) and len(self.tensors) == len(other.tensors) and all(
            a is b and va == vb and pa == pb for (a, va, pa), (b, vb, pb) in zip(self.tensors, other.tensors))


def log_bucket_positions(relative: torch.Tensor, buckets: int, max_distance: int) -> torch.Tensor:
    """v3's buckets: distances under buckets/2 kept as they are, longer ones spread logarithmically over the
    rest, so that max_distance - 1 lands in the last bucket (`transformers`' make_log_bucket_position, op for op).

        b(r) = r                                                  |r| <= mid   (mid = buckets // 2)
        b(r) = sign(r) · (mid + ⌈log(|r| / mid) / log((max_distance - 1) / mid) · (mid - 1)⌉)   otherwise
    """
    sign = torch.sign(relative)
    mid = buckets // 2
    # inside (-mid, mid) the log is never used; mid - 1 keeps it finite
    abs_pos = torch.where((relative < mid) & (relative > -mid), torch.tensor(mid - 1).type_as(relative),
                          torch.abs(relative))
    log_pos = torch.ceil(torch.log(abs_pos / mid) / torch.log(torch.tensor((max_distance - 1) / mid))
                         * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, relative.type_as(log_pos), log_pos * sign).long()


@functools.lru_cache(maxsize=256)
def relative_extremes(length: int, buckets: int, max_distance: int) -> tuple[int, int]:
    """The least and the greatest δ of a `length`-token pass, δ(0, T-1) and δ(T-1, 0) (δ grows with i - j),
    computed as `relative_positions` computes them."""
    relative = torch.tensor([1 - length, length - 1])
    if buckets > 0:
        relative = log_bucket_positions(relative, buckets, max_distance)
    return int(relative[0]), int(relative[1])


def relative_positions(length: int, config: DebertaV2Config, device: torch.device) -> torch.Tensor:
    """(T, T): δ[i, j] = i - j, bucketed when the config has buckets (before the ±k clamp, done per term).

    Bucketed once per distance, not per pair: δ takes 2T - 1 values, and the (T, T) matrix is their windows --
    w[k] = (T - 1) - k, m[a, b] = w[a + b] = (T - 1) - a - b, so δ[i, j] = m[T - 1 - i, j]. The bucketing's
    temporaries on the (T, T) grid were most of a long input's attention memory (a 2,048-token row: 214 MB for
    the pairs, against one 34 MB matrix now). A trace (an ONNX export) records the pairs' formula, which its
    operators have."""
    if tracing():
        positions = torch.arange(length, dtype=torch.long, device=device)
        relative = positions[:, None] - positions[None, :]  # (T, T)
        if config.position_buckets > 0:
            relative = log_bucket_positions(relative, config.position_buckets, config.max_distance)
        return relative
    distances = torch.arange(length - 1, -length, -1, dtype=torch.long, device=device)  # (2T - 1,): T-1 .. 1-T
    if config.position_buckets > 0:
        distances = log_bucket_positions(distances, config.position_buckets, config.max_distance)
    return distances.as_strided((length, length), (1, 1)).flip(0)  # (T, T), contiguous (flip copies)


def attention_scale(head_size: int, terms: int) -> float:
    """√(d · (1 + terms)), computed in fp32 as `transformers` does (the same float, so the same scores)."""
    # on the CPU even while a model is built on the meta device: a number, not a tensor of the model
    return float(torch.sqrt(torch.tensor(head_size, dtype=torch.float, device="cpu") * (1 + terms)))


# ---------------------------------------------------------------------------------------------- the layers
class DebertaV2Embeddings(nn.Module):
    """x_0 = LayerNorm(E_token [+ E_position] [+ E_segment] [then embed_proj E -> H]), zeroed at padding."""

    def __init__(self, config: DebertaV2Config):
        super().__init__()
        E = config.word_embedding_size
        self.word_embeddings = nn.Embedding(config.vocab_size, E, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, E) \
            if config.position_biased_input else None
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, E) if config.type_vocab_size > 0 else None
        self.embed_proj = nn.Linear(E, config.hidden_size, bias=False) if E != config.hidden_size else None
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, keep: torch.Tensor | None = None) -> torch.Tensor:
        T = input_ids.size(1)
        x = self.word_embeddings(input_ids)  # (B, T, E)
        if self.position_embeddings is not None:
            if T > self.position_embeddings.num_embeddings:
                raise ValueError(f"sequence length {T} exceeds max_position_embeddings "
                                 f"({self.position_embeddings.num_embeddings})")
            if position_ids is None:
                position_ids = torch.arange(T, device=input_ids.device)[None, :]  # (1, T)
            x = x + self.position_embeddings(position_ids)
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            x = x + self.token_type_embeddings(token_type_ids)
        if self.embed_proj is not None:
            x = self.embed_proj(x)  # (B, T, H)
        x = self.LayerNorm(x)
        if keep is not None:
            x = x * keep.unsqueeze(-1).to(x.dtype)  # padding positions are zero vectors
        return self.dropout(x)


class DisentangledSelfAttention(nn.Module):
    """softmax((Q_c K_cᵀ + c2p + p2c) / √(d (1 + terms))) V_c over `num_attention_heads` heads (module docstring)."""

    def __init__(self, config: DebertaV2Config):
        super().__init__()
        H = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.query_proj = nn.Linear(H, H)
        self.key_proj = nn.Linear(H, H)
        self.value_proj = nn.Linear(H, H)
        self.terms = config.attention_terms
        # transformers counts the terms pos_att_type names even without relative attention
        self.scale = attention_scale(config.head_size, len(self.terms))
        self.relative = config.relative_attention
        self.share_att_key = config.share_att_key
        self.span = config.relative_span  # k: the relative table has 2k rows
        self.buckets, self.max_distance = config.position_buckets, config.max_distance
        if self.relative:
            self.pos_dropout = Dropout(config.hidden_dropout_prob)
            if not self.share_att_key:
                if "c2p" in self.terms:
                    self.pos_key_proj = nn.Linear(H, H)
                if "p2c" in self.terms:
                    self.pos_query_proj = nn.Linear(H, H)
        self.dropout = Dropout(config.attention_probs_dropout_prob)

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, H) -> (B, nh, T, d)."""
        B, T, _ = x.shape
        return x.view(B, T, self.num_heads, -1).transpose(1, 2)

    def forward(self, x: torch.Tensor, pair_mask: torch.Tensor | None, relative: torch.Tensor | None,
                rel_embeddings: torch.Tensor | None, output_attentions: bool = False):
        """x: (B, T, H); pair_mask: (B, 1, T, T) bool, True where query i may see key j (None: all);
        relative: (T, T) δ(i, j); rel_embeddings: (2k, H). Returns (B, T, H) and the probabilities if asked."""
        q, k, v = self.heads(self.query_proj(x)), self.heads(self.key_proj(x)), self.heads(self.value_proj(x))
        B, nh, T, d = q.shape
        k_scaled = k.transpose(-1, -2) / self.scale  # (B, nh, d, T)
        whole = torch.is_grad_enabled() or output_attentions
        reached = self.reached_rows(rel_embeddings, T) if self.relative else None
        # (not under a trace: an ONNX export records the torch formulas)
        if reached is not None and not whole and not tracing() and (context := self.relative_attention(
                q, k_scaled.transpose(-1, -2), v, pair_mask, relative, reached)) is not None:
            return context, None
        tables = self.relative_tables(q, k, reached) if reached is not None else None
        if tables is not None and not whole:
            # each table divided by the scale before the gathers, not each gathered term after: the same floats
            # (one division of the same value), fewer of them for long inputs
            tables = tuple(None if t is None else (t[0].div_(self.scale), t[1]) for t in tables)
        # a block of queries at a time where nothing needs the whole (T, T) (module docstring)
        rows = T if whole else max(1, BLOCK_SCORES // (B * nh * T))
        if rows >= T:
            return self.attend(q, k_scaled, v, pair_mask, relative, tables, 0, T, not whole, output_attentions)
        context = q.new_empty(B, T, nh * d)
        for start in range(0, T, rows):
            stop = min(start + rows, T)
            context[:, start:stop] = self.attend(q, k_scaled, v, pair_mask, relative, tables, start, stop, True)[0]
        return context, None

    def relative_attention(self, q: torch.Tensor, keys_scaled: torch.Tensor, v: torch.Tensor,
                           pair_mask: torch.Tensor | None, relative: torch.Tensor, reached) -> torch.Tensor | None:
        """On a CPU's inference pass the whole attention in C (`cpu_kernels.relative_attention`): each (row, head)
        multiplies its queries and keys by the table rows the pass reaches (`reached_rows`) and adds the terms to
        each score as it is made -- no (B, nh, T, T) scores and no (B, nh, T, rows) tables in memory. (B, T, H), or
        None where the kernel does not apply. keys_scaled (B, nh, T, d): the keys divided by the scale. A call
        takes queries enough that their (query, key) row numbers stay under `INDEX_PAIRS` (every query of a
        1,448-token row)."""
        B, nh, T, d = q.shape
        c2p, p2c = (None if term is None else (term[0][0], term[1]) for term in reached)  # (nh, rows, d) each
        rows = max(1, INDEX_PAIRS // T)
        context = None
        for start in range(0, T, rows):
            stop = min(start + rows, T)
            block = relative_attention(q[:, :, start:stop], keys_scaled, v, c2p, p2c, relative, pair_mask, start,
                                       self.span, self.scale)  # (B, stop - start, H)
            if block is None or stop - start == T:
                return block
            if context is None:
                context = q.new_empty(B, T, nh * d)
            context[:, start:stop] = block
        return context

    def attend(self, q: torch.Tensor, k_scaled: torch.Tensor, v: torch.Tensor, pair_mask: torch.Tensor | None,
               relative: torch.Tensor | None, tables, start: int, stop: int, divided: bool,
               output_attentions: bool = False):
        """Queries start..stop against every key: (B, stop - start, H) and the probabilities if asked (`divided`:
        the tables come divided by the scale, as an inference pass has them)."""
        # (in place on the fresh tensors each step makes: the same numbers, a block's scores fewer times over)
        scores = q[:, :, start:stop] @ k_scaled  # (B, nh, Tq, T): Q_c K_cᵀ / √(d·(1+terms))
        probs = self.probabilities(scores, pair_mask, relative, tables, start, stop, divided)
        context = self.dropout(probs) @ v  # (B, nh, Tq, d)
        B, _, Tq, _ = context.shape
        return context.transpose(1, 2).reshape(B, Tq, -1), probs if output_attentions else None

    def probabilities(self, scores: torch.Tensor, pair_mask: torch.Tensor | None, relative: torch.Tensor | None,
                      tables, start: int, stop: int, divided: bool) -> torch.Tensor:
        """softmax over the keys of a block's scores with their relative terms added and the mask applied."""
        if self.relative and (relative_scores := self.relative_scores(tables, relative, start, stop,
                                                                      divided)) is not None:
            scores.add_(relative_scores)
        if pair_mask is not None:
            scores.masked_fill_(~pair_mask[:, :, start:stop], torch.finfo(scores.dtype).min)
        return F.softmax(scores, dim=-1)

    def reached_rows(self, rel_embeddings: torch.Tensor, T: int):
        """The rows of the position projections (`position_projections`) a pass of T tokens reaches, per term
        (K_r's for c2p, Q_r's for p2c): (rows (1, nh, n, d), the first row's number), or None where the term is off.
        c2p reads row k + δ(i, j), p2c row k - δ(j, i) (both clamped to the table): rows k + δ_min .. k + δ_max and
        k - δ_max .. k - δ_min, not all 2k -- a 72-token input under v3's 256 buckets reaches 143 of 512, and the
        products with the others were 3.6x the work of these."""
        K_r, Q_r = self.position_projections(rel_embeddings)
        # (a trace -- an ONNX export -- keeps every row: the rows a length reaches would be constants in its graph)
        low, high = (-2 * self.span, 2 * self.span) if tracing() else \
            relative_extremes(T, self.buckets, self.max_distance)
        c2p = p2c = None
        if K_r is not None:
            first, last = self.table_rows(self.span + low, self.span + high)
            c2p = (K_r[:, :, first:last + 1], first)
        if Q_r is not None:
            first, last = self.table_rows(self.span - high, self.span - low)
            p2c = (Q_r[:, :, first:last + 1], first)
        return c2p, p2c

    def relative_tables(self, q: torch.Tensor, k: torch.Tensor, reached):
        """Each token against the rows of the relative table the pass reaches (`reached_rows`), (B, nh, T, rows)
        per term (None where the term is off), with the first row's number: c2p[i, r - first] = Q_c,i · K_r,rᵀ,
        p2c[j, r - first] = K_c,j · Q_r,rᵀ."""
        c2p, p2c = reached
        return (None if c2p is None else (q @ c2p[0].transpose(-1, -2), c2p[1]),  # (B, nh, T, rows)
                None if p2c is None else (k @ p2c[0].transpose(-1, -2), p2c[1]))

    def table_rows(self, first: int, last: int) -> tuple[int, int]:
        """Rows first..last of the relative table, clamped to it as the indices are."""
        top = 2 * self.span - 1
        return min(max(first, 0), top), min(max(last, 0), top)

    def position_projections(self, rel_embeddings: torch.Tensor):
        """K_r = P W_k,r and Q_r = P W_q,r, (1, nh, 2k, d) each (None where its term is off). They depend on the
        weights alone -- 2 · 2k · H² multiply-adds a layer, as much as a 2k-token input's projections, whatever the
        input's length -- so an inference pass (no gradients, eval mode: no dropout on P) reuses them from the
        pass before while P is the same tensor and no parameter or buffer of the projections was replaced or
        written since (`weights_version`); the same numbers either way (the same modules on the same P)."""
        version = weights_version(*self.position_projectors()) if inference_pass(self) else None
        cached = self.__dict__.get("_position_projections")
        if version is not None and cached is not None and cached[0] is rel_embeddings and cached[1] == version:
            return cached[2]
        P = self.pos_dropout(rel_embeddings)[: 2 * self.span].unsqueeze(0)  # (1, 2k, H)
        K_r = Q_r = None
        if "c2p" in self.terms:
            K_r = self.heads(self.key_proj(P) if self.share_att_key else self.pos_key_proj(P))  # (1, nh, 2k, d)
        if "p2c" in self.terms:
            Q_r = self.heads(self.query_proj(P) if self.share_att_key else self.pos_query_proj(P))  # (1, nh, 2k, d)
        # (a plain attribute, not a buffer: in no state_dict, moved by no .to(); a pass on another device or dtype
        # finds another P and recomputes)
        self.__dict__["_position_projections"] = (rel_embeddings, version, (K_r, Q_r)) if version is not None else None
        return K_r, Q_r

    def position_projectors(self) -> list[nn.Module]:
        """The projections K_r and Q_r are made with (v3 shares the content ones)."""
        out = []
        if "c2p" in self.terms:
            out.append(self.key_proj if self.share_att_key else self.pos_key_proj)
        if "p2c" in self.terms:
            out.append(self.query_proj if self.share_att_key else self.pos_query_proj)
        return out

    def relative_scores(self, tables, relative: torch.Tensor, start: int, stop: int,
                        divided: bool = False) -> torch.Tensor | None:
        """c2p + p2c, each / √(d·(1+terms)), for queries start..stop: (B, nh, Tq, T), gathered from the tables
        (`divided`: already divided by it) (None when pos_att_type names neither)."""
        span, (c2p, p2c) = self.span, tables
        if c2p is None and p2c is None:
            return None
        B, nh, T, _ = (c2p if c2p is not None else p2c)[0].shape
        Tq = stop - start
        score = None
        if c2p is not None:
            (c2p, first) = c2p
            index = torch.clamp(relative[start:stop] + span, 0, 2 * span - 1) - first  # (Tq, T): row of δ(i, j)
            score = torch.gather(c2p[:, :, start:stop], -1, index.expand(B, nh, Tq, T))  # Q_c,i · K_r,δ(i,j)ᵀ
            if not divided:
                score.div_(self.scale)
        if p2c is not None:
            (p2c, first) = p2c
            # (T, Tq): row of δ(j, i), [j, i]
            index = torch.clamp(-relative[:, start:stop] + span, 0, 2 * span - 1) - first
            p2c = torch.gather(p2c, -1, index.expand(B, nh, T, Tq)).transpose(-1, -2)  # [i, j]: K_c,j · Q_r,δ(j,i)ᵀ
            if not divided:
                p2c.div_(self.scale)
            score = p2c if score is None else score.add_(p2c)
        return score


class DebertaV2SelfOutput(nn.Module):
    """Project the heads back to H, dropout, add the residual, LayerNorm (post-LN)."""

    def __init__(self, config: DebertaV2Config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return add_and_norm(self.dropout(self.dense(y)), residual, self.LayerNorm)


class DebertaV2Attention(nn.Module):
    def __init__(self, config: DebertaV2Config):
        super().__init__()
        self.self = DisentangledSelfAttention(config)  # the name transformers' checkpoints use
        self.output = DebertaV2SelfOutput(config)

    def forward(self, x, pair_mask, relative, rel_embeddings, output_attentions=False):
        y, probs = self.self(x, pair_mask, relative, rel_embeddings, output_attentions)
        return self.output(y, x), probs


class DebertaV2Intermediate(nn.Module):
    """act(x W_1 + b_1), widening H -> intermediate_size."""

    def __init__(self, config: DebertaV2Config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.hidden_act = config.hidden_act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear_activate(self.dense, x, self.hidden_act)  # (the GELU in the GEMM's epilogue where it has one)


class DebertaV2Output(DebertaV2SelfOutput):
    """intermediate_size -> H, dropout, residual, LayerNorm."""

    def __init__(self, config: DebertaV2Config):
        nn.Module.__init__(self)
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)


class DebertaV2Layer(nn.Module):
    """One block: disentangled self-attention sub-layer, then the feed-forward sub-layer, each post-LN."""

    def __init__(self, config: DebertaV2Config):
        super().__init__()
        self.attention = DebertaV2Attention(config)
        self.intermediate = DebertaV2Intermediate(config)
        self.output = DebertaV2Output(config)

    def forward(self, x, pair_mask, relative, rel_embeddings, output_attentions=False):
        x, probs = self.attention(x, pair_mask, relative, rel_embeddings, output_attentions)
        return self.output(self.intermediate(x), x), probs


class ConvLayer(nn.Module):
    """v2-xlarge's n-gram convolution beside the first layer: x_1 = LayerNorm(x_1 + act(Conv1d(x_0))) · mask,
    the convolution's output zeroed at padding first."""

    def __init__(self, config: DebertaV2Config):
        super().__init__()
        K = config.conv_kernel_size
        self.conv = nn.Conv1d(config.hidden_size, config.hidden_size, K, padding=(K - 1) // 2,
                              groups=config.conv_groups)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.act = ACTIVATIONS[config.conv_act]

    def forward(self, embedded: torch.Tensor, layer_output: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        out = self.conv(embedded.transpose(1, 2)).transpose(1, 2)  # (B, T, H): over the sequence axis
        if keep is not None:
            out = out.masked_fill(~keep.unsqueeze(-1), 0)
        out = self.LayerNorm(layer_output + self.act(self.dropout(out)))
        return out * keep.unsqueeze(-1).to(out.dtype) if keep is not None else out


class DebertaV2Encoder(nn.Module):
    """The blocks, the relative embedding table P (2k, H) they share (LayerNorm'd once per forward with
    norm_rel_ebd), and the convolution beside the first block."""

    def __init__(self, config: DebertaV2Config):
        super().__init__()
        self.config = config
        self.layer = nn.ModuleList(DebertaV2Layer(config) for _ in range(config.num_hidden_layers))
        if config.relative_attention:
            self.rel_embeddings = nn.Embedding(2 * config.relative_span, config.hidden_size)
        if config.rel_layer_norm:
            self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.conv = ConvLayer(config) if config.conv_kernel_size > 0 else None

    def blocks(self) -> list[nn.Module]:
        """The blocks in the order they run (gradual unfreezing walks them)."""
        return list(self.layer)

    def rel_table(self) -> torch.Tensor | None:
        """P, LayerNorm'd where the config says: an inference pass (no gradients, eval mode) reuses the pass
        before's while the table and the norm are unchanged (`weights_version`), so each layer's projections of it
        can be reused too (`DisentangledSelfAttention.position_projections`)."""
        if not self.config.relative_attention:
            return None
        P = self.rel_embeddings.weight  # (2k, H)
        if not self.config.rel_layer_norm:
            return P
        sources = (self.rel_embeddings, self.LayerNorm)
        version = weights_version(*sources) if inference_pass(self) else None
        cached = self.__dict__.get("_rel_table")
        if version is not None and cached is not None and cached[0] == version:
            return cached[1]
        P = self.LayerNorm(P)
        self.__dict__["_rel_table"] = (version, P) if version is not None else None
        return P

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None, output_hidden_states: bool = False,
                output_attentions: bool = False):
        """x: (B, T, H) embeddings; keep: (B, T) bool, True at real tokens (None: no padding)."""
        # query i may see key j when both are real: a padding row sees nothing and softmax spreads it evenly
        pair_mask = (keep[:, None, :, None] & keep[:, None, None, :]) if keep is not None else None  # (B, 1, T, T)
        relative = relative_positions(x.size(1), self.config, x.device) if self.config.relative_attention else None
        P = self.rel_table()
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        embedded = x
        for i, layer in enumerate(self.layer):
            x, probs = layer(x, pair_mask, relative, P, output_attentions)
            if i == 0 and self.conv is not None:
                x = self.conv(embedded, x, keep)
            if hidden_states is not None:
                hidden_states.append(x)
            if attentions is not None:
                attentions.append(probs)
        return x, hidden_states, attentions


# ---------------------------------------------------------------------------------------------- the model
class DebertaV2PreTrainedModel(BertPreTrainedModel):
    """BERT's model base (initialisation, checkpoint I/O) with DeBERTa's checkpoint rules."""

    config_class = DebertaV2Config
    base_model_prefix = "deberta"
    base_model_parts = ("embeddings.", "encoder.")
    optional_base_parts = ()
    read_tf_checkpoint = None  # no TensorFlow release: a .index checkpoint is refused in one line
    # The released DeBERTa checkpoints' replaced-token-detection head (`mask_predictions`): dropped, as
    # transformers drops it
    expected_unused_keys = ("mask_predictions.",)

    @property
    def ignored_checkpoint_keys(self) -> tuple[str, ...]:
        # v2/v3 checkpoints carry an absolute position table their config does not use (transformers skips it)
        unused = () if self.config.position_biased_input else ("embeddings.position_embeddings.weight",)
        return ("embeddings.position_ids", *unused)

    def init_weights(self, module: nn.Module | None = None) -> None:
        """BERT's initialisation, and the convolution's (which it does not know): normal(0, initializer_range),
        bias 0."""
        super().init_weights(module)
        std = self.config.initializer_range
        for m in (module or self).modules():
            if isinstance(m, nn.Conv1d):
                nn.init.trunc_normal_(m.weight, mean=0.0, std=std, a=-2 * std, b=2 * std)
                nn.init.zeros_(m.bias)


class DebertaV2Model(DebertaV2PreTrainedModel):
    """`model(input_ids, attention_mask=None, token_type_ids=None)` -> `EncoderOutput` with
    `.last_hidden_state` (B, T, H) (DeBERTa has no pooler on the bare encoder; the classifiers' `ContextPooler`
    is theirs); `output_hidden_states=True` adds the embeddings and every layer's output,
    `output_attentions=True` every layer's probabilities."""

    def __init__(self, config: DebertaV2Config):
        super().__init__(config)
        self.embeddings = DebertaV2Embeddings(config)
        self.encoder = DebertaV2Encoder(config)
        self.init_weights()

    def unfreezing_groups(self) -> list[nn.Module]:
        """Gradual unfreezing's groups, bottom to top: the embeddings with the relative-position table (and its
        LayerNorm) every layer reads, as BERT's position table sits in its embeddings; the first block with the
        convolution beside it; then each block."""
        enc = self.encoder
        bottom = [self.embeddings, *(getattr(enc, n) for n in ("rel_embeddings", "LayerNorm") if hasattr(enc, n))]
        first, *rest = enc.blocks()
        return [nn.ModuleList(bottom), nn.ModuleList([first, *([enc.conv] if enc.conv is not None else [])]), *rest]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False) -> EncoderOutput:
        keep = attention_mask.bool() if attention_mask is not None else None  # (B, T)
        x = self.embeddings(input_ids, token_type_ids, position_ids, keep)  # (B, T, H)
        x, hidden_states, attentions = self.encoder(x, keep, output_hidden_states, output_attentions)
        return EncoderOutput.of(x, hidden_states, attentions, None)
