"""The seams hold: a new head is one registry entry (it fine-tunes, saves, reloads, predicts and distills
with nothing else changed), and the attention seam computes each mask kind and bias as the formula says."""

from __future__ import annotations

import dataclasses
import importlib
import json
import math

import pytest
import torch
import torch.nn.functional as F

from bertlab import BertConfig, BertModel
from bertlab.models.bert.heads import HEADS, HeadOutput, TaskOutputLayer, head_for_architecture, register_head
from bertlab.models.bert.modeling import BertPreTrainedModel
from bertlab.nn import AttentionMask, TokenLayout, attention

WORDS = ["good", "great", "fine", "nice", "bad", "awful", "poor", "sad", "movie", "the", "was", "a", "plot"]


@pytest.fixture
def toy_head():
    """A head bertlab does not have -- mean pooling over the real tokens, then one linear layer -- added with
    one `register_head` entry, removed again afterwards."""

    @register_head("toy-mean-pool", output=HeadOutput, prefix="mean_pool_classifier.", task="text-classification",
                   soft_target="classes")
    class BertForMeanPoolClassification(BertPreTrainedModel):
        """logits = W · mean of the real tokens' last hidden states + b."""

        def __init__(self, config: BertConfig):
            super().__init__(config)
            self.num_labels = config.num_labels
            self.bert = BertModel(config, add_pooling_layer=False)
            self.mean_pool_classifier = TaskOutputLayer(config.hidden_size, config.num_labels)
            self.init_weights(self.mean_pool_classifier)

        def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None) -> HeadOutput:
            h = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state
            keep = (attention_mask if attention_mask is not None else torch.ones_like(input_ids))[..., None].float()
            logits = self.mean_pool_classifier((h * keep).sum(1) / keep.sum(1))  # (B, num_labels)
            loss = F.cross_entropy(logits.float(), labels.view(-1)) if labels is not None else None
            return HeadOutput(logits, loss)

    yield BertForMeanPoolClassification
    del HEADS["toy-mean-pool"]


def _sentiment_data(folder, rows: int, seed: int) -> None:
    """SST-2's layout (`sentence<TAB>label`, header line): label 1 for a sentence with a good word."""
    import random

    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", rows), ("dev", rows // 2)):
        lines = ["sentence\tlabel"]
        for _ in range(n):
            label = rng.randrange(2)
            word = rng.choice(WORDS[:4] if label else WORDS[4:8])
            lines.append(f"the movie was {word} {rng.choice(['', 'a plot'])}".strip() + f"\t{label}")
        (folder / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _tiny_encoder(folder) -> None:
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *(c for c in "bcdefghijklmnopqrstuvwxyz")]
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64)
    BertModel(config).save_pretrained(folder)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")


def test_a_toy_head_is_one_registry_entry(toy_head, tmp_path, monkeypatch):
    from bertlab.infer.predict import Predictor
    from bertlab.tasks import TASKS
    from bertlab.train import finetune as ft

    assert head_for_architecture("BertForMeanPoolClassification").model_class is toy_head
    _tiny_encoder(tmp_path / "encoder")
    _sentiment_data(tmp_path / "data", rows=128, seed=0)
    # the task is SST-2's reader, metric and writer with the toy head on top
    monkeypatch.setitem(TASKS, "toy-sst2", dataclasses.replace(TASKS["sst2"], name="toy-sst2", head=toy_head))
    result = ft.finetune(ft.FinetuneConfig(task="toy-sst2", model=str(tmp_path / "encoder"), data=str(tmp_path / "data"),
                                           out=str(tmp_path / "out"), epochs=10, lr=3e-3, batch_size=16,
                                           progress=False, device="cpu"))
    accuracy = json.loads((tmp_path / "out" / "metrics.json").read_text())["best_run"]["dev"]["accuracy"]
    assert accuracy >= 0.9, result  # one word decides the label: the head learns it
    saved = tmp_path / "out" / "model"
    config = json.loads((saved / "config.json").read_text())
    assert config["architectures"] == ["BertForMeanPoolClassification"]
    # the checkpoint rules need no list of heads: the new head's weights load back, the MLM-less encoder too
    model, report = toy_head.from_pretrained(saved, return_report=True)
    assert not report.initialized and not report.unused
    encoder, report = BertModel.from_pretrained(saved, return_report=True)
    assert sorted(report.unused) == ["mean_pool_classifier.bias", "mean_pool_classifier.weight"]
    # predict finds the head by its architecture and serves it as the registry entry says (text-classification)
    predictor = Predictor.from_pretrained(saved)
    assert predictor.runner.task == "text-classification" and isinstance(predictor.model, toy_head)
    good, bad = predictor.predict(["the movie was great", "the movie was awful"])
    assert (good["label"], bad["label"]) == ("1", "0")
    with torch.no_grad():
        logits = model(**{k: torch.tensor([v]) for k, v in predictor.tokenizer("the movie was great").items()
                          if k in ("input_ids", "attention_mask", "token_type_ids")}).logits
    assert good["score"] == pytest.approx(float(logits.softmax(-1).max()), abs=1e-5)


