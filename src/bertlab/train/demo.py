"""`bertlab pretrain --demo`: the paper's pre-training, end to end, in a few minutes on a laptop CPU.

    1. corpus      the documentation text every Python install carries (`pydoc_data.topics`: 79 topics,
                   ~0.5 MB), written one sentence per line, or the text files the user names
    2. vocabulary  a WordPiece vocabulary learned from it (`bertlab vocab train`)
    3. data        segment pairs of 128 with static masks and NSP labels, 10% of documents held out
                   (`bertlab prepare`)
    4. training    a small BERT (BERT-Tiny: 2 layers, 128 wide), MLM + NSP, for the time budget
                   (`bertlab pretrain`), many small batches: updates matter more than batch size here
    5. report      held-out MLM / NSP accuracy before and after, fill-in-the-blank predictions, and the
                   model in Hugging Face layout under RUN_DIR/final/

Every stage is the real command's code; the demo only picks small settings. Re-running reuses the
vocabulary and data already in RUN_DIR; `--resume` continues an interrupted training.
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path

import torch

from ..errors import BertlabError

# Sentences in the docs' own style (keywords in quotes), each with one [MASK] and the word the docs use there.
PROBES = [
    ('a python program can raise an exception with the "[MASK]" statement.', "raise"),
    ('it terminates the nearest enclosing [MASK], skipping the optional "else" clause.', "loop"),
    ("a function definition is an executable [MASK].", "statement"),
    ("if the index is out of range, an [MASK] is raised.", "exception"),
    ("the [MASK] of the expression is assigned to the target.", "value"),
    ("names are bound to [MASK] in the local namespace.", "objects"),
]

DEMO_SETTINGS = dict(model="tiny", seq_len=128, batch_size=8, lr=1e-3, warmup=0.05, phase2_seq_len=0,
                     eval_batches=None, eval_batch_size=64, keep_last=2, num_workers=0, num_evals=4)


def is_prose(paragraph: str) -> bool:
    """Drop the grammar rules (`a ::= b`), interactive sessions and tables, which are mostly symbols."""
    if "::=" in paragraph or paragraph.startswith((">>>", "+-", "==")):
        return False
    letters = sum(c.isalpha() or c.isspace() for c in paragraph)
    return len(paragraph.split()) >= 3 and letters / len(paragraph) > 0.75


def write_stdlib_corpus(path: Path) -> Path:
    """`pydoc_data.topics` -> Google's corpus format: one sentence per line, a blank line between topics."""
    from ..data.readers import split_sentences

    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise BertlabError("this Python has no pydoc_data.topics; pass --demo-corpus FILE...") from None
    docs = []
    for name in sorted(topics):
        sentences = []
        for paragraph in topics[name].split("\n\n"):
            paragraph = " ".join(paragraph.split())
            if paragraph and is_prose(paragraph):
                sentences += split_sentences(paragraph)
        if sentences:
            docs.append("\n".join(sentences))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def run_demo(out: Path, corpus: list[Path] | None = None, minutes: float = 3.0, resume: bool = False,
             progress: bool = True, vocab_size: int = 3000, echo=print) -> int:
    from ..data.instances import InstanceConfig
    from ..data.masking import MaskingConfig
    from ..data.pipeline import CorpusSettings, InstanceSettings, prepare
    from ..tokenizer.train import train_vocab, write_vocab
    from .loop import check_writable
    from .pretrain import PretrainConfig, run_pretraining

    check_writable(out)
    work = out / "demo"
    started = time.perf_counter()

    # 1. corpus
    if corpus:
        missing = [str(p) for p in corpus if not Path(p).exists()]
        if missing:
            raise BertlabError(f"{missing[0]}: no such file or directory")
        files = [Path(p) for p in corpus]
        echo(f"[1/5] corpus: {', '.join(map(str, files))}")
    else:
        files = [write_stdlib_corpus(work / "python-docs.txt")]
        echo(f"[1/5] corpus: the Python documentation topics (pydoc_data.topics) -> {files[0]} "
             f"({files[0].stat().st_size / 1e6:.1f} MB)")

    # 2. vocabulary
    vocab_file = work / "vocab.txt"
    if not vocab_file.exists() or corpus:
        vocab, counts = train_vocab(files, vocab_size)
        write_vocab(vocab, vocab_file)
        echo(f"[2/5] vocabulary: {len(vocab):,} WordPiece tokens learned -> {vocab_file}")
    else:
        echo(f"[2/5] vocabulary: reusing {vocab_file}")

    # 3. data
    data_dir = work / "data"
    length = DEMO_SETTINGS["seq_len"]
    result = prepare(files, vocab_file, data_dir, CorpusSettings(heldout_fraction=0.1),
                     InstanceSettings(InstanceConfig("segment-pair", length), MaskingConfig.for_length(length),
                                      dupe_factor=5, seed=12345),
                     progress=False, echo=lambda s: None)
    sets = result.manifest["instance_sets"]
    iset = next(s for s in sets if s["name"] == result.instance_set)
    echo(f"[3/5] data: {result.tokens:,} tokens -> {iset['splits']['train']['instances']:,} training / "
         f"{iset['splits']['heldout']['instances']:,} held-out segment pairs of up to {length} tokens -> {data_dir}")

    # 4. pre-training. A small model and small batches: within minutes, the number of updates is what moves
    # a BERT off the plateau where it predicts only frequent words.
    from ..config import preset

    shape = preset(DEMO_SETTINGS["model"])
    echo(f"[4/5] pre-training a BERT of {shape.num_hidden_layers} layers, {shape.hidden_size} wide, with MLM + NSP "
         f"for {minutes:g} minutes on {'the GPU' if torch.cuda.is_available() else 'the CPU'}:")
    run_dir = out / "run"
    if not resume and (run_dir / "run_config.json").is_file():
        shutil.rmtree(run_dir)  # the demo's own previous run: start over (--resume continues it instead)
    cfg = PretrainConfig(data=str(data_dir), out=str(run_dir), time_budget=f"{minutes * 60:.0f}s",
                         resume=resume and (run_dir / "run_config.json").exists(), progress=progress,
                         **DEMO_SETTINGS)
    run = run_pretraining(cfg, echo=lambda s: echo("      " + s))
    if run.train.interrupted:
        echo(f"interrupted; continue with: bertlab pretrain --demo --out {out} --resume")
        return 130

    # 5. report
    before, after = run.eval_before, run.eval_after
    echo("[5/5] held-out results (documents the model never saw):")
    echo(f"      {'':22s} {'before':>8s} {'after':>8s}")
    for key, label in (("mlm_accuracy", "masked-word accuracy"), ("nsp_accuracy", "next-sentence accuracy"),
                       ("perplexity", "MLM perplexity")):
        if key in after:
            b = f"{before[key]:8.3f}" if key in before else f"{'-':>8s}"
            echo(f"      {label:22s} {b} {after[key]:8.3f}")
    echo("      fill in the blank (top 3):")
    for text, want, guesses in fill_in_the_blank(run.final_dir, probes(corpus, data_dir)):
        shown = ", ".join(f"{w} {p:.0%}" for w, p in guesses)
        echo(f"        {text:66s} -> {shown}" + (f"   (the docs: {want})" if want else ""))
    echo(f"      model: {run.final_dir} -- loads with bertlab.BertForPreTraining.from_pretrained and with "
         f"transformers.BertForPreTraining / pipeline('fill-mask', model=...)")
    echo(f"done in {(time.perf_counter() - started) / 60:.1f} minutes")
    return 0


