"""`bertlab pretrain --demo`: the paper's pre-training, end to end, in a few minutes on a laptop CPU.

    1. corpus      the documentation text every Python install carries (`pydoc_data.topics`: 79 topics,
                   ~0.5 MB), written one sentence per line, or the text files the user names
    2. vocabulary  a WordPiece vocabulary learned from it (`bertlab vocab train`)
    3. data        segment pairs of 64 tokens, 20 differently cut and masked copies, NSP labels, 10% of
                   the documents held out (`bertlab prepare`)
    4. training    a small BERT (BERT-Tiny: 2 layers, 128 wide), MLM + NSP, for the demo's planned steps
                   (`bertlab pretrain --steps --time-budget`): the same work on any machine, so the same result;
                   a busy machine takes longer, up to the demo's cap, and one line says before training how
                   long it will take -- or, where the cap cannot fit the steps, what the run will reach
    5. report      held-out MLM / NSP accuracy before and after, fill-in-the-blank predictions, the curves
                   as a PNG (with matplotlib: the `plot` extra), the model in Hugging Face layout under
                   RUN_DIR/run/final/, and the three commands to try next

`DemoSettings` holds the choices (model size, vocabulary, length, masking, schedule) and says why.

Every stage is the real command's code; the demo only picks small settings. Re-running reuses the
vocabulary and data already in RUN_DIR; `--resume` continues an interrupted training. An earlier demo's
results (RUN_DIR/run, the curves) are replaced only with `--overwrite`, as `finetune` treats its OUT_DIR.
"""

from __future__ import annotations

import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..core.errors import BertlabError

# Sentences in the docs' own style (keywords in quotes, not copied from them), each with one [MASK] whose word
# the docs' usage determines. Chosen by `benchmarks/bench_demo_probes.py` from 21 candidates on two demo runs
# with other seeds (1 and 2; the demo itself uses 0): six with different answers that both runs got right.
# Three of the demo's earlier probes ("an executable [MASK]", "the [MASK] of the expression", "bound to
# [MASK]") neither run got right: several words fit them ("an executable object" is good English).
PROBES = [
    ('it terminates the nearest enclosing [MASK], skipping the optional "else" clause.', "loop"),
    ("if the index is out of range, an [MASK] is raised.", "exception"),
    ("every object is an [MASK] of some class.", "instance"),
    ('the "with" statement calls the [MASK] manager first.', "context"),
    ("this [MASK] should return a new object.", "method"),
    ("the operands are evaluated from [MASK] to right.", "left"),
]

# A labelled file from the same documentation the demo pre-trains on, written beside its data so that its
# `finetune` next command runs as printed on any machine (GLUE's files are a download away: the docs'
# Fine-tuning page), and big enough to show learning: each sentence of four groups of topics, labelled with
# its group. A tiny file (32 made-up remarks) scored chance on its 4 dev rows.
SECTIONS = {"strings": ("formatstrings", "string-methods", "strings"),
            "exceptions": ("assert", "exceptions", "raise", "try"),
            "debugger": ("debugger",),
            "types": ("dict", "numeric-types", "sequence-types", "typesmapping", "typesseq", "typesseq-mutable")}
SECTION_ROWS = 120  # sentences per label at most: 458 rows, 98-120 a label


