"""Instance creation and masking: parity with Google's create_pretraining_data.py, then the statistics the
issue asks for (over >= 100k tokens), then the packing modes."""

from __future__ import annotations

import collections
import random
import statistics

import numpy as np
import pytest

from bertlab.data.instances import (IS_NEXT, NO_NSP, RANDOM_NEXT, Corpus, Instance, InstanceConfig,
                                    generate_instances, instance_documents, instance_ids, packed_instances,
                                    segment_pair_instances)
from bertlab.data.masking import MaskingConfig, VocabInfo, mask_tokens, sample_span_length

# ------------------------------------------------------------------------------------------------------------
# Google's reference, transcribed from google-research/bert master, create_pretraining_data.py (Apache-2.0),
# with FLAGS.do_whole_word_mask made an argument. Used here only as the oracle. One deliberate difference,
# marked below: a ## piece that opens segment B (truncation trimmed the front of its word) does not join the
# last word of segment A across [SEP] in bertlab; the oracle is given the same rule.
MaskedLmInstance = collections.namedtuple("MaskedLmInstance", ["index", "label"])


def google_create_instances_from_document(all_documents, document_index, max_seq_length, short_seq_prob,
                                          masked_lm_prob, max_predictions_per_seq, vocab_words, rng,
                                          do_whole_word_mask):
    document = all_documents[document_index]
    max_num_tokens = max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    instances = []
    current_chunk = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            if current_chunk:
                a_end = 1
                if len(current_chunk) >= 2:
                    a_end = rng.randint(1, len(current_chunk) - 1)
                tokens_a = []
                for j in range(a_end):
                    tokens_a.extend(current_chunk[j])
                tokens_b = []
                is_random_next = False
                if len(current_chunk) == 1 or rng.random() < 0.5:
                    is_random_next = True
                    target_b_length = target_seq_length - len(tokens_a)
                    for _ in range(10):
                        random_document_index = rng.randint(0, len(all_documents) - 1)
                        if random_document_index != document_index:
                            break
                    random_document = all_documents[random_document_index]
                    random_start = rng.randint(0, len(random_document) - 1)
                    for j in range(random_start, len(random_document)):
                        tokens_b.extend(random_document[j])
                        if len(tokens_b) >= target_b_length:
                            break
                    num_unused_segments = len(current_chunk) - a_end
                    i -= num_unused_segments
                else:
                    is_random_next = False
                    for j in range(a_end, len(current_chunk)):
                        tokens_b.extend(current_chunk[j])
                google_truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
                assert len(tokens_a) >= 1
                assert len(tokens_b) >= 1
                tokens = ["[CLS]"] + tokens_a + ["[SEP]"] + tokens_b + ["[SEP]"]
                segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
                tokens, masked_lm_positions, masked_lm_labels = google_create_masked_lm_predictions(
                    tokens, masked_lm_prob, max_predictions_per_seq, vocab_words, rng, do_whole_word_mask)
                instances.append((tokens, segment_ids, is_random_next, masked_lm_positions, masked_lm_labels))
            current_chunk = []
            current_length = 0
        i += 1
    return instances


def google_create_masked_lm_predictions(tokens, masked_lm_prob, max_predictions_per_seq, vocab_words, rng,
                                        do_whole_word_mask):
    cand_indexes = []
    for (i, token) in enumerate(tokens):
        if token == "[CLS]" or token == "[SEP]":
            continue
        if (do_whole_word_mask and len(cand_indexes) >= 1 and token.startswith("##")
                and cand_indexes[-1][-1] == i - 1):  # bertlab: only a directly preceding word
            cand_indexes[-1].append(i)
        else:
            cand_indexes.append([i])
    rng.shuffle(cand_indexes)
    output_tokens = list(tokens)
    num_to_predict = min(max_predictions_per_seq, max(1, int(round(len(tokens) * masked_lm_prob))))
    masked_lms = []
    covered_indexes = set()
    for index_set in cand_indexes:
        if len(masked_lms) >= num_to_predict:
            break
        if len(masked_lms) + len(index_set) > num_to_predict:
            continue
        is_any_index_covered = False
        for index in index_set:
            if index in covered_indexes:
                is_any_index_covered = True
                break
        if is_any_index_covered:
            continue
        for index in index_set:
            covered_indexes.add(index)
            masked_token = None
            if rng.random() < 0.8:
                masked_token = "[MASK]"
            else:
                if rng.random() < 0.5:
                    masked_token = tokens[index]
                else:
                    masked_token = vocab_words[rng.randint(0, len(vocab_words) - 1)]
            output_tokens[index] = masked_token
            masked_lms.append(MaskedLmInstance(index=index, label=tokens[index]))
    assert len(masked_lms) <= num_to_predict
    masked_lms = sorted(masked_lms, key=lambda x: x.index)
    return output_tokens, [p.index for p in masked_lms], [p.label for p in masked_lms]