def test_a_toy_head_distills_through_its_registry_entry(toy_head):
    """Task distillation reads how logits teach (soft_target) and the logits accessor from the entry."""
    from bertlab.tasks import TASKS
    from bertlab.train.distillation import TaskDistiller

    spec = dataclasses.replace(TASKS["sst2"], name="toy-sst2", head=toy_head)
    config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, id2label={0: "0", 1: "1"})
    torch.manual_seed(0)
    student, teacher = toy_head(config).train(), toy_head(config).eval()
    distiller = TaskDistiller(student, teacher, 2.0, 1.0, 1.0, 0.0, [], spec=spec)
    assert distiller.kind == "classes"
    batch = {"input_ids": torch.randint(5, 50, (4, 7)), "attention_mask": torch.ones(4, 7, dtype=torch.long),
             "token_type_ids": torch.zeros(4, 7, dtype=torch.long), "labels": torch.tensor([0, 1, 1, 0])}
    loss, metrics = distiller(batch)
    loss.backward()
    assert torch.isfinite(loss) and metrics["soft_loss"] > 0
    assert student.mean_pool_classifier.weight.grad.abs().sum() > 0


# ---------------------------------------------------------------------------------------------- attention seam
def _reference(q, k, v, allowed, bias=None, scale=None):
    """softmax(scale · Q Kᵀ + bias, masked) V in float64, one (batch, head) at a time."""
    scale = 1 / math.sqrt(q.size(-1)) if scale is None else scale
    scores = (q.double() @ k.double().transpose(-2, -1)) * scale
    if bias is not None:
        scores = scores + bias.double()
    scores = scores.masked_fill(~allowed, float("-inf"))
    return (scores.softmax(-1) @ v.double()).float()


