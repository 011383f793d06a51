"""PretrainingDataset / PretrainingCollator: batch format, determinism, disjoint ranks and workers, O(1) resume,
dynamic masking."""

from __future__ import annotations

import pytest
import torch

from bertlab.data.instances import InstanceConfig
from bertlab.data.loader import IndexPermutation, PretrainingDataset
from bertlab.data.masking import MaskingConfig
from bertlab.data.pipeline import CorpusSettings, InstanceSettings, prepare
from bertlab.data.readers import DataError
from test_data_prepare import make_corpus, write_vocab


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """Two prepared directories: static segment pairs (NSP) and dynamic full-sentences (no NSP)."""
    root = tmp_path_factory.mktemp("loader")
    vocab = write_vocab(root / "vocab.txt")
    corpus = make_corpus(root / "c.txt", 120, seed=3)
    static, dynamic = root / "static", root / "dynamic"
    prepare([corpus], vocab, static, CorpusSettings(heldout_fraction=0.05),
            InstanceSettings(InstanceConfig("segment-pair", 64), MaskingConfig.for_length(64), dupe_factor=2, seed=1),
            workers=1)
    prepare([corpus], vocab, dynamic, CorpusSettings(heldout_fraction=0.05),
            InstanceSettings(InstanceConfig("full-sentences", 64), MaskingConfig.for_length(64, granularity="whole-word"),
                             dynamic=True, seed=1), workers=1)
    return {"static": static, "dynamic": dynamic}


def take(ds, n):
    it = iter(ds)
    return [next(it) for _ in range(n)]


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1000, 4097])
def test_index_permutation_is_a_bijection(n):
    for key in (0, 1, 12345):
        perm = IndexPermutation(n, key)
        assert sorted(perm(i) for i in range(n)) == list(range(n))
    if n >= 64:
        assert [IndexPermutation(n, 1)(i) for i in range(n)] != list(range(n))
        assert [IndexPermutation(n, 1)(i) for i in range(n)] != [IndexPermutation(n, 2)(i) for i in range(n)]


def test_batch_format_static_nsp(dirs):
    ds = PretrainingDataset(dirs["static"], seed=0, batch_size=8)
    batch = next(iter(ds.dataloader()))
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "labels", "next_sentence_label"}
    assert all(v.dtype == torch.long for v in batch.values())
    b, t = batch["input_ids"].shape
    assert b == 8 and t % 8 == 0 and t <= 64
    assert batch["next_sentence_label"].shape == (8,) and set(batch["next_sentence_label"].tolist()) <= {0, 1}
    info = ds.info
    pad = batch["attention_mask"] == 0
    assert (batch["input_ids"][pad] == info.pad_id).all() and (batch["labels"][pad] == -100).all()
    assert (batch["input_ids"][:, 0] == info.cls_id).all()
    masked = batch["labels"] != -100
    assert masked.any()
    special = torch.tensor([info.cls_id, info.sep_id, info.pad_id, info.mask_id])
    assert not torch.isin(batch["labels"][masked], special).any()
    # token types: 0 up to and including the first [SEP], 1 after it (where attended)
    for row in range(b):
        ids, types = batch["input_ids"][row], batch["token_type_ids"][row]
        first_sep = int((ids == info.sep_id).nonzero()[0])
        n = int(batch["attention_mask"][row].sum())
        assert (types[:first_sep + 1] == 0).all() and (types[first_sep + 1:n] == 1).all()
    fixed = ds.collator(pad_to_max_length=True)([ds.example_at(0), ds.example_at(1)])
    assert fixed["input_ids"].shape == (2, 64)


def test_batch_format_dynamic_without_nsp(dirs):
    ds = PretrainingDataset(dirs["dynamic"], seed=0, batch_size=4)
    batch = next(iter(ds.dataloader()))
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "labels"}
    assert (batch["token_type_ids"] == 0).all()


def test_document_attention_numbers_the_documents_of_packed_rows(dirs):
    """With document attention the mask numbers each row's documents (the same rows, the same tokens); on
    pair data it is refused in one line; token counts stay the real tokens."""
    from bertlab.train.batches import count_tokens

    ds = PretrainingDataset(dirs["dynamic"], seed=0, batch_size=8)
    plain = next(iter(ds.dataloader()))
    packed = next(iter(ds.dataloader(collate_fn=ds.collator(document_attention=True))))
    assert torch.equal(plain["input_ids"], packed["input_ids"]) and torch.equal(plain["labels"], packed["labels"])
    assert torch.equal(packed["attention_mask"] > 0, plain["attention_mask"].bool())
    assert int(packed["attention_mask"].max()) > 1  # some row holds several documents
    assert count_tokens(packed) == count_tokens(plain) == int(plain["attention_mask"].sum())
    static = PretrainingDataset(dirs["static"], seed=0, batch_size=8)
    with pytest.raises(DataError, match="document attention needs packed data"):
        static.collator(document_attention=True)