def google_truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng):
    while True:
        total_length = len(tokens_a) + len(tokens_b)
        if total_length <= max_num_tokens:
            break
        trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        assert len(trunc_tokens) >= 1
        if rng.random() < 0.5:
            del trunc_tokens[0]
        else:
            trunc_tokens.pop()


# ------------------------------------------------------------------------------------------------------------
# A synthetic vocabulary: specials, words, and ## pieces, so whole-word grouping is exercised.
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = [f"w{i}" for i in range(300)]
PIECES = [f"##p{i}" for i in range(100)]
VOCAB_WORDS = SPECIALS + WORDS + PIECES
TOKEN_ID = {t: i for i, t in enumerate(VOCAB_WORDS)}
VOCAB = VocabInfo.from_tokens(VOCAB_WORDS)
CLS, SEP = TOKEN_ID["[CLS]"], TOKEN_ID["[SEP]"]


def synthetic_documents(seed: int, num_docs: int, sentences=(1, 30), words=(3, 25)) -> list[list[list[int]]]:
    """Documents of sentences of words; a third of the words carry one or two ## pieces."""
    rng = random.Random(seed)
    docs = []
    for _ in range(num_docs):
        doc = []
        for _ in range(rng.randint(*sentences)):
            sent = []
            for _ in range(rng.randint(*words)):
                sent.append(TOKEN_ID[rng.choice(WORDS)])
                if rng.random() < 0.33:
                    sent.extend(TOKEN_ID[rng.choice(PIECES)] for _ in range(rng.randint(1, 2)))
            doc.append(sent)
        docs.append(doc)
    return docs