@pytest.mark.parametrize("kernel", ["eager", "sdpa", "bmm"])
@pytest.mark.parametrize("kind", ["bidirectional", "causal", "prefix"])
def test_attention_mask_kinds_and_bias_match_the_formula(kernel, kind):
    g = torch.Generator().manual_seed(0)
    B, T, nh, hs = 3, 6, 2, 4
    q, k, v = (torch.randn(B, T, nh * hs, generator=g) for _ in range(3))
    lengths = torch.tensor([6, 4, 5])
    attention_mask = (torch.arange(T)[None] < lengths[:, None]).long()
    prefix = torch.tensor([2, 3, 1]) if kind == "prefix" else None
    mask = AttentionMask.padding(attention_mask, kind, prefix)
    bias = torch.randn(1, nh, T, T, generator=g)
    got, _ = attention(q, k, v, nh, mask, bias, kernel=kernel, scale=1.0)
    # what each query may see, written out: real keys; then not after the query (causal) unless in the prefix
    i, j = torch.arange(T)[:, None], torch.arange(T)[None]
    allowed = (j[None] < lengths[:, None, None]).expand(B, T, T).clone()
    if kind != "bidirectional":
        order = (j <= i)[None].expand(B, T, T)
        if kind == "prefix":
            order = order | (j[None] < prefix[:, None, None])
        allowed &= order
    split = lambda t: t.view(B, T, nh, hs).transpose(1, 2)  # noqa: E731
    want = _reference(split(q), split(k), split(v), allowed[:, None], bias, scale=1.0)
    want = want.transpose(1, 2).reshape(B, T, nh * hs)
    for b in range(B):  # rows of real queries (padded queries attend to something, but nothing reads them)
        torch.testing.assert_close(got[b, :lengths[b]], want[b, :lengths[b]], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel", ["sdpa", "bmm", "bmm_bf16"])
def test_a_decoding_step_equals_the_last_row_of_the_full_pass(kernel):
    """One query at the newest position against the keys so far (what a decoder's cache step computes; the
    `bmm` kernels take it in one C call where built) equals that position's row of the whole causal pass."""
    g = torch.Generator().manual_seed(3)
    B, T, nh, hs = 3, 7, 4, 16
    q, k, v = (torch.randn(B, T, nh * hs, generator=g) for _ in range(3))
    bias = torch.randn(1, nh, T, T, generator=g)
    keep = torch.ones(B, T, dtype=torch.long)
    keep[2, :2] = 0  # left padding in one row (a decoder-only prompt)
    full, _ = attention(q, k, v, nh, AttentionMask.padding(keep, "causal"), bias, kernel="eager", scale=1.0)
    step, _ = attention(q[:, -1:], k, v, nh, AttentionMask(keep=keep.bool()), bias[:, :, -1:], kernel=kernel,
                        scale=1.0)
    torch.testing.assert_close(step[:, 0], full[:, -1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel", ["eager", "sdpa", "bmm", "bmm_bf16"])
@pytest.mark.parametrize("T_q", [1, 3])
def test_keys_and_values_shared_by_groups_of_query_rows(kernel, T_q):
    """k, v with B / G rows (the beams of one input sharing its encoder's): every kernel gives what it gives on
    the rows repeated; fewer rows that do not divide B are refused."""
    g = torch.Generator().manual_seed(4)
    B, G, T_k, nh, hs = 6, 3, 5, 2, 16
    q = torch.randn(B, T_q, nh * hs, generator=g)
    k, v = (torch.randn(B // G, T_k, nh * hs, generator=g) for _ in range(2))
    keep = torch.ones(B, T_k, dtype=torch.long)
    keep[4, 3:] = 0
    mask = AttentionMask.padding(keep)
    got, _ = attention(q, k, v, nh, mask, kernel=kernel)
    want, _ = attention(q, k.repeat_interleave(G, 0), v.repeat_interleave(G, 0), nh, mask, kernel="eager")
    tol = 2e-2 if kernel == "bmm_bf16" and T_q > 1 else 1e-5
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    with pytest.raises(ValueError, match="a divisor expected"):
        attention(q, k[:1].repeat(4, 1, 1), v[:1].repeat(4, 1, 1), nh, mask, kernel=kernel)


# fp32 scores of one head: 6 x 6 x 4 bytes; of one row: 3 heads. Slices: the whole batch; rows 2, 2, 1; heads 2, 1.
@pytest.mark.parametrize("budget", [10**9, 2 * 3 * 6 * 6 * 4, 2 * 6 * 6 * 4])
def test_bmm_attention_in_slices_equals_the_whole(monkeypatch, budget):
    """The bmm kernel computes a slice of rows or of one row's heads at a time; every slicing gives the same
    numbers, with a per-row mask and a per-head bias (T5's relative positions)."""
    attention_module = importlib.import_module("bertlab.nn.attention")  # the package exports the function by this name
    g = torch.Generator().manual_seed(2)
    B, T, nh, hs = 5, 6, 3, 4
    q, k, v = (torch.randn(B, T, nh * hs, generator=g) for _ in range(3))
    mask = AttentionMask.padding((torch.arange(T)[None] < torch.tensor([6, 2, 5, 6, 3])[:, None]).long())
    bias = torch.randn(1, nh, T, T, generator=g)
    want, _ = attention(q, k, v, nh, mask, bias, kernel="eager")
    monkeypatch.setattr(attention_module, "SCORE_CHUNK_BYTES", budget)
    got, _ = attention(q, k, v, nh, mask, bias, kernel="bmm")
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # bf16 inputs (the bf16 model) and bf16 math on fp32 inputs (the int8 model): bf16's rounding, q's dtype out
    got16, _ = attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), nh, mask, bias, kernel="bmm")
    mixed, _ = attention(q, k, v, nh, mask, bias, kernel="bmm_bf16")
    assert got16.dtype == torch.bfloat16 and mixed.dtype == torch.float32
    for y in (got16.float(), mixed):
        torch.testing.assert_close(y, want, atol=5e-2, rtol=5e-2)


def test_attention_on_unpadded_rows_equals_the_padded_rectangle():
    g = torch.Generator().manual_seed(1)
    B, T, nh, H = 2, 5, 2, 8
    attention_mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    q, k, v = (torch.randn(B, T, H, generator=g) for _ in range(3))
    layout = TokenLayout.of(attention_mask)
    mask = AttentionMask.padding(attention_mask)
    rows, _ = attention(layout.unpad(q), layout.unpad(k), layout.unpad(v), nh, mask, layout=layout)
    full, _ = attention(q, k, v, nh, mask)
    torch.testing.assert_close(layout.pad(rows)[attention_mask.bool()], full[attention_mask.bool()])
    assert layout.cu_seqlens.tolist() == [0, 3, 8]


def test_eager_returns_probabilities_and_bad_names_are_clear():
    q = k = v = torch.randn(1, 3, 4)
    y, probs = attention(q, k, v, 2, AttentionMask("causal"), need_weights=True)
    assert probs.shape == (1, 2, 3, 3) and torch.all(probs.triu(1) == 0)
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, 2, 3))
    with pytest.raises(ValueError, match="unknown attention kernel 'flash9'; expected one of eager, sdpa"):
        attention(q, k, v, 2, kernel="flash9")
    with pytest.raises(ValueError, match="mask kind 'sideways'"):
        AttentionMask("sideways")
    with pytest.raises(ValueError, match="prefix mask needs prefix_lengths"):
        AttentionMask("prefix")


def test_the_model_runs_the_configured_kernel():
    config = BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, attn_implementation="eager")
    assert BertModel(config).encoder.layer[0].attention.self.attn_implementation == "eager"
    assert "attn_implementation" in config.to_dict() and "attn_implementation" not in \
        config.replace(attn_implementation="sdpa").to_dict()
    torch.manual_seed(0)
    eager = BertModel(config).eval()
    sdpa = BertModel(config.replace(attn_implementation="sdpa")).eval()
    sdpa.load_state_dict(eager.state_dict())
    ids = torch.randint(0, 30, (2, 5))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    torch.testing.assert_close(eager(ids, mask).last_hidden_state, sdpa(ids, mask).last_hidden_state,
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(HEADS))
def test_every_registered_head_is_what_its_entry_says(name, tiny_config):
    """Its class builds; its weights sit under its prefix; its forward returns its output type, whose logits
    the accessor finds; a detectable head is what `convert` infers from its own weights."""
    from bertlab.models.bert.convert import infer_model_class

    head = HEADS[name]
    config = tiny_config.replace(id2label={0: "a", 1: "b", 2: "c"})
    model = head.model_class(config).eval()
    keys = list(model.state_dict())
    assert any(k.startswith(head.prefix) for k in keys), keys
    ids = torch.randint(5, config.vocab_size, (2, 6))
    if name == "multiple-choice":
        ids = ids[:, None].expand(2, 3, 6)
    with torch.no_grad():
        out = model(ids)
    assert isinstance(out, head.output_type) and isinstance(head.logits(out), torch.Tensor)
    if head.detectable:
        assert infer_model_class(keys) is head.model_class


