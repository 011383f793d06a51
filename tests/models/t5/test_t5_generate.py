"""T5 generation against `transformers`' `generate`: same model, same inputs, same settings -> the same ids, for
greedy decoding and beam search (several beam counts, length penalties and early-stopping modes) on padded
batches; the key/value cache against recomputing the decoder over the whole output every step; then
`bertlab generate`, span filling and the /generate route."""

from __future__ import annotations

import json

import pytest
import torch

from bertlab import T5Config, T5ForConditionalGeneration
from bertlab.core.errors import BertlabError
from bertlab.models.t5 import generate as generate_module
from bertlab.models.t5.generate import CachedDecoder

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")
MAX_NEW = 20
VARIANTS = {
    "v1.0": dict(feed_forward_proj="relu", tie_word_embeddings=True),
    "v1.1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False),
}
# Where </s> is made the best token: the share of teacher-forced positions (free generation sees fewer); tuned so
# that some rows of `inputs()` end early and others run to the limit, for both variants.
EOS_QUANTILE = {"v1.0": 0.1, "v1.1": 0.4}
BEAM_SETTINGS = [(3, 1.0, False), (4, 0.6, True), (2, 2.0, "never"), (3, -0.5, False)]


def lively_model(variant: str = "v1.0", architecture: str = "encoder-decoder", seed: int = 0, vocab_size: int = 99,
                 d_kv: int = 8):
    """A random tiny T5 whose outputs are not degenerate: at initializer_factor 1 a random T5 repeats one token
    forever, so weights are drawn 3x larger and the decoder's position bias is sharpened (outputs change along
    the sequence); and `</s>` is made the best token at some positions (some rows end early, exercising the stop on
    eos): its output row is moved along the mean decoder output (EOS_QUANTILE says how far). Equal encoder and decoder depth:
    transformers' own cache breaks on unequal ones (it sizes the cache from num_layers)."""
    torch.manual_seed(seed)
    config = T5Config(vocab_size=vocab_size, d_model=32, d_kv=d_kv, d_ff=64, num_layers=2, num_heads=4,
                      relative_attention_num_buckets=8, relative_attention_max_distance=20, initializer_factor=3.0,
                      architecture=architecture, **VARIANTS[variant])
    model = T5ForConditionalGeneration(config).eval()
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        model.decoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.mul_(10)
        out = model(torch.randint(2, vocab_size, (8, 12), generator=g),
                    labels=torch.randint(2, vocab_size, (8, 16), generator=g))
        h = out.last_hidden_state.reshape(-1, config.d_model)
        h = h * config.d_model ** -0.5 if config.scales_decoder_output else h
        head = model.lm_head.weight
        gap = out.logits.reshape(h.size(0), -1).max(-1).values - out.logits.reshape(h.size(0), -1)[:, 1]
        mean = h.mean(0)
        along = h @ mean
        head[1] += torch.quantile((gap / along)[along > 0], EOS_QUANTILE[variant]) * mean
    return model


def inputs(B=6, T=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 99, (B, T), generator=g)
    mask = torch.ones_like(ids)
    for row, n in enumerate((T, 7, 3, 12, 9, 1)[:B]):
        mask[row, n:] = 0
    return ids.masked_fill(mask == 0, 0), mask


def hf_twin(model, tmp_path):
    model.save_pretrained(tmp_path / "model")
    return transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "model").eval()


def after_eos_as_pad(ids: torch.Tensor, eos: int = 1, pad: int = 0) -> torch.Tensor:
    """transformers fills a finished beam's tail with `pad_token_id or eos_token_id`, i.e. with </s> when pad is 0;
    we pad with the pad id (as its greedy search does). Positions after a row's first </s> are compared as pad."""
    ended = (ids == eos).int().cumsum(1) - (ids == eos).int() > 0
    return ids.masked_fill(ended, pad)