def probes(corpus: list[Path] | None, data_dir: Path) -> list[tuple[str, str]]:
    """The Python sentences for the default corpus; for a user's corpus, held-out sentences with one word masked."""
    if not corpus:
        return PROBES
    from ..data import DataInfo
    from ..data.shards import load_manifest, open_corpus
    from ..tokenizer import read_vocab

    info = DataInfo.load(data_dir)
    held = open_corpus(data_dir, load_manifest(data_dir), "heldout")
    vocab = read_vocab(info.vocab_file)
    rng = random.Random(0)
    out = []
    n_sentences = len(held.sentence_ends)
    for i in rng.sample(range(n_sentences), min(n_sentences, 40)):
        start = int(held.sentence_ends[i - 1]) if i else 0
        ids = [int(t) for t in held.tokens(start, int(held.sentence_ends[i]))]
        words = [vocab[t] for t in ids]
        if not 6 <= len(words) <= 25 or any(w.startswith("##") for w in words):
            continue
        j = max(range(len(words)), key=lambda k: (words[k].isalpha(), len(words[k])))
        out.append((" ".join(words[:j] + ["[MASK]"] + words[j + 1:]), words[j]))
        if len(out) == 5:
            break
    return out


@torch.no_grad()
def fill_in_the_blank(model_dir: Path, sentences: list[tuple[str, str]], k: int = 3):
    from ..heads import BertForPreTraining
    from ..tokenizer import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(model_dir)
    model = BertForPreTraining.from_pretrained(model_dir).eval()
    mask_id = tokenizer.convert_tokens_to_ids("[MASK]")
    for text, want in sentences:
        enc = tokenizer(text, return_tensors="pt")
        ids = enc["input_ids"]
        where = (ids[0] == mask_id).nonzero()
        if len(where) != 1:
            continue
        logits = model(ids, attention_mask=enc["attention_mask"],
                       token_type_ids=enc["token_type_ids"]).prediction_logits[0, int(where[0])]
        probs = logits.float().softmax(-1)
        top = probs.topk(k)
        words = tokenizer.convert_ids_to_tokens(top.indices.tolist())
        yield text, want, list(zip(words, top.values.tolist()))