def test_an_unpadded_kernel_gets_the_rows_and_their_boundaries():
    """A kernel registered `unpadded=True` is handed (N, nh, hs) rows and the layout (a varlen kernel's
    inputs) instead of a padded rectangle; its (N, nh, hs) output goes back as (N, H) rows. A kernel that
    declines (returns None) gets the padded rectangles instead."""
    from bertlab.nn.attention import ATTENTION_KERNELS, eager_attention, register_attention_kernel

    seen = []

    def rows_kernel(q, k, v, mask, bias, dropout_p, scale, need_weights, layout=None):
        if layout is None:  # declined below: the rectangles come here
            seen.append(("rectangle", tuple(q.shape)))
            return eager_attention(q, k, v, mask, bias, dropout_p, scale, need_weights)
        seen.append(("rows", tuple(q.shape), layout.cu_seqlens.tolist()))
        if decline:
            return None
        B, T, (N, nh, hs) = layout.batch_size, layout.seq_len, q.shape
        split = lambda t: layout.pad(t.reshape(N, nh * hs)).view(B, T, nh, hs).transpose(1, 2)  # noqa: E731
        y, _ = eager_attention(split(q), split(k), split(v), mask, bias, dropout_p, scale, need_weights)
        return layout.unpad(y.transpose(1, 2).reshape(B, T, nh * hs)).view(N, nh, hs)

    register_attention_kernel("test-rows", rows_kernel, unpadded=True)
    try:
        g = torch.Generator().manual_seed(2)
        attention_mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
        q, k, v = (torch.randn(2, 4, 8, generator=g) for _ in range(3))
        layout, mask = TokenLayout.of(attention_mask), AttentionMask.padding(attention_mask)
        want, _ = attention(q, k, v, 2, mask, kernel="sdpa")
        for decline in (False, True):
            seen.clear()
            got, _ = attention(layout.unpad(q), layout.unpad(k), layout.unpad(v), 2, mask, layout=layout,
                               kernel="test-rows")
            assert seen[0] == ("rows", (6, 2, 4), [0, 2, 6])
            assert seen[1:] == ([("rectangle", (2, 2, 4, 4))] if decline else [])
            torch.testing.assert_close(got, want[attention_mask.bool()])
    finally:
        del ATTENTION_KERNELS["test-rows"]