def assert_lively(out: torch.Tensor) -> None:
    """The comparison means something only if the outputs vary and some rows stop early."""
    assert max(len(set(row.tolist())) for row in out) >= 4
    assert bool((out[:, 1:-1] == 1).any())


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("argmax", ["c", "torch"])
def test_greedy_matches_transformers(variant, argmax, tmp_path, monkeypatch):
    """Both ways of taking the argmax: the C pass (`cpu_kernels.argmax_rows`, where built) and torch's."""
    if argmax == "torch":
        monkeypatch.setattr(generate_module, "argmax_rows", lambda logits: None)
    model = lively_model(variant)
    theirs = hf_twin(model, tmp_path)
    ids, mask = inputs()
    ours = model.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW)
    ref = theirs.generate(input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False, num_beams=1)
    assert_lively(ours)
    assert torch.equal(ours, ref)
    assert (ours[:, 0] == model.config.decoder_start_token_id).all()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("num_beams,length_penalty,early_stopping", BEAM_SETTINGS)
@pytest.mark.parametrize("topk", ["c", "torch"])
def test_beam_search_matches_transformers(variant, num_beams, length_penalty, early_stopping, topk, tmp_path,
                                          monkeypatch):
    """Both ways of picking a step's candidates: the C pass (`cpu_kernels.beam_topk`, where built) and torch's."""
    if topk == "torch":
        monkeypatch.setattr(generate_module, "beam_topk", lambda *args, **kwargs: None)
    model = lively_model(variant)
    theirs = hf_twin(model, tmp_path)
    ids, mask = inputs()
    settings = dict(max_new_tokens=MAX_NEW, num_beams=num_beams, length_penalty=length_penalty,
                    early_stopping=early_stopping)
    ours = model.generate(ids, attention_mask=mask, **settings)
    ref = theirs.generate(input_ids=ids, attention_mask=mask, do_sample=False, **settings)
    assert ours.shape == ref.shape
    assert torch.equal(ours, after_eos_as_pad(ref))
    assert max(len(set(row.tolist())) for row in ours) >= 4


# ---------------------------------------------------------------------------------------------- the cache
@pytest.mark.parametrize("architecture", ["encoder-decoder", "decoder-only", "prefix-lm"])
def test_cached_step_logits_equal_full_recomputation(architecture):
    """Teacher-forced: the cached decoder's logits at every step equal the full forward pass's at that position
    (on a plain random model: the lively one's large weights amplify fp32 rounding along the layers)."""
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(T5Config(vocab_size=99, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                                num_heads=4, relative_attention_num_buckets=8,
                                                relative_attention_max_distance=20, architecture=architecture,
                                                **VARIANTS["v1.1"])).eval()
    ids, mask = inputs()
    target = torch.randint(2, 99, (6, 10), generator=torch.Generator().manual_seed(5))
    dec = model.shift_right(target)
    with torch.no_grad():
        full = model(ids, mask, decoder_input_ids=dec).logits  # (B, 10, V)
        decoder = CachedDecoder(model, ids, mask, expand=1, max_new_tokens=10)
        for t in range(10):
            step = decoder(dec[:, t:t + 1])
            torch.testing.assert_close(step, full[:, t], atol=1e-5, rtol=0)


@pytest.mark.parametrize("architecture", ["encoder-decoder", "decoder-only", "prefix-lm"])
@pytest.mark.parametrize("num_beams", [1, 3])
def test_cached_generation_equals_uncached(architecture, num_beams):
    model = lively_model("v1.0", architecture)
    ids, mask = inputs()
    cached = model.generate(ids, mask, max_new_tokens=12, num_beams=num_beams)
    recomputed = model.generate(ids, mask, max_new_tokens=12, num_beams=num_beams, use_cache=False)
    assert torch.equal(cached, recomputed)
    assert max(len(set(row.tolist())) for row in cached) >= 3