def test_same_seed_same_batches_other_seed_other_order(dirs):
    def first_batches(seed, **kw):
        ds = PretrainingDataset(dirs["dynamic"], seed=seed, batch_size=4, **kw)
        return [b["input_ids"].tolist() + b["labels"].tolist() for b, _ in zip(ds.dataloader(), range(5))]

    assert first_batches(5) == first_batches(5)
    assert first_batches(5) != first_batches(6)


def test_ranks_and_workers_split_an_epoch_disjointly(dirs):
    n = PretrainingDataset(dirs["static"]).num_instances
    for world in (1, 3):
        for workers in (1, 2, 3):
            seen: list[int] = []
            for rank in range(world):
                ds = PretrainingDataset(dirs["static"], seed=3, batch_size=5, rank=rank, world_size=world, epochs=1,
                                        shuffle=True)
                for w in range(workers):
                    positions = list(ds.positions(w, workers))
                    assert all(g % world == rank for g in positions)
                    seen.extend(ds.instance_index(g) for g in positions)
            # every instance exactly once per epoch: no two (rank, worker) pairs share one
            assert sorted(seen) == list(range(n)), (world, workers)


def test_batches_do_not_depend_on_the_number_of_dataloader_workers(dirs):
    def batches(num_workers):
        ds = PretrainingDataset(dirs["static"], seed=1, batch_size=4, rank=1, world_size=2)
        out = []
        for batch, _ in zip(ds.dataloader(num_workers=num_workers), range(6)):
            out.append(batch["input_ids"].tolist())
        return out

    assert batches(0) == batches(2)


def test_start_index_resumes_exactly(dirs):
    full = PretrainingDataset(dirs["dynamic"], seed=4, batch_size=4, rank=1, world_size=2)
    stream = [(ex["position"], ex["index"], ex["input_ids"].tolist()) for ex in take(full, 30)]
    # positions consumed after 3 steps of batch 4 on 2 ranks: 24; rank 1 resumes at its 13th sample
    resumed = PretrainingDataset(dirs["dynamic"], seed=4, batch_size=4, rank=1, world_size=2, start_index=24)
    assert [(ex["position"], ex["index"], ex["input_ids"].tolist()) for ex in take(resumed, 18)] == stream[12:]
    # far into the stream (epoch 1000) costs nothing
    far = PretrainingDataset(dirs["dynamic"], seed=4, batch_size=4, start_index=1000 * full.num_instances + 5)
    assert take(far, 1)[0]["position"] == 1000 * full.num_instances + 5


def test_dynamic_masks_change_every_epoch_and_repeat_on_resume(dirs):
    ds = PretrainingDataset(dirs["dynamic"], seed=0, batch_size=1, shuffle=False)
    collate = ds.collator()
    n = ds.num_instances
    a, b, a2 = (collate([ds.example_at(g)]) for g in (0, n, 0))
    assert a["labels"].tolist() == a2["labels"].tolist()  # the same position: the same mask
    assert (a["labels"] != -100).tolist() != (b["labels"] != -100).tolist()  # the same instance next epoch


def test_dynamic_masking_statistics(dirs):
    """Dynamic (collator) whole-word masking over >= 100k tokens."""
    ds = PretrainingDataset(dirs["dynamic"], seed=0, batch_size=64)
    total = masked = n_mask = n_keep = 0
    for batch in ds.dataloader():
        real = batch["attention_mask"] == 1
        sel = batch["labels"] != -100
        total += int(real.sum())
        masked += int(sel.sum())
        n_mask += int((batch["input_ids"][sel] == ds.info.mask_id).sum())
        n_keep += int((batch["input_ids"][sel] == batch["labels"][sel]).sum())
        if total >= 100_000:
            break
    assert total >= 100_000
    assert abs(masked / total - 0.15) < 0.005
    assert abs(n_mask / masked - 0.8) < 0.01 and abs(n_keep / masked - 0.1) < 0.01


def test_heldout_is_one_ordered_pass(dirs):
    ds = PretrainingDataset(dirs["static"], split="heldout", batch_size=3)
    examples = list(ds)
    assert [ex["index"] for ex in examples] == list(range(ds.num_instances))
    sizes = [b["input_ids"].shape[0] for b in ds.dataloader()]
    assert sum(sizes) == ds.num_instances and max(sizes) == 3


def test_bad_arguments(dirs, tmp_path):
    with pytest.raises(DataError, match="rank 2 outside world_size 2"):
        PretrainingDataset(dirs["static"], rank=2, world_size=2)
    with pytest.raises(DataError, match="no such data directory"):
        PretrainingDataset(tmp_path / "missing")
    with pytest.raises(DataError, match="no instances of max_seq_length 512"):
        PretrainingDataset(dirs["static"], max_seq_length=512)