def test_packed_rows_attend_within_their_documents():
    """A packed row's attention mask numbers its documents (1, 2, ...; 0 padding): each document's tokens
    attend to their own document only, whether the layers run unpadded (the rectangles are then one
    document per row) or on the padded batch (a block-diagonal mask) -- the same as running each document
    as a row of its own."""
    g = torch.Generator().manual_seed(4)
    packed = torch.tensor([[1, 1, 1, 2, 2, 0], [1, 1, 2, 2, 3, 3]])
    q, k, v = (torch.randn(2, 6, 8, generator=g) for _ in range(3))
    docs = [(0, slice(0, 3)), (0, slice(3, 5)), (1, slice(0, 2)), (1, slice(2, 4)), (1, slice(4, 6))]
    want = torch.cat([attention(q[b:b + 1, s], k[b:b + 1, s], v[b:b + 1, s], 2, kernel="eager")[0][0]
                      for b, s in docs])  # (N, H): each document alone
    layout, mask = TokenLayout.of(packed), AttentionMask.padding(packed)
    assert layout.packed and layout.cu_seqlens.tolist() == [0, 3, 5, 7, 9, 11]
    for kernel in ("eager", "sdpa", "bmm"):
        rows, _ = attention(layout.unpad(q), layout.unpad(k), layout.unpad(v), 2, mask, layout=layout, kernel=kernel)
        torch.testing.assert_close(rows, want, msg=f"{kernel}, unpadded")
        full, _ = attention(q, k, v, 2, mask, kernel=kernel)
        torch.testing.assert_close(full[packed > 0], want, msg=f"{kernel}, padded")
    with pytest.raises(ValueError, match="document numbers"):
        AttentionMask.padding(torch.tensor([[1, -1]]))


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_a_learned_bias_gets_the_formulas_gradient(kernel):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 5, 8, generator=g) for _ in range(3))
    bias = torch.randn(1, 2, 5, 5, generator=g, requires_grad=True)
    y, _ = attention(q, k, v, 2, AttentionMask("causal"), bias, kernel=kernel)
    (grad,) = torch.autograd.grad(y.square().sum(), bias)
    ref_bias = bias.detach().double().requires_grad_()
    split = lambda t: t.view(2, 5, 2, 4).transpose(1, 2)  # noqa: E731
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    scores = (split(q).double() @ split(k).double().transpose(-2, -1)) / 2.0 + ref_bias
    ref = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ split(v).double()
    (want,) = torch.autograd.grad(ref.square().sum(), ref_bias)
    torch.testing.assert_close(grad.double(), want, atol=1e-5, rtol=1e-4)


def test_the_registry_hands_up_what_a_family_folder_defines():
    """What the layers above `models/` once imported from BERT's and T5's folders by name they now reach
    through the registry: the default family's heads, T5's corruption transforms and SentencePiece trainer
    (found without importing model code), and the family hooks (text-to-text model and tokenizer, random
    starts, the student writer, TensorFlow conversion)."""
    from bertlab.core.errors import BertlabError
    from bertlab.models.registry import corruptions, default_head, family, vocabulary_trainer
    from bertlab.objectives import get_objective
    from bertlab.tasks import TASKS

    assert default_head("masked-lm") is family("bert").head("masked-lm").model_class
    assert get_objective("mlm").model_class is default_head("masked-lm")
    assert TASKS["conll2003"].head is default_head("token-classification")
    found = corruptions()
    assert list(found)[:2] == ["span-corruption", "iid-denoising"] and found["span-corruption"].model_type == "t5"
    assert vocabulary_trainer("sentencepiece") is not None and vocabulary_trainer("wordpiece") is None
    model_class, _ = family("t5").text_to_text()
    assert model_class.__name__ == "T5ForConditionalGeneration"
    with pytest.raises(BertlabError, match=r"^x: model_type 'bert': BERT models do not generate text, which "
                                           r"generation needs$"):
        family("bert").text_to_text("generation", "x")
    assert family("bert").random_start and family("t5").random_start and family("roberta").random_start is None
    assert family("distilbert").student_writer and family("bert").tf_conversion