@pytest.mark.parametrize("variant", VARIANTS)
def test_beams_sharing_the_encoders_keys_and_values_match_transformers(variant, tmp_path):
    """With the bmm kernel (what CPU inference runs in int8) the beams of one input share one row of
    cross-attention keys and values instead of a copy each; beam search still equals transformers'."""
    from bertlab.nn.attention import use_attention_kernel

    model = lively_model(variant)
    theirs = hf_twin(model, tmp_path)
    use_attention_kernel(model, "bmm")
    ids, mask = inputs()
    with torch.no_grad():
        cache = CachedDecoder(model, ids, mask, expand=3, max_new_tokens=4).layers[0]
    assert cache.cross_k.size(0) == ids.size(0) and cache.self_k.size(0) == 3 * ids.size(0)
    settings = dict(max_new_tokens=MAX_NEW, num_beams=3)
    ours = model.generate(ids, attention_mask=mask, **settings)
    ref = theirs.generate(input_ids=ids, attention_mask=mask, do_sample=False, **settings)
    assert torch.equal(ours, after_eos_as_pad(ref))
    assert max(len(set(row.tolist())) for row in ours) >= 4


@pytest.mark.parametrize("architecture", ["decoder-only", "prefix-lm"])
def test_decoder_only_padded_batch_equals_rows_alone(architecture):
    model = lively_model("v1.0", architecture)
    ids, mask = inputs()
    batch = model.generate(ids, mask, max_new_tokens=8)
    for row in range(ids.size(0)):
        alone = model.generate(ids[row:row + 1, :int(mask[row].sum())], max_new_tokens=8)
        assert torch.equal(batch[row, :alone.size(1)], alone[0])


def test_bad_settings_and_too_long_input():
    model = lively_model()
    ids, mask = inputs()
    with pytest.raises(BertlabError, match="max_new_tokens must be at least 1"):
        model.generate(ids, mask, max_new_tokens=0)
    with pytest.raises(BertlabError, match="num_beams"):
        model.generate(ids, mask, num_beams=0)
    with pytest.raises(BertlabError, match="early_stopping"):
        model.generate(ids, mask, num_beams=2, early_stopping="sometimes")
    model.config.n_positions = 10
    with pytest.raises(BertlabError, match=r"input of 12 tokens is longer than the model allows \(n_positions = 10\)"):
        model.generate(ids, mask)
    assert not model.training


def test_generation_stops_when_every_row_has_ended():
    """Every row's first token made an end token (a list of eos ids): one step, then the loop stops."""
    model = lively_model()
    ids, mask = inputs()
    first = model.generate(ids, mask, max_new_tokens=1)[:, 1]
    out = model.generate(ids, mask, max_new_tokens=MAX_NEW, eos_token_id=sorted(set(first.tolist())))
    assert out.shape == (6, 2) and torch.equal(out[:, 1], first)


# ---------------------------------------------------------------------------------------------- the command
WORDS = ["the", "dog", "cat", "walks", "in", "park", "cute", "a", "runs", "big", "##s", "small", "tree", "sees"]
SENTINELS = 5


def t5_folder(tmp_path, architecture="encoder-decoder"):
    """A lively tiny T5 with T5 on WordPiece's tokenizer (`WordPieceT5Tokenizer`): [PAD] 0 and [SEP] 1 (the
    model's pad and </s> ids), words, and 5 sentinels at the end of the 99 ids."""
    from bertlab.tokenizer import BertTokenizer
    from bertlab.models.t5.tokenizer import WordPieceT5Tokenizer

    base = ["[PAD]", "[SEP]", "[UNK]", "[CLS]", "[MASK]"] + WORDS
    base += [f"w{i}" for i in range(99 - SENTINELS - len(base))]
    tokenizer = WordPieceT5Tokenizer(BertTokenizer({t: i for i, t in enumerate(base)}), extra_ids=SENTINELS)
    model = lively_model("v1.0", architecture)
    folder = tmp_path / "t5"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    vocab = {t: i for i, t in enumerate(base)}
    vocab.update({f"<extra_id_{i}>": tokenizer.sentinel_id(i) for i in range(SENTINELS)})
    return folder, model, vocab