@pytest.mark.parametrize("whole_word", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_segment_pair_matches_google_call_for_call(whole_word, seed):
    docs = synthetic_documents(seed, 25)
    corpus = Corpus.from_documents(docs)
    config = InstanceConfig("segment-pair", max_seq_length=64, short_seq_prob=0.1, nsp_balance=False)
    masking = MaskingConfig(granularity="whole-word" if whole_word else "token", max_predictions_per_seq=10)

    google_docs = [[[VOCAB_WORDS[t] for t in s] for s in d] for d in docs]
    rng = random.Random(seed)
    expected = []
    for d in range(len(google_docs)):
        expected.extend(google_create_instances_from_document(google_docs, d, 64, 0.1, 0.15, 10, VOCAB_WORDS, rng,
                                                              whole_word))
    rng = random.Random(seed)
    got = []
    for inst in generate_instances(corpus, 0, corpus.num_documents, config, rng):
        ids, types = instance_ids(inst, corpus, CLS, SEP)
        m = mask_tokens(ids.tolist(), masking, VOCAB, rng)  # masked before the next instance, as Google does
        got.append(([VOCAB_WORDS[t] for t in m.input_ids], types.tolist(), inst.next_sentence_label == RANDOM_NEXT,
                    m.positions, [VOCAB_WORDS[t] for t in m.labels]))
    assert len(got) == len(expected) > 20
    # The same random state afterwards means the same number of draws, in the same order.
    assert got == expected


def test_truncation_trims_both_ends():
    """truncate_seq_pair takes tokens off the front and the back (not just the back)."""
    docs = [[list(range(5, 205))], [list(range(205, 305))]]  # one 200-token sentence each
    corpus = Corpus.from_documents(docs)
    config = InstanceConfig("segment-pair", max_seq_length=32, short_seq_prob=0.0)
    fronts = set()
    for seed in range(20):
        for inst in segment_pair_instances(corpus, 0, config, random.Random(seed)):
            assert inst.a_len + inst.b_len == 29
            fronts.add(inst.a_start)
    assert len(fronts) > 1 and min(fronts) >= 0


# ------------------------------------------------------------------------------------------------------------
# Statistics over >= 100k tokens
@pytest.fixture(scope="module")
def big_corpus() -> Corpus:
    corpus = Corpus.from_documents(synthetic_documents(7, 500, sentences=(5, 60)))
    assert corpus.num_tokens > 100_000
    return corpus


def _masked_stats(corpus, config, masking, seed=0):
    rng = random.Random(seed)
    total = masked = n_mask = n_keep = n_random = 0
    labels = collections.Counter()
    lengths = []
    for inst in generate_instances(corpus, 0, corpus.num_documents, config, rng):
        ids, types = instance_ids(inst, corpus, CLS, SEP)
        ids = ids.tolist()
        m = mask_tokens(ids, masking, VOCAB, rng)
        assert len(ids) <= config.max_seq_length
        lengths.append(len(ids))
        labels[inst.next_sentence_label] += 1
        total += len(ids)
        masked += len(m.positions)
        for p, label in zip(m.positions, m.labels):
            assert ids[p] == label
            assert label not in VOCAB.special_ids, "a special token was masked"
            out = m.input_ids[p]
            if out == VOCAB.mask_id:
                n_mask += 1
            elif out == label:
                n_keep += 1
            else:
                n_random += 1
        # Unmasked positions are untouched.
        chosen = set(m.positions)
        assert all(m.input_ids[i] == ids[i] for i in range(len(ids)) if i not in chosen)
        # Segment ids: [CLS] A [SEP] are 0, B [SEP] are 1 (pair modes); all 0 otherwise.
        if inst.next_sentence_label != NO_NSP:
            assert types.tolist() == [0] * (inst.a_len + 2) + [1] * (inst.b_len + 1)
            assert ids[0] == CLS and ids[inst.a_len + 1] == SEP and ids[-1] == SEP
        else:
            assert not types.any() and ids[0] == CLS and ids[-1] == SEP
    return dict(total=total, masked=masked, mask=n_mask / masked, keep=n_keep / masked,
                random=n_random / masked, labels=labels, lengths=lengths)


@pytest.mark.parametrize("granularity", ["token", "whole-word", "span"])
def test_masking_statistics(big_corpus, granularity):
    config = InstanceConfig("segment-pair", max_seq_length=128)
    masking = MaskingConfig(granularity=granularity, max_predictions_per_seq=20)
    s = _masked_stats(big_corpus, config, masking)
    assert s["total"] >= 100_000
    assert abs(s["masked"] / s["total"] - 0.15) < 0.005
    if granularity != "span":  # per-span decisions make the split lumpier; checked with more spans below
        assert abs(s["mask"] - 0.8) < 0.01 and abs(s["keep"] - 0.1) < 0.01 and abs(s["random"] - 0.1) < 0.01
    assert max(s["lengths"]) <= 128


def test_nsp_is_half_random(big_corpus):
    for mode in ("segment-pair", "sentence-pair"):
        labels = collections.Counter(inst.next_sentence_label for inst in generate_instances(
            big_corpus, 0, big_corpus.num_documents, InstanceConfig(mode, 128), random.Random(3)))
        n = labels[IS_NEXT] + labels[RANDOM_NEXT]
        assert n > 1000 and labels[NO_NSP] == 0
        assert abs(labels[IS_NEXT] / n - 0.5) < 0.02, (mode, labels)


def test_whole_word_never_splits_a_word(big_corpus):
    masking = MaskingConfig(granularity="whole-word", max_predictions_per_seq=20)
    rng = random.Random(5)
    for inst in generate_instances(big_corpus, 0, 100, InstanceConfig("segment-pair", 128), rng):
        ids = instance_ids(inst, big_corpus, CLS, SEP)[0].tolist()
        chosen = set(mask_tokens(ids, masking, VOCAB, rng).positions)
        for i in range(1, len(ids)):
            # a ## piece and the token it continues are masked together or not at all
            if VOCAB.is_continuation[ids[i]] and ids[i - 1] not in VOCAB.special_ids:
                assert (i in chosen) == (i - 1 in chosen)


def test_span_lengths():
    masking = MaskingConfig(granularity="span")
    rng = random.Random(0)
    sampled = [sample_span_length(masking, rng) for _ in range(200_000)]
    assert abs(statistics.mean(sampled) - 3.8) < 0.05  # Geometric(0.2) restricted to 1..10: mean 3.797
    assert min(sampled) == 1 and max(sampled) == 10

    # Spans placed in long sequences: whole words, one 80/10/10 decision per span, lengths near 3.8.
    corpus = Corpus.from_documents(synthetic_documents(11, 200, sentences=(20, 60)))
    masking = MaskingConfig(granularity="span", max_predictions_per_seq=80)
    placed, actions = [], collections.Counter()
    for inst in generate_instances(corpus, 0, corpus.num_documents, InstanceConfig("doc-sentences", 512),
                                   random.Random(1)):
        ids = instance_ids(inst, corpus, CLS, SEP)[0].tolist()
        m = mask_tokens(ids, masking, VOCAB, rng)
        placed.extend(m.span_words)
        chosen = set(m.positions)
        for i in range(1, len(ids)):
            if VOCAB.is_continuation[ids[i]] and ids[i - 1] not in VOCAB.special_ids:
                assert (i in chosen) == (i - 1 in chosen)
        for p in m.positions:
            kind = "mask" if m.input_ids[p] == VOCAB.mask_id else "keep" if m.input_ids[p] == ids[p] else "random"
            actions[kind] += 1
    assert len(placed) > 4000
    # Spans are shortened only where no place fits them whole (mostly the last span of the budget).
    assert 3.45 < statistics.mean(placed) < 3.85
    total = sum(actions.values())
    assert abs(actions["mask"] / total - 0.8) < 0.02 and abs(actions["keep"] / total - 0.1) < 0.02


# ------------------------------------------------------------------------------------------------------------
def test_full_sentences_packing_and_separators():
    docs = synthetic_documents(2, 40, sentences=(1, 8), words=(2, 10))
    corpus = Corpus.from_documents(docs)
    config = InstanceConfig("full-sentences", max_seq_length=64)
    instances = list(packed_instances(corpus, 0, corpus.num_documents, config))
    # Every token appears exactly once, in order.
    assert instances[0].a_start == 0
    for x, y in zip(instances, instances[1:]):
        assert x.a_start + x.a_len == y.a_start
    assert instances[-1].a_start + instances[-1].a_len == corpus.num_tokens
    dte = set(corpus.doc_token_ends.tolist())
    sentence_ends = set(corpus.sentence_ends.tolist()) | {0}
    crossing = 0
    for inst in instances:
        ids, types = instance_ids(inst, corpus, CLS, SEP)
        assert len(ids) <= 64 and not types.any() and inst.next_sentence_label == NO_NSP
        inner = [e for e in dte if inst.a_start < e < inst.a_start + inst.a_len]
        crossing += bool(inner)
        assert (ids == SEP).sum() == 1 + len(inner)
        assert inst.a_start in sentence_ends  # whole sentences
    assert crossing > 0


def test_instance_documents_number_each_document_of_a_packed_row():
    """Document numbers follow the [SEP]s: [CLS] and the first document are 1, each [SEP] closes its document,
    the tokens after it are the next; the numbers match the corpus' documents token for token."""
    docs = synthetic_documents(2, 40, sentences=(1, 8), words=(2, 10))
    corpus = Corpus.from_documents(docs)
    doc_of_token = np.searchsorted(corpus.doc_token_ends, np.arange(corpus.num_tokens), side="right")
    several = 0
    for inst in packed_instances(corpus, 0, corpus.num_documents, InstanceConfig("full-sentences", 64)):
        ids, _ = instance_ids(inst, corpus, CLS, SEP)
        numbers = instance_documents(inst, corpus)
        assert numbers.shape == ids.shape and numbers[0] == 1 and (np.diff(numbers) >= 0).all()
        seps = np.flatnonzero(ids == SEP)
        assert numbers.max() == len(seps) and (numbers[seps] == np.arange(1, len(seps) + 1)).all()
        real = (ids != CLS) & (ids != SEP)
        want = doc_of_token[inst.a_start:inst.a_start + inst.a_len]
        assert (numbers[real] - 1 == want - want[0]).all()
        several += numbers.max() > 1
    assert several > 0
    pair = Instance(0, 5, 10, 7, IS_NEXT)
    assert (instance_documents(pair, corpus) == 1).all() and len(instance_documents(pair, corpus)) == 15


def test_doc_sentences_stays_within_documents():
    docs = synthetic_documents(4, 40, sentences=(1, 8), words=(2, 10))
    corpus = Corpus.from_documents(docs)
    ends = corpus.doc_token_ends.tolist()
    for inst in packed_instances(corpus, 0, corpus.num_documents, InstanceConfig("doc-sentences", 64)):
        assert not any(inst.a_start < e < inst.a_start + inst.a_len for e in ends)
        assert (instance_ids(inst, corpus, CLS, SEP)[0] == SEP).sum() == 1


def test_overlong_sentence_is_cut_into_pieces():
    corpus = Corpus.from_documents([[list(range(5, 305))], [[7, 8, 9]]])
    for mode in ("full-sentences", "doc-sentences"):
        instances = list(packed_instances(corpus, 0, 2, InstanceConfig(mode, max_seq_length=64)))
        assert sum(i.a_len for i in instances) == 303
        assert all(len(instance_ids(i, corpus, CLS, SEP)[0]) <= 64 for i in instances)


def test_multi_shard_corpus_reads_across_shards():
    docs = synthetic_documents(9, 10)
    whole = Corpus.from_documents(docs)
    flat = whole.shards[0]
    sharded = Corpus([flat[:100], flat[100:250], flat[250:]], whole.sentence_ends, whole.document_ends)
    for start, end in [(0, 10), (95, 105), (90, 260), (250, 251), (0, len(flat))]:
        assert sharded.tokens(start, end).tolist() == flat[start:end].tolist()
