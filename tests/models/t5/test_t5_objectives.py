"""T5's objectives (`bertlab.models.t5.denoising`) and their data (`t5_data`, `t5_loader`, `prepare --objective`):
span corruption realises its density and mean span length over 10,000 examples; its noise masks are those of
an independent re-statement of T5's `random_spans_noise_mask`; sentinels are unique and in order; inputs and
targets give back the original for every objective where that holds; everything is a function of the seed;
batches for encoder-decoder and decoder-only models come from (seed, step), so a resumed run sees the same
ones; bad names and parameters are one clear line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bertlab.cli import main
from bertlab.core.labels import IGNORE_INDEX
from bertlab.models.t5.denoising import (DENOISING_OBJECTIVES, SentinelVocab, TextToText, make_objective,
                                         random_spans_noise_mask, span_starts)
from bertlab.data.readers import DataError

VOCAB = SentinelVocab(vocab_size=1100, num_sentinels=100, eos_id=1, pad_id=0, mask_id=1099, random_low=3,
                      random_high=1000)
SENTINEL_OBJECTIVES = ("span-corruption", "iid-denoising")
REASSEMBLING = ("span-corruption", "iid-denoising", "bert-style", "mass-style", "deshuffle", "prefix-lm")


def _tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(VOCAB.random_low, VOCAB.random_high, size=n)


# ---------------------------------------------------------------------------------------------- T5, restated
def t5_random_spans_noise_mask(length, noise_density, shuffle, mean_noise_span_length=3.0):
    """T5's `random_spans_noise_mask` (t5/data/preprocessors.py), op for op in numpy: tf.round -> np.round
    (both half to even) in float32, `seqio.stateless_shuffle` -> `shuffle`, segment sums -> bincount."""
    orig_length = length
    length = max(length, 2)

    def to_int(x):
        return np.asarray(x).astype(np.int32)

    def to_float(x):
        return np.asarray(x).astype(np.float32)

    num_noise_tokens = to_int(np.round(to_float(length) * np.float32(noise_density)))
    num_noise_tokens = np.minimum(np.maximum(num_noise_tokens, 1), length - 1)
    num_noise_spans = to_int(np.round(to_float(num_noise_tokens) / np.float32(mean_noise_span_length)))
    num_noise_spans = np.maximum(num_noise_spans, 1)
    num_nonnoise_tokens = length - num_noise_tokens

    def _random_segmentation(num_items, num_segments):
        first_in_segment = np.pad(shuffle(to_int(np.arange(num_items - 1) < num_segments - 1)), [[1, 0]])
        segment_id = np.cumsum(first_in_segment)
        segment_length = np.bincount(segment_id, weights=np.ones_like(segment_id)).astype(np.int32)
        return segment_length

    noise_span_lengths = _random_segmentation(num_noise_tokens, num_noise_spans)
    nonnoise_span_lengths = _random_segmentation(num_nonnoise_tokens, num_noise_spans)
    interleaved_span_lengths = np.reshape(np.stack([nonnoise_span_lengths, noise_span_lengths], axis=1),
                                          [num_noise_spans * 2])
    span_starts_ = np.cumsum(interleaved_span_lengths)[:-1]
    span_start_indicator = np.bincount(span_starts_, minlength=length)
    span_num = np.cumsum(span_start_indicator)
    is_noise = np.equal(span_num % 2, 1)
    return is_noise[:orig_length]


@pytest.mark.parametrize("density,mean", [(0.15, 3.0), (0.5, 3.0), (0.15, 1.0), (0.3, 8.0), (0.25, 10.0)])
def test_noise_masks_are_t5s_given_the_same_random_segmentation(density, mean):
    for length in [1, 2, 3, 5, 10, 17, 64, 100, 511, 568]:
        for seed in range(5):
            ours = random_spans_noise_mask(length, density, mean, np.random.default_rng(seed))
            t5 = t5_random_spans_noise_mask(length, density, np.random.default_rng(seed).permutation, mean)
            assert ours.dtype == bool and ours.tolist() == t5.tolist(), (length, seed)


def test_noise_mask_statistics_match_t5s_with_independent_draws():
    """Without shared draws: the distribution of span lengths and of where noise falls is the same."""
    ours_rng, t5_rng = np.random.default_rng(1), np.random.default_rng(2)
    ours = np.stack([random_spans_noise_mask(100, 0.15, 3.0, ours_rng) for _ in range(4000)])
    t5 = np.stack([t5_random_spans_noise_mask(100, 0.15, t5_rng.permutation) for _ in range(4000)])
    assert ours.sum(1).tolist() == t5.sum(1).tolist()  # the counts are deterministic: 15 of 100
    np.testing.assert_allclose(ours.mean(0), t5.mean(0), atol=0.04)  # noise rate at each position

    def span_lengths(masks):
        out = []
        for m in masks:
            edges = np.diff(np.concatenate([[0], m.astype(int), [0]]))
            out.extend(np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1))
        return np.bincount(out, minlength=16)[:16] / len(out)

    np.testing.assert_allclose(span_lengths(ours), span_lengths(t5), atol=0.015)


# ---------------------------------------------------------------------------------------------- span corruption
def test_span_corruption_realises_its_density_and_mean_span_length_over_10000_examples():
    objective = make_objective("span-corruption")
    length = objective.source_length(512)
    assert (length, objective.targets_length(512)) == (568, 114)  # T5's random_spans_helper numbers
    rng = np.random.default_rng(0)
    noise = spans = tokens = 0
    longest_inputs = longest_targets = 0
    for _ in range(10_000):
        ex = objective(_tokens(rng, length), VOCAB, rng)
        k = sum(1 for t in ex.targets.tolist() if VOCAB.sentinel_index(t) is not None)
        noise += len(ex.targets) - 1 - k
        spans += k
        tokens += length
        longest_inputs, longest_targets = max(longest_inputs, len(ex.inputs)), max(longest_targets, len(ex.targets))
    assert abs(noise / tokens - 0.15) <= 0.005
    assert abs(noise / spans - 3.0) <= 0.1
    assert longest_inputs == 512 and longest_targets == 114


@pytest.mark.parametrize("name", SENTINEL_OBJECTIVES)
def test_sentinels_are_unique_and_in_order(name):
    objective = make_objective(name)
    rng = np.random.default_rng(3)
    for n in [2, 3, 7, 50, 200, 568]:
        for _ in range(30):
            ex = objective(_tokens(rng, n), VOCAB, rng)
            s_in = [VOCAB.sentinel_index(t) for t in ex.inputs.tolist() if VOCAB.sentinel_index(t) is not None]
            s_out = [VOCAB.sentinel_index(t) for t in ex.targets.tolist() if VOCAB.sentinel_index(t) is not None]
            assert s_in == s_out == list(range(len(s_in)))
            assert ex.inputs[-1] == ex.targets[-1] == VOCAB.eos_id
            assert VOCAB.eos_id not in ex.inputs[:-1].tolist()
            if name == "span-corruption":  # T5's masks start with text and end with noise
                assert s_in and VOCAB.sentinel_index(ex.targets[0]) == 0


def test_more_spans_than_sentinels_leaves_the_rest_uncorrupted():
    small = SentinelVocab(1003, 3, 1, 0, 1002, 3, 1000)
    rng = np.random.default_rng(0)
    tokens = _tokens(rng, 400)
    ex = make_objective("iid-denoising", noise_density=0.5)(tokens, small, rng)
    assert [small.sentinel_index(t) for t in ex.inputs.tolist() if small.sentinel_index(t) is not None] == [0, 1, 2]
    assert make_objective("iid-denoising").reassemble(ex, small).tolist() == tokens.tolist()
    with pytest.raises(DataError, match="noise spans but the vocabulary has 3 sentinels"):
        make_objective("span-corruption").check(512, small)


# ---------------------------------------------------------------------------------------------- every objective
@pytest.mark.parametrize("name", list(DENOISING_OBJECTIVES))
def test_inputs_and_targets_give_back_the_original(name):
    objective = make_objective(name)
    rng = np.random.default_rng(5)
    corrupted = total = 0
    for n in [2, 3, 10, 100, 511]:
        for _ in range(40):
            tokens = _tokens(rng, n)
            ex = objective(tokens, VOCAB, rng)
            assert ex.inputs[-1] == ex.targets[-1] == VOCAB.eos_id
            inputs, targets = ex.inputs[:-1], ex.targets[:-1]
            if name in REASSEMBLING:
                assert objective.reassemble(ex, VOCAB).tolist() == tokens.tolist()
            if name in ("bert-style", "mass-style"):  # only corrupted positions differ, each a mask or random id
                changed = inputs != tokens
                corrupted += int(changed.sum())
                total += n
                if name == "mass-style":
                    assert (inputs[changed] == VOCAB.mask_id).all()
            if name == "deshuffle":
                assert sorted(inputs.tolist()) == sorted(tokens.tolist())
            if name == "drop-tokens":  # kept and dropped tokens interleave back into the original
                assert len(inputs) + len(targets) == n and _is_subsequence(inputs, tokens)
                assert _is_subsequence(targets, tokens)
            if name == "prefix-lm":
                assert 1 <= len(inputs) <= max(n - 1, 1)
    if name in ("bert-style", "mass-style"):
        assert abs(corrupted / total - 0.15) < 0.02


def _is_subsequence(part: np.ndarray, whole: np.ndarray) -> bool:
    it = iter(whole.tolist())
    return all(any(x == y for y in it) for x in part.tolist())


def test_bert_style_replaces_90_percent_by_the_mask_and_10_by_random_tokens():
    objective = make_objective("bert-style")
    rng = np.random.default_rng(7)
    tokens = np.full(200_000, 5)  # a token the random draws almost never give back
    ex = objective(tokens, VOCAB, rng)
    changed = ex.inputs[:-1] != tokens
    masked = ex.inputs[:-1][changed] == VOCAB.mask_id
    assert abs(changed.mean() - 0.15) < 0.003
    assert abs(masked.mean() - 0.9) < 0.01
    random_ids = ex.inputs[:-1][changed][~masked]
    assert ((random_ids >= VOCAB.random_low) & (random_ids < VOCAB.random_high)).all()


@pytest.mark.parametrize("name", list(DENOISING_OBJECTIVES))
def test_deterministic_given_a_seed(name):
    objective = make_objective(name)
    tokens = _tokens(np.random.default_rng(0), 300)
    a = objective(tokens, VOCAB, np.random.default_rng(42))
    b = objective(tokens, VOCAB, np.random.default_rng(42))
    c = objective(tokens, VOCAB, np.random.default_rng(43))
    assert a.inputs.tolist() == b.inputs.tolist() and a.targets.tolist() == b.targets.tolist()
    assert (a.inputs.tolist(), a.targets.tolist()) != (c.inputs.tolist(), c.targets.tolist())
    d1 = objective.decoder_only(tokens, VOCAB, np.random.default_rng(42))
    d2 = objective.decoder_only(tokens, VOCAB, np.random.default_rng(42))
    assert d1.input_ids.tolist() == d2.input_ids.tolist() and d1.prefix_length == d2.prefix_length


def test_decoder_only_forms():
    tokens = _tokens(np.random.default_rng(0), 60)
    # prefix LM: the text itself, split where the encoder-decoder form splits it
    prefix_lm = make_objective("prefix-lm")
    enc = prefix_lm(tokens, VOCAB, np.random.default_rng(9))
    dec = prefix_lm.decoder_only(tokens, VOCAB, np.random.default_rng(9))
    assert dec.input_ids.tolist() == tokens.tolist() + [VOCAB.eos_id]
    assert dec.prefix_length == len(enc.inputs) - 1
    # a denoising objective: inputs then targets, the inputs the prefix
    span = make_objective("span-corruption")
    enc = span(tokens, VOCAB, np.random.default_rng(9))
    dec = span.decoder_only(tokens, VOCAB, np.random.default_rng(9))
    assert dec.input_ids.tolist() == enc.inputs.tolist() + enc.targets.tolist()
    assert dec.prefix_length == len(enc.inputs)


def test_bad_names_and_parameters_are_one_clear_line(tmp_path, capsys):
    with pytest.raises(DataError, match="objective: unknown 'nope'; expected one of span-corruption, iid-denoising"):
        make_objective("nope")
    for name, params, message in [
        ("span-corruption", {"mean_span_length": 0}, "--mean-span-length must be at least 1"),
        ("span-corruption", {"mean_span_length": -2}, "--mean-span-length must be at least 1"),
        ("span-corruption", {"noise_density": 0.0}, r"--noise-density must be in \(0, 1\)"),
        ("iid-denoising", {"noise_density": 1.0}, r"--noise-density must be in \(0, 1\)"),
        ("bert-style", {"noise_density": -0.1}, r"--noise-density must be in \(0, 1\)"),
        ("deshuffle", {"noise_density": 0.2}, "takes no parameters"),
        ("mass-style", {"mean_span_length": 3}, "takes only --noise-density"),
    ]:
        with pytest.raises(DataError, match=message):
            make_objective(name, **params)
    for argv, message in [
        (["--objective", "nope"], "unknown 'nope'; expected one of mlm+nsp, mlm, mlm+sop, mlm+sbo, span-corruption"),
        (["--objective", "span-corruption", "--mean-span-length", "0"], "--mean-span-length must be at least 1"),
        (["--objective", "span-corruption", "--noise-density", "1.5"], "--noise-density must be in (0, 1)"),
        (["--objective", "prefix-lm", "--masking", "span"], "--masking is a masked-LM instance setting"),
        (["--noise-density", "0.2", "--objective", "mlm"], "--noise-density is a T5 objective's parameter"),
    ]:
        assert main(["prepare", "x.txt", "--vocab", "v.txt", "--out", str(tmp_path / "d"), *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (argv, err)


# ---------------------------------------------------------------------------------------------- the data pipeline
@pytest.fixture(scope="module")
def t5_data(tmp_path_factory, shared_data):
    """WikiText-2 (valid, ~1 MB) tokenized with a SentencePiece model trained here, span-corruption examples of
    at most 64 input tokens."""
    root = tmp_path_factory.mktemp("t5-data")
    corpus = shared_data / "wikitext-2" / "wiki.valid.raw"
    assert main(["vocab", "train", "--kind", "sentencepiece", str(corpus), "--vocab-size", "800", "--out",
                 str(root / "spiece"), "--threads", "1", "--no-progress"]) == 0
    assert main(["prepare", str(corpus), "--vocab", str(root / "spiece"), "--out", str(root / "data"),
                 "--objective", "span-corruption", "--max-seq-length", "64", "--seed", "7", "--workers", "1",
                 "--quiet"]) == 0
    return root


def test_prepare_records_the_objective_and_shows_examples(t5_data, capsys):
    manifest = json.loads((t5_data / "data" / "manifest.json").read_text())
    iset = manifest["instance_sets"][-1]
    assert iset["objective"] == {"name": "span-corruption", "noise_density": 0.15, "mean_span_length": 3.0}
    assert iset["instances"] == {"mode": "text-to-text", "max_seq_length": 64, "source_length": 70,
                                 "targets_length": 14}
    assert iset["seed"] == 7 and iset["sentinel_vocab"]["vocab_size"] == 900
    assert manifest["tokenizer"]["vocab_file"].endswith("/spiece.model")
    assert main(["prepare", "--out", str(t5_data / "data"), "--show", "3"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line and not line.startswith("#")]
    assert len(lines) == 6
    for inputs, targets in zip(lines[::2], lines[1::2]):
        assert inputs.startswith("inputs: ") and targets.startswith("targets: ")
        assert "<extra_id_0>" in inputs.split() and targets.split()[1] == "<extra_id_0>"
        assert inputs.split()[-1] == targets.split()[-1] == "</s>"
        assert len(inputs.split()) - 1 <= 64


def test_batches_for_both_architectures(t5_data):
    from bertlab.data.t5_loader import TextToTextDataset

    ds = TextToTextDataset(t5_data / "data", "train", batch_size=4)
    examples = [ds.example_at(g) for g in range(4)]
    batch = ds.collator()(examples)
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert batch["input_ids"].shape[1] <= 64 and batch["labels"].shape[1] <= 16
    assert (batch["input_ids"][batch["attention_mask"] == 0] == 0).all()
    pair = ds.collator().pair(examples[1])
    assert batch["input_ids"][1, :len(pair.inputs)].tolist() == pair.inputs.tolist()
    assert batch["labels"][1, :len(pair.targets)].tolist() == pair.targets.tolist()
    assert (batch["labels"][1, len(pair.targets):] == IGNORE_INDEX).all()
    dec = ds.collator(architecture="decoder-only")(examples)
    assert set(dec) == {"input_ids", "attention_mask", "prefix_lengths", "labels"}
    for row in range(4):
        p = int(dec["prefix_lengths"][row])
        n = int(dec["attention_mask"][row].sum())
        assert (dec["labels"][row, :p] == IGNORE_INDEX).all()
        assert dec["labels"][row, p:n].tolist() == dec["input_ids"][row, p:n].tolist()
    held = TextToTextDataset(t5_data / "data", "heldout", batch_size=2)
    assert held.num_instances >= 1 and not held.shuffle


def test_batches_are_a_function_of_seed_and_step(t5_data):
    """Exact resume: the batch of step S built directly equals the S-th batch of a run from the start, with
    DataLoader workers or without; another epoch or another seed gives other noise."""
    from bertlab.data.t5_loader import TextToTextDataset, batch_at

    data = t5_data / "data"
    ds = TextToTextDataset(data, "train", seed=11, batch_size=3)
    stream = iter(ds.dataloader(num_workers=2))
    run = [next(stream) for _ in range(5)]
    for step in (0, 4):
        direct = batch_at(data, step, 3, seed=11)
        assert all(direct[k].tolist() == run[step][k].tolist() for k in direct)
    assert batch_at(data, 4, 3, seed=12)["input_ids"].tolist() != run[4]["input_ids"].tolist()
    # the same example in the next epoch is corrupted anew
    n, index = ds.num_instances, ds.instance_index(0)
    later = next(g for g in range(n, 2 * n) if ds.instance_index(g) == index)
    first, again = (ds.collator().pair(ds.example_at(g)) for g in (0, later))
    assert ds.example_at(0)["tokens"].tolist() == ds.example_at(later)["tokens"].tolist()
    assert first.inputs.tolist() != again.inputs.tolist()


def test_bert_and_t5_instance_sets_share_wordpiece_shards(tmp_path, shared_data):
    from bertlab.data import DataInfo
    from bertlab.data.t5_loader import TextToTextDataset

    vocab = shared_data / "vocab" / "bert-base-uncased.txt"
    corpus = shared_data / "bert_sample" / "sample_text.txt"
    out = tmp_path / "d"
    assert main(["prepare", str(corpus), "--vocab", str(vocab), "--out", str(out), "--max-seq-length", "64",
                 "--dupe-factor", "1", "--workers", "1", "--quiet"]) == 0
    assert main(["prepare", "--out", str(out), "--objective", "deshuffle", "--max-seq-length", "32", "--quiet"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["instance_sets"]) == 2 and len({p.name for p in out.glob("corpus-*")}) == 1
    ds = TextToTextDataset(out, "train", batch_size=2)
    assert ds.info.vocab.vocab_size == 30622 and ds.info.vocab.eos_id == 102  # [SEP] ends a WordPiece sequence
    pair = ds.collator().pair(ds.example_at(0))
    assert sorted(pair.inputs.tolist()) == sorted(pair.targets.tolist())
    with pytest.raises(DataError, match="holds text-to-text examples"):
        DataInfo.load(out)  # the default set is now T5's: BERT's loader says so in one line
    assert DataInfo.load(out, instance_set=manifest["instance_sets"][0]["name"]).mode == "segment-pair"


def test_a_sentencepiece_vocabulary_with_a_bert_objective_is_refused_before_any_work(t5_data, tmp_path, capsys):
    out = tmp_path / "d"
    assert main(["prepare", str(t5_data / "spiece" / "spiece.model"), "--vocab", str(t5_data / "spiece"), "--out",
                 str(out), "--objective", "mlm", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "serves the text-to-text objectives only" in err[0]
    assert not list(out.glob("corpus-*"))
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"\x00not a model")
    assert main(["prepare", str(t5_data / "spiece" / "tokenizer_config.json"), "--vocab", str(bad), "--out",
                 str(tmp_path / "e"), "--objective", "span-corruption"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{bad}: not a SentencePiece model" in err[0]


def test_every_objective_is_registered_under_its_name():
    assert list(DENOISING_OBJECTIVES) == ["span-corruption", "iid-denoising", "bert-style", "mass-style",
                                          "drop-tokens", "deshuffle", "prefix-lm"]
    for name, cls in DENOISING_OBJECTIVES.items():
        assert make_objective(name).name == name and cls.name == name
        assert isinstance(make_objective(name)(np.arange(3, 20), VOCAB, np.random.default_rng(0)), TextToText)


def test_span_starts_helper():
    assert span_starts(np.array([0, 1, 1, 0, 1, 0, 0, 1], dtype=bool)).tolist() == [1, 4, 7]