def run_cli(capsys, *argv):
    from bertlab.cli import main

    code = main(list(map(str, argv)))
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_command_writes_json_lines(tmp_path, capsys):
    folder, model, vocab = t5_folder(tmp_path)
    texts = ["the dog walks in the park", "a cat", "big trees see the small dog", "the <extra_id_0> walks in "
             "<extra_id_1> park"]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    code, out, err = run_cli(capsys, "generate", "--model", folder, "--input", tmp_path / "in.txt",
                             "--max-new-tokens", 8, "--num-beams", 2)
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["text"] for r in rows] == texts
    # the ids are the model's own beam search on the tokenized inputs, cut after </s>
    from bertlab.infer.generate import decode, load_generation_tokenizer

    tok = load_generation_tokenizer(folder, model.config)
    ids = tok.encode(texts[3])
    assert ids == [vocab[t] for t in ["the", "<extra_id_0>", "walks", "in", "<extra_id_1>", "park", "[SEP]"]]
    for text, row in zip(texts, rows):
        expected = model.generate(torch.tensor([tok.encode(text)]), max_new_tokens=8, num_beams=2)[0, 1:].tolist()
        if 1 in expected:
            expected = expected[:expected.index(1) + 1]
        assert row["token_ids"] == expected
        assert row["generated"] == decode(expected, tok)
    assert set(rows[3]["spans"]) == {"<extra_id_0>", "<extra_id_1>"} and "filled" in rows[3]
    assert "spans" not in rows[0]


def test_generate_command_with_a_sentencepiece_model(tmp_path, capsys):
    """T5's own tokenizer: a SentencePiece model trained here (spiece.model + 100 sentinels), the model's
    vocabulary sized to it; `bertlab generate` tokenizes, generates and decodes through it."""
    import random

    from bertlab.models.t5.tokenizer import SentencePieceTrainConfig, T5Tokenizer, train_sentencepiece

    rng = random.Random(0)
    (tmp_path / "corpus.txt").write_text("\n".join(" ".join(rng.choice(WORDS[:10] + ["trees", "parks", "dogs"])
                                                            for _ in range(8)) for _ in range(300)) + "\n")
    folder = tmp_path / "t5"
    train_sentencepiece([tmp_path / "corpus.txt"], SentencePieceTrainConfig(30, threads=1), folder)
    tok = T5Tokenizer.from_pretrained(folder)
    model = lively_model("v1.1", vocab_size=tok.vocab_size)
    model.save_pretrained(folder)
    text = "the <extra_id_0> walks in <extra_id_1> park"
    code, out, err = run_cli(capsys, "generate", "--model", folder, "--max-new-tokens", 6, text)
    assert code == 0, err
    row = json.loads(out)
    ids = tok.encode(text)
    assert ids[-1] == 1 and tok.sentinel_id(0) in ids and tok.sentinel_id(1) in ids
    expected = model.generate(torch.tensor([ids]), max_new_tokens=6)[0, 1:].tolist()
    assert row["token_ids"] == (expected[:expected.index(1) + 1] if 1 in expected else expected)
    assert set(row["spans"]) == {"<extra_id_0>", "<extra_id_1>"}


def test_span_filling_reads_t5_targets(tmp_path):
    from bertlab.infer.generate import fill_spans, load_generation_tokenizer

    folder, model, vocab = t5_folder(tmp_path)
    tok = load_generation_tokenizer(folder, model.config)
    target = [vocab[t] for t in ["<extra_id_0>", "cute", "dog", "<extra_id_1>", "the", "<extra_id_2>", "[SEP]"]]
    out = fill_spans("The <extra_id_0> walks in <extra_id_1> park", target, tok)
    assert out == {"spans": {"<extra_id_0>": "cute dog", "<extra_id_1>": "the"},
                   "filled": "The cute dog walks in the park"}
    # a sentinel the model did not produce is filled with nothing
    assert fill_spans("a <extra_id_3> b", target, tok) == {"spans": {"<extra_id_3>": ""}, "filled": "a b"}


