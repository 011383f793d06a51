"""Pre-training data: raw documents -> token shards -> MLM/NSP instances -> batches.

Modules, in the order data flows through them:

- `readers`: corpus files (Google's one-sentence-per-line format, plain prose, JSON Lines, WikiText) ->
  documents of sentences, with optional C4-style cleaning and a report of what was dropped and why.
- `pipeline`: `prepare()` -- tokenizes on every core into memory-mapped shards, then builds instance sets;
  streaming (flat memory), atomic (a manifest is written last), and reusing shards when inputs are unchanged.
- `shards`: the on-disk format, the manifest, and `DataInfo` / `InstanceStore` to read them back.
- `instances`: BERT's segment pairs (Google's algorithm, draw for draw), sentence pairs, and RoBERTa's
  full-sentences / doc-sentences packing -- pure functions with an injected `random.Random`.
- `masking`: token, whole-word and SpanBERT span masking, 80/10/10, static or dynamic.
- `segment`: word segmenters (jieba, or a user's function) whose words group CJK characters for whole-word
  and span masking (`prepare --segmenter jieba`); their per-token word flags are stored with the shards.
- `loader`: `PretrainingDataset` + `PretrainingCollator` for PyTorch (imports torch; the rest does not).
- T5: `t5_data` (packed text-to-text instance sets: `prepare --objective NAME`, corrupted by T5's own
  transforms -- span corruption, i.i.d. denoising, BERT-/MASS-style, drop, deshuffle, prefix LM -- which are
  the family's: `models/t5/denoising.py`) and `t5_loader` (`TextToTextDataset` +
  `TextToTextCollator`: the objective applied per example from (seed, position); encoder-decoder or
  decoder-only batches; `batch_at(data_dir, step, batch_size, seed=...)`).

Using a prepared directory for pre-training::

    from bertlab.data import DataInfo, PretrainingDataset

    info = DataInfo.load(data_dir)                      # or max_seq_length=512 for phase-2 instances
    assert info.vocab_size == config.vocab_size         # also info.vocab_sha256, info.vocab_file
    ds = PretrainingDataset(data_dir, split="train",    # or "heldout" (one unshuffled pass by default)
                            seed=0, rank=rank, world_size=world_size,
                            start_index=samples_already_seen,   # global count over all ranks: exact resume
                            batch_size=32, max_seq_length=128)
    for batch in ds.dataloader(num_workers=2):          # endless for "train": stop by step count
        out = model(**batch)                            # BertForPreTraining

Each batch is a dict of LongTensors: ``input_ids``, ``token_type_ids``, ``attention_mask`` [B, T];
``labels`` [B, T] (the original id where a token is to be predicted, -100 elsewhere); and, only for the
NSP modes (segment-pair, sentence-pair), ``next_sentence_label`` [B] (0 = B follows A, 1 = random B).
T is the longest sequence in the batch rounded up to a multiple of 8 (``ds.collator(pad_to_max_length=True)``
gives fixed [B, max_seq_length]). ``info`` also tells the mode, ``has_nsp``, the masking settings, special
ids (``pad_id`` ...), and instance/token counts per split.

Phase 2 (longer sequences) re-uses the shards: ``bertlab prepare --out DATA_DIR --max-seq-length 512``
(no corpus arguments needed) adds a 512-token instance set; select it with ``max_seq_length=512``.
"""

from .instances import MODES, Corpus, Instance, InstanceConfig, generate_instances, instance_ids
from .masking import GRANULARITIES, MaskingConfig, VocabInfo, mask_tokens
from .pipeline import CorpusSettings, InstanceSettings, PrepareResult, prepare
from .readers import CleaningConfig, DataError, Document, ReaderConfig, ReadReport, read_documents, split_sentences
from .shards import DataInfo, InstanceStore, load_manifest


def __getattr__(name: str):
    # The torch side is imported on first use, so `prepare` and the readers start without torch.
    if name in ("PretrainingDataset", "PretrainingCollator", "IndexPermutation"):
        from . import loader

        return getattr(loader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "MODES", "GRANULARITIES", "Corpus", "Instance", "InstanceConfig", "generate_instances", "instance_ids",
    "MaskingConfig", "VocabInfo", "mask_tokens", "CorpusSettings", "InstanceSettings", "PrepareResult", "prepare",
    "CleaningConfig", "DataError", "Document", "ReaderConfig", "ReadReport", "read_documents", "split_sentences",
    "DataInfo", "InstanceStore", "load_manifest", "PretrainingDataset", "PretrainingCollator", "IndexPermutation",
]