def section_rows() -> list[tuple[str, str]]:
    """(sentence, label) for `SECTIONS`: the prose sentences of each group's topics, in topic order, at most
    `SECTION_ROWS` a label (every k-th sentence, so each topic of a group is represented)."""
    from ..data.readers import split_sentences

    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise BertlabError("this Python has no pydoc_data.topics, which the demo's labelled file comes from") from None
    rows, seen = [], set()
    for label, names in SECTIONS.items():
        sentences = [s for name in names for paragraph in topics.get(name, "").split("\n\n")
                     if (text := " ".join(paragraph.split())) and is_prose(text)
                     for s in split_sentences(text) if len(s.split()) >= 4]
        sentences = [s for s in dict.fromkeys(sentences) if s not in seen]  # a sentence once, under one label
        seen.update(sentences)
        step = max(1, len(sentences) // SECTION_ROWS)
        rows += [(s, label) for s in sentences[::step][:SECTION_ROWS]]
    return rows


def write_sections(path: Path) -> Path:
    """`section_rows` as a CSV (text, label), for the `finetune text-classification` next command."""
    import csv

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(section_rows())
    return path


# What the next command's fine-tuning reached from a demo model (masked-word accuracy 0.27, a busy machine's run):
# dev accuracy 0.91, 0.89 and 0.91 over the 46 rows it holds out, seeds 1-3. The line says what to expect, so
# a result far below it is news
SECTIONS_EXPECTED = "about 0.9 dev accuracy (4 labels: chance 0.25)"


def next_commands(model: Path, out: Path, sections: Path) -> list[str]:
    """What to try next, each runnable as printed: its files exist, the service's JSON is labelled as such."""
    probe = "this [MASK] should return a new object."
    body = '{"texts": ["' + probe + '"]}'
    return [f'  bertlab fill-mask --model {model} --format text "every object is an [MASK] of some class."',
            f"  bertlab finetune text-classification --model {model} --train {sections} --out {out / 'sections'} "
            f"--epochs 10   # which docs' section a sentence is from: {SECTIONS_EXPECTED}; or your own CSV",
            f"  bertlab serve --model {model}   # then: curl -H 'Content-Type: application/json' -d '{body}' "
            "localhost:8000/fill-mask"]


# How long everything after training takes (step timing, final export, fill-in, the PNG): kept out of the
# training budget so the whole demo ends within `minutes`.
AFTER_TRAINING_S = 10.0


@dataclass(frozen=True)
class DemoSettings:
    """What the demo builds and trains. Chosen by measurement on a 2-core CPU (docs/notes/demo-tuning.md):
    within minutes, what moves a BERT off the plateau where it predicts only frequent words is the number of
    updates and how much each one teaches."""

    # The demo's work: what moves the model off the plateau is the number of updates, not the minutes, so the
    # run is planned in steps and the clock is only a cap. Runs of 2,323-2,721 steps reached held-out
    # masked-word accuracy 0.33-0.41 (docs/benchmarks.md, the demo); a loaded machine's time-budgeted runs of
    # 926 steps 0.21, of 145-265 steps 0.12-0.15. On a free 2-core CPU 2,400 steps take about 4m20s.
    steps: int = 2400
    minutes: float = 15.0  # the cap on the whole demo, end to end: a busy machine takes longer, at most this
    vocab_size: int = 1000  # a small WordPiece vocabulary: a cheap MLM softmax, frequent pieces
    model: str = "tiny"  # preset: 2 layers, 128 wide
    dropout: float = 0.0  # a few minutes of training underfit; dropout only slows them down
    max_seq_length: int = 64  # twice the segment pairs of 128: more distinct NSP pairs, a larger held-out set
    masked_lm_prob: float = 0.25  # more predictions per sequence: more signal per update (80/10/10 as BERT)
    # 20 static copies, each with its own segment split, random-next partner and masks. Masks drawn afresh
    # (dynamic) keep one set of pairs: the ~900 pairs of this corpus are memorised within minutes (train NSP
    # loss 0.08, held-out NSP at chance) and their large gradients, clipped at 1.0, starve the MLM.
    dupe_factor: int = 20
    short_seq_prob: float = 0.0  # Google's short targets are drawn per document: with 8 held-out documents one
    # draw can tilt the held-out next-sentence labels to 80% random-next; full-length pairs keep them 50/50
    batch_size: int = 64
    lr: float = 2e-3  # without dropout and with NSP kept honest, 2e-3 beat 1e-3 and 3e-3 (800 steps: held-out MLM
    # accuracy 0.184 / 0.161 / 0.183, NSP 0.594 / 0.579 / 0.476)
    warmup: float = 0.1
    # The peak held for the first half, then a linear decay: the step plan's early re-fits (the first fit
    # times a few cold steps and comes out pessimistic) then cannot lower the rate before the model has left
    # the frequent-word plateau. With the decay from the start, one run of three stayed there (0.17).
    decay_fraction: float = 0.5
    heldout_fraction: float = 0.1  # of the documents
    num_evals: int = 6  # held-out points on the curves
    # Fewer steps than this and the report says it fell short (the cap cut the plan, or the load rose mid-run).
    enough_steps: int = 1500
    seed: int = 0  # the model's initialisation and the order of the batches (the data's draws are fixed)

    def model_config(self, vocab_size: int):
        from ..models.registry import default_family  # a config without a model_type: the demo's encoder

        config = default_family().config_class.from_name_or_path(self.model)
        return config.replace(vocab_size=vocab_size, hidden_dropout_prob=self.dropout,
                              attention_probs_dropout_prob=self.dropout)


# Held-out masked-word accuracy by the steps a demo run did (measured: docs/benchmarks.md, the demo, and
# docs/notes/demo-tuning.md: 2,323-2,721 steps 0.33-0.41, 1,777-2,038 0.32-0.36, 926 0.21, 609 0.18,
# 145-265 0.12-0.15), highest first: what the plan line promises before training.
EXPECTED_ACCURACY = ((2300, "0.33-0.41"), (1750, "0.32-0.36"), (900, "0.20-0.25"), (500, "0.17-0.20"),
                    (0, "0.12-0.15"))


def expected_accuracy(steps: int) -> str:
    return next(text for least, text in EXPECTED_ACCURACY if steps >= least)


def plan_line(planned: int, seconds_per_step: float, settings: DemoSettings, cap_s: float) -> str:
    """One line before training: how long the demo's steps take at this machine's present pace and what they
    reach -- or, where the cap cannot fit them, how many it fits, what those reach instead, and the
    --demo-minutes that would fit them all."""
    import math

    from ..core.progress import format_duration

    want = settings.steps
    if planned >= want:
        return (f"plan: {want:,} steps, about {format_duration(want * seconds_per_step)} at this machine's pace now "
                f"({seconds_per_step:.2f} s a step; at most {format_duration(cap_s)}) -> held-out masked-word "
                f"accuracy {expected_accuracy(want)}")
    more = math.ceil(settings.minutes + 1.1 * (want - planned) * seconds_per_step / 60)
    return (f"plan: {seconds_per_step:.2f} s a step now (other work is using the CPU, or it is a slow one), so the "
            f"{format_duration(cap_s)} cap fits {planned:,} of the demo's {want:,} steps -> held-out masked-word "
            f"accuracy about {expected_accuracy(planned)} (more if the pace picks up: the plan re-fits as it goes), "
            f"not {expected_accuracy(want)}; --demo-minutes {more} fits them all")


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


DEMO_RESULTS = ("run", "curves.png")  # what a demo writes to RUN_DIR besides its reusable corpus, vocab and data
RUN_DIR_NAME, CURVES = DEMO_RESULTS


def demo_results(out: Path) -> list[Path]:
    return [out / name for name in DEMO_RESULTS if (out / name).exists()]


def claim_demo_dir(out: Path, overwrite: bool) -> None:
    """An earlier demo's model, checkpoints and curves are replaced only with `overwrite` (`run_dir.claim_run_dir`);
    an interrupted one is refused with `--resume` named."""
    from .run_dir import CHECKPOINT_DIR, claim_run_dir

    run_dir = out / RUN_DIR_NAME
    stopped = [] if (run_dir / "final").exists() else sorted((run_dir / CHECKPOINT_DIR).glob("step-*"))
    claim_run_dir(out, overwrite, demo_results, (f"{RUN_DIR_NAME}/final",), "demo run", interrupted=stopped)


def prepare_demo_data(work: Path, corpus: list[Path] | None, settings: DemoSettings = DemoSettings(),
                      echo=print) -> tuple[Path, Path, dict]:
    """Stages 1-3 of the demo in `work` (RUN_DIR/demo): the corpus, its vocabulary (reused when there), the
    masked segment pairs, and the demo model's config.json. Returns (data dir, config file, the held-out
    split's manifest entry). Also what `benchmarks/bench_threads.py` trains on."""
    import json

    from ..data.instances import InstanceConfig
    from ..data.masking import MaskingConfig
    from ..data.pipeline import CorpusSettings, InstanceSettings, prepare
    from ..tokenizer import read_vocab
    from ..tokenizer.train import train_vocab, write_vocab

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

    # 2. vocabulary: learned on this corpus, small (a cheap softmax; the words the docs use most stay whole)
    vocab_file = work / "vocab.txt"
    if not vocab_file.exists() or corpus or len(read_vocab(vocab_file)) != settings.vocab_size:
        vocab, counts = train_vocab(files, settings.vocab_size)
        write_vocab(vocab, vocab_file)
        echo(f"[2/5] vocabulary: {len(vocab):,} WordPiece tokens learned -> {vocab_file}")
    else:
        echo(f"[2/5] vocabulary: reusing {vocab_file}")

    # 3. data
    data_dir = work / "data"
    length = settings.max_seq_length
    masking = MaskingConfig.for_length(length, masked_lm_prob=settings.masked_lm_prob)
    result = prepare(files, vocab_file, data_dir, CorpusSettings(heldout_fraction=settings.heldout_fraction),
                     InstanceSettings(InstanceConfig("segment-pair", length, short_seq_prob=settings.short_seq_prob),
                                      masking, dupe_factor=settings.dupe_factor, seed=12345),
                     progress=False, echo=lambda s: None)
    sets = result.manifest["instance_sets"]
    iset = next(s for s in sets if s["name"] == result.instance_set)
    held = iset["splits"]["heldout"]
    echo(f"[3/5] data: {result.tokens:,} tokens -> {iset['splits']['train']['instances']:,} training / "
         f"{held['instances']:,} held-out segment pairs of up to {length} tokens, "
         f"{settings.masked_lm_prob:.0%} of tokens masked, {settings.dupe_factor} differently cut and masked copies "
         f"-> {data_dir}")

    model_config = settings.model_config(len(read_vocab(vocab_file)))
    config_file = work / "model_config.json"
    config_file.write_text(json.dumps(model_config.to_dict(), indent=2) + "\n")
    return data_dir, config_file, held


def run_demo(out: Path, corpus: list[Path] | None = None, minutes: float | None = None, resume: bool = False,
             progress: bool = True, settings: DemoSettings = DemoSettings(), echo=print,
             overwrite: bool = False) -> int:
    from ..core.progress import format_duration
    from .run_dir import check_writable
    from .pretrain import PretrainConfig, run_pretraining

    started = time.perf_counter()
    minutes = settings.minutes if minutes is None else minutes
    if resume:
        check_writable(out)
    else:
        claim_demo_dir(out, overwrite)
    work = out / "demo"
    data_dir, config_file, held = prepare_demo_data(work, corpus, settings, echo)
    length = settings.max_seq_length

    # 4. pre-training, for what is left of the demo's time
    from ..models.registry import family_of

    model_config = family_of(config_file).config_class.from_json_file(config_file)
    run_dir = out / RUN_DIR_NAME
    if not resume and (run_dir / "run_config.json").is_file():
        shutil.rmtree(run_dir)  # a demo that stopped before a checkpoint (claim_demo_dir let it pass): start over
    budget = minutes * 60 - (time.perf_counter() - started) - AFTER_TRAINING_S
    if budget < 10:
        raise BertlabError(f"--demo-minutes {minutes:g} leaves {budget:.0f} s for training; give at least "
                           f"{(time.perf_counter() - started + AFTER_TRAINING_S + 10) / 60:.1f}")
    echo(f"[4/5] pre-training a BERT of {model_config.num_hidden_layers} layers, {model_config.hidden_size} wide, "
         f"with MLM + NSP for {settings.steps:,} steps on {'the GPU' if torch.cuda.is_available() else 'the CPU'}, "
         f"at most {format_duration(budget)} (a busy machine takes longer; the plan shrinks only past the cap):")

    def on_plan(planned: int, seconds_per_step: float) -> None:
        echo("      " + plan_line(planned, seconds_per_step, settings, budget))

    cfg = PretrainConfig(data=str(data_dir), out=str(run_dir), model=str(config_file), time_budget=f"{budget:.0f}s",
                         steps=settings.steps,
                         resume=resume and (run_dir / "run_config.json").exists(), progress=progress,
                         max_seq_length=length, batch_size=settings.batch_size, lr=settings.lr, warmup=settings.warmup,
                         decay_fraction=settings.decay_fraction,
                         phase2_max_seq_length=0, eval_batches=None, eval_batch_size=64, keep_last=2, num_workers=0,
                         num_evals=settings.num_evals, seed=settings.seed)
    run = run_pretraining(cfg, echo=lambda s: echo("      " + s), on_plan=on_plan)
    if run.train.interrupted:
        echo(f"interrupted; continue with: bertlab pretrain --demo --out {out} --resume")
        return 130

    # 5. report
    before, after = run.eval_before, run.eval_after
    echo(f"[5/5] held-out results ({held['instances']} segment pairs from documents the model never saw):")
    echo(f"      {'':22s} {'before':>8s} {'after':>8s}")
    for key, label in (("mlm_accuracy", "masked-word accuracy"), ("nsp_accuracy", "next-sentence accuracy"),
                       ("perplexity", "MLM perplexity")):
        if key in after:
            b = f"{before[key]:8.3f}" if key in before else f"{'-':>8s}"
            echo(f"      {label:22s} {b} {after[key]:8.3f}")
    echo("      fill in the blank (top 3):")
    rows = list(fill_in_the_blank(run.final_dir, probes(corpus, data_dir)))
    for text, want, guesses in rows:
        shown = ", ".join(f"{w} {p:.0%}" for w, p in guesses)
        mark = ("ok " if want in [w for w, _ in guesses] else "-- ") if want else ""
        echo(f"      {mark}{text:66s} -> {shown}" + (f"   (the docs: {want})" if want else ""))
    right = sum(want in [w for w, _ in guesses] for _, want, guesses in rows if want)
    echo(f"      {right} of {len(rows)} blanks filled with the docs' word in the top 3")
    if run.train.step < settings.enough_steps:  # a slow or busy machine: not the demo's result, and said so
        slowed = "other work slowed the run down -- " if run.train.slowdown > 1.5 else ""
        echo(f"      NOTE: this machine did {run.train.step:,} of the demo's {settings.steps:,} training steps within "
             f"its cap; its results need about {settings.enough_steps:,} (docs: Quickstart, the demo). The numbers "
             f"above are below what the demo reaches: {slowed}run it on a quieter machine, or give it longer with "
             "--demo-minutes")
    curves = None
    try:
        from .curves import draw_curves

        curves = draw_curves(run_dir, out / CURVES)
    except BertlabError as e:  # matplotlib missing: the demo still ends well
        echo(f"      (no curves: {e})")
    model = run.final_dir
    echo(f"      model: {model} -- loads with bertlab.BertForPreTraining.from_pretrained and with "
         f"transformers.BertForPreTraining / pipeline('fill-mask', model=...)")
    if curves is not None:
        echo(f"      curves: {curves} (loss, held-out accuracy, learning rate, tokens/s)")
    sections = write_sections(work / "sections.csv")
    echo(f"done in {format_duration(time.perf_counter() - started)}. Next:")
    for line in next_commands(model, out, sections):
        echo(line)
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
    from ..models.registry import family_of

    family = family_of(model_dir)
    tokenizer = family.load_tokenizer(model_dir)
    model = family.head("pretraining", "the demo's fill-in-the-blank").model_class.from_pretrained(model_dir).eval()
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