def test_generate_command_bad_input_is_one_line(tmp_path, capsys):
    folder, model, _ = t5_folder(tmp_path)
    (tmp_path / "long.txt").write_text("a cat\n" + " ".join(["dog"] * 30) + "\n")
    config = json.loads((folder / "config.json").read_text())
    config["n_positions"] = 16
    (folder / "config.json").write_text(json.dumps(config))
    code, out, err = run_cli(capsys, "generate", "--model", folder, "--input", tmp_path / "long.txt")
    assert code == 2 and out == ""
    assert err.strip().endswith("long.txt:2: 31 tokens, longer than the model allows (16; --on-long truncate cuts it)")
    assert len(err.strip().splitlines()) == 1
    code, out, err = run_cli(capsys, "generate", "--model", folder, "--input", tmp_path / "long.txt",
                             "--on-long", "truncate", "--max-new-tokens", 3)
    assert code == 0 and len(out.splitlines()) == 2

    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 32}))
    code, out, err = run_cli(capsys, "generate", "--model", bert, "a text")
    assert code == 2 and "model_type 'bert': BERT models do not generate text" in err
    assert len(err.strip().splitlines()) == 1

    config["eos_token_id"] = 2
    (folder / "config.json").write_text(json.dumps(config))
    code, out, err = run_cli(capsys, "generate", "--model", folder, "a text")
    assert code == 2 and "the tokenizer's eos_token_id is 1 but config.json says 2; they must agree" in err

    (folder / "vocab.txt").unlink()
    code, out, err = run_cli(capsys, "generate", "--model", folder, "a text")
    assert code == 2 and "no vocab.txt or tokenizer.json in this folder" in err and len(err.strip().splitlines()) == 1


def test_generate_route(tmp_path):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    import http.client

    from bertlab.infer.runtime import InferenceOptions
    from bertlab.infer.serve import create_app, load_models, start_in_thread

    from infer_support import tiny_model

    folder, _, _ = t5_folder(tmp_path)
    bert = tiny_model(tmp_path / "bert")
    running = start_in_thread(create_app(load_models(bert, InferenceOptions(), generate_model=folder)))
    try:
        conn = http.client.HTTPConnection("127.0.0.1", running.port, timeout=30)
        conn.request("POST", "/generate", body=json.dumps({"texts": ["the <extra_id_0> walks", "a dog"]}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        out = json.loads(resp.read())
    finally:
        running.stop()
    assert resp.status == 200 and len(out["predictions"]) == 2
    assert "spans" in out["predictions"][0] and "generated" in out["predictions"][1]


def test_the_ray_data_path_refuses_a_family_that_generates_text(tmp_path):
    """`predict --ray` classifies; a folder of a family that answers by generating text (T5's
    `Family.generates_text`) is refused in one line before any actor loads it."""
    from bertlab.infer.ray_data import check_predictable

    folder, _, _ = t5_folder(tmp_path)
    with pytest.raises(BertlabError, match="T5 generation runs in one process"):
        check_predictable(folder)


def test_predict_on_a_t5_folder_generates(tmp_path, capsys):
    """`bertlab predict` takes a T5 folder as any fine-tuned model: one row per input line with id and text,
    the same generation as `bertlab generate` (greedy, default length), blank lines not sent to the model."""
    folder, model, vocab = t5_folder(tmp_path)
    lines = ["the dog walks in the park", "", '{"id": "q7", "text": "the <extra_id_0> walks"}']
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    code, out, err = run_cli(capsys, "predict", "--model", folder, "--input", tmp_path / "in.txt")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["id"] for r in rows] == [1, 2, "q7"] and rows[1]["skipped"] == "blank line"
    code, out, err = run_cli(capsys, "generate", "--model", folder, "--input", tmp_path / "in.txt")
    generated = {json.loads(line)["text"]: json.loads(line) for line in out.splitlines()}
    assert rows[0]["token_ids"] == generated[lines[0]]["token_ids"]
    assert set(rows[2]["spans"]) == {"<extra_id_0>"}
    (tmp_path / "bad.txt").write_text('{"question": "no text field"}\n')
    code, out, err = run_cli(capsys, "predict", "--model", folder, "--input", tmp_path / "bad.txt")
    assert code == 2 and "'text' field" in err and len(err.strip().splitlines()) == 1
