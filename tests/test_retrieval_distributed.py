"""`finetune-embeddings` and `finetune-reranker` under torchrun on CPU (gloo).

Embeddings: every process embeds its share of each global batch and the objective sees every process's rows, so
in-batch negatives are the global batch's -- 2 processes give the losses and weights of one process with the global
batch, for MNRL (DDP and FSDP, an odd batch split 4 / 3), GradCache (cached-mnrl: DDP and FSDP, mini-batches of 3
within each share), ColBERT (DDP and FSDP) and SPLADE (DDP); rank 0 alone writes the final folder.

Reranker: each process trains its share of every batch's query groups -- listwise (DDP and FSDP), pointwise BCE
(DDP) and distillation from a teacher's scores (FSDP) give one process's losses and weights; a signal on rank 0 stops both processes with a sharded checkpoint that
2 processes resume bitwise and 1 process to fp32 rounding; the export loads in `transformers`."""

from __future__ import annotations

import csv
import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from bertlab.train.retrieval import finetune, reranker
from infer_support import WORDS, tiny_model
from test_retrieval_colbert import pairs_file
from test_retrieval_finetune import write_pairs

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("one_thread")

SCRIPT = textwrap.dedent("""
    import shutil, sys
    import torch
    sys.path.insert(0, {tests!r})
    from bertlab.train.distributed import barrier, init_distributed
    from bertlab.train.retrieval import finetune, reranker
    from test_retrieval_distributed import colbert_config, embedding_config, reranker_config
    from torchrun_support import signal_on_rank_0
    OUT, ENCODER, MLM, PAIRS, QUERIES, GROUPS = {out!r}, {encoder!r}, {mlm!r}, {pairs!r}, {queries!r}, {groups!r}
    SCORES = {scores!r}
    dist = init_distributed("cpu")
    finetune.run_finetune(embedding_config(ENCODER, PAIRS, OUT + "/ddp", "mnrl", "ddp"))
    finetune.run_finetune(embedding_config(ENCODER, PAIRS, OUT + "/fsdp", "mnrl", "fsdp"))
    finetune.run_finetune(embedding_config(MLM, PAIRS, OUT + "/splade-ddp", "splade", "ddp"))
    for sharding in ("ddp", "fsdp"):
        finetune.run_finetune(embedding_config(ENCODER, PAIRS, OUT + "/cached-" + sharding, "cached-mnrl", sharding))
        finetune.run_finetune(colbert_config(ENCODER, QUERIES, OUT + "/colbert-" + sharding, sharding))
        reranker.run_reranker(reranker_config(ENCODER, GROUPS, OUT + "/listwise-" + sharding, "listwise", sharding))
    reranker.run_reranker(reranker_config(ENCODER, GROUPS, OUT + "/bce-ddp", "bce", "ddp"))
    reranker.run_reranker(reranker_config(ENCODER, SCORES, OUT + "/distill-fsdp", "distill", "fsdp"))

    with signal_on_rank_0(dist.rank):
        stopped = reranker.run_reranker(reranker_config(ENCODER, GROUPS, OUT + "/stopped", "listwise", "fsdp"))
    assert stopped.train.interrupted and stopped.train.step == 2 and stopped.final is None, stopped.train
    if dist.rank == 0:
        shutil.copytree(OUT + "/stopped", OUT + "/stopped-copy")
    barrier(dist)
    reranker.run_reranker(reranker_config(ENCODER, GROUPS, OUT + "/stopped", "listwise", "fsdp", resume=True))
    from bertlab.train import leave_job
    leave_job(0)
""")


def embedding_config(model: str, pairs: str, out: str, loss: str, sharding: str) -> finetune.EmbeddingFinetuneConfig:
    """3 steps of 7 rows with a hard negative each: 4 + 3 rows per process under torchrun (cached-mnrl: embedded
    3 at a time in one process, in 2 mini-batches of each share under torchrun)."""
    return finetune.EmbeddingFinetuneConfig(model=model, train=pairs, out=out, loss=loss, batch_size=7, lr=1e-3,
                                            max_steps=3, warmup=0.0, progress=False, seed=3, sharding=sharding,
                                            mini_batch_size=3)


def colbert_config(model: str, rows: str, out: str, sharding: str) -> finetune.EmbeddingFinetuneConfig:
    """ColBERT's contrastive loss (in-batch and hard negatives on MaxSim), 3 steps of 7 rows, queries of 8 tokens
    ([MASK]-padded: positions that give vectors without attending)."""
    return finetune.EmbeddingFinetuneConfig(model=model, train=rows, out=out, loss="colbert", colbert_dim=16,
                                            query_length=8, document_length=16, batch_size=7, lr=1e-3, max_steps=3,
                                            warmup=0.0, progress=False, seed=3, sharding=sharding)


def reranker_config(model: str, groups: str, out: str, loss: str, sharding: str, **kw) -> reranker.RerankerConfig:
    """4 steps of 4 query groups (a positive and 2 negatives; bce: 4 pairs), 2 groups per process under torchrun."""
    return reranker.RerankerConfig(model=model, train=groups, out=out, loss=loss, batch_size=4, lr=1e-3, max_steps=4,
                                   warmup=0.0, progress=False, seed=3, sharding=sharding, **kw)


def write_groups(path: Path, rows: int = 24, seed: int = 0) -> Path:
    rng = random.Random(seed)
    words = [w for w in WORDS if w.isalpha()]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["query", "positive", "negative_1", "negative_2"])
        for _ in range(rows):
            q = rng.sample(words, 3)
            w.writerow([" ".join(q), " ".join(q + rng.sample(words, rng.randint(1, 6))),
                        *(" ".join(rng.sample(words, rng.randint(2, 8))) for _ in range(2))])
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("embeddings")
    encoder = tiny_model(out / "encoder", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    mlm = tiny_model(out / "mlm", "BertForMaskedLM", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    pairs = write_pairs(out / "pairs.csv", rows=40)
    queries = pairs_file(out / "queries.jsonl", rows=40)
    groups = write_groups(out / "groups.csv")
    scores = out / "scores.csv"  # a teacher's score per (query, passage) pair
    scores.write_text("query,passage,score\n" + "".join(f"the cat {i},a dog {i % 5},{i / 7 - 1:.3f}\n" for i in range(24)))
    script = out / "runs.py"
    script.write_text(SCRIPT.format(tests=str(ROOT / "tests"), out=str(out), encoder=str(encoder), mlm=str(mlm),
                                    pairs=str(pairs), queries=str(queries), groups=str(groups),
                                    scores=str(scores)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script)], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    finetune.run_finetune(embedding_config(str(encoder), str(pairs), str(out / "one"), "mnrl", "none"))
    finetune.run_finetune(embedding_config(str(mlm), str(pairs), str(out / "splade-one"), "splade", "none"))
    finetune.run_finetune(embedding_config(str(encoder), str(pairs), str(out / "cached-one"), "cached-mnrl", "none"))
    finetune.run_finetune(colbert_config(str(encoder), str(queries), str(out / "colbert-one"), "none"))
    for loss, rows in (("listwise", groups), ("bce", groups), ("distill", scores)):
        reranker.run_reranker(reranker_config(str(encoder), str(rows), str(out / f"{loss}-one"), loss, "none"))
    # the stopped run resumed here, in one process, from its 2-process sharded checkpoint
    reranker.run_reranker(reranker_config(str(encoder), str(groups), str(out / "stopped-copy"), "listwise", "none",
                                          resume=True))
    return out


def metric(out: Path, name: str = "loss") -> list[float]:
    records = map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    return [r[name] for r in records if name in r]


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    """Every weights file of OUT/final (a ColBERT folder's projection in 1_Dense/ too), by folder and name."""
    from safetensors.torch import load_file

    final = out / "final"
    return {f"{f.parent.relative_to(final).as_posix()}/{k}": v for f in sorted(final.glob("**/model.safetensors"))
            for k, v in load_file(str(f)).items()}


@pytest.mark.parametrize("one, two", [("one", "ddp"), ("one", "fsdp"), ("splade-one", "splade-ddp"),
                                      ("cached-one", "cached-ddp"), ("cached-one", "cached-fsdp"),
                                      ("colbert-one", "colbert-ddp"), ("colbert-one", "colbert-fsdp")])
def test_two_processes_see_the_global_batch_as_one_process_does(runs, one, two):
    """The losses and the gradients' norms (before clipping: AdamW's update would hide a gradient off by a constant
    factor) of every step, and the final weights, are one process's."""
    for name in ("loss", "grad_norm"):
        expected, got = metric(runs / one, name), metric(runs / two, name)
        assert len(expected) == len(got) == 3
        for a, b in zip(expected, got):
            assert abs(a - b) <= 1e-5 * abs(a), (name, expected, got)
    if one == "splade-one":  # the FLOPS regulariser is the global batch's too
        for a, b in zip(metric(runs / one, "flops_document"), metric(runs / two, "flops_document")):
            assert abs(a - b) <= 1e-5 * abs(a) + 1e-9
    w1, w2 = final_weights(runs / one), final_weights(runs / two)
    assert w1.keys() == w2.keys()
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], atol=1e-5, rtol=1e-4, msg=k)
    resolved = json.loads((runs / two / "run_config.json").read_text())["_resolved"]
    assert (resolved["world_size"], resolved["sharding"]) == (2, two.rsplit("-", 1)[-1])
    assert (runs / two / "final" / "modules.json").is_file() and (runs / two / "metrics.json").is_file()


def test_cached_mnrl_is_mnrl_in_one_process(runs):
    """(So the two-process GradCache runs above are the plain loss's too.)"""
    for a, b in zip(metric(runs / "one"), metric(runs / "cached-one")):
        assert abs(a - b) <= 1e-5 * abs(a)


@pytest.mark.parametrize("loss, sharding", [("listwise", "ddp"), ("listwise", "fsdp"), ("bce", "ddp"),
                                           ("distill", "fsdp")])
def test_reranker_over_two_processes_is_one_process(runs, loss, sharding):
    """Each process trains 2 of the 4 groups of a step; the losses (the first FSDP's bitwise DDP's), the gradients'
    norms and the final weights are one process's on the 4 groups, and the run records its processes and
    sharding."""
    for name in ("loss", "grad_norm"):
        expected, got = metric(runs / f"{loss}-one", name), metric(runs / f"{loss}-{sharding}", name)
        assert len(expected) == len(got) == 4
        for a, b in zip(expected, got):
            assert abs(a - b) <= 1e-5 * abs(a), (name, expected, got)
    if sharding == "fsdp" and loss == "listwise":
        assert metric(runs / f"{loss}-fsdp")[0] == metric(runs / f"{loss}-ddp")[0]
    w1, w2 = final_weights(runs / f"{loss}-one"), final_weights(runs / f"{loss}-{sharding}")
    assert w1.keys() == w2.keys()
    for k in w1:
        if loss == "listwise" and k.endswith("classifier.bias"):
            # A softmax over each group's scores does not change when one constant is added to all of them: the
            # bias's gradient is 0 but for rounding, which AdamW's normalised step turns into updates up to lr
            # either way (one process and two round differently: 1.2e-5 apart on an AMD EPYC). Bounded, not equal.
            assert float(w1[k].abs().max()) <= 4 * 1e-3 and float(w2[k].abs().max()) <= 4 * 1e-3
            continue
        torch.testing.assert_close(w2[k], w1[k], atol=1e-5, rtol=1e-4, msg=k)
    resolved = json.loads((runs / f"{loss}-{sharding}" / "run_config.json").read_text())["_resolved"]
    assert (resolved["world_size"], resolved["sharding"]) == (2, sharding)
    assert json.loads((runs / f"{loss}-{sharding}" / "metrics.json").read_text())["steps"] == 4


def test_a_reranker_stopped_on_rank_0_resumes_on_two_processes_and_on_one(runs):
    """Stopped after step 2 by a signal on rank 0 alone (a sharded checkpoint), resumed on 2 processes: bitwise the
    uninterrupted FSDP run; resumed in one process (`--sharding none`): equal to fp32 rounding."""
    assert metric(runs / "stopped") == metric(runs / "listwise-fsdp")
    whole, resumed, one = (final_weights(runs / name) for name in ("listwise-fsdp", "stopped", "stopped-copy"))
    for k in whole:
        assert torch.equal(resumed[k], whole[k]), k
        torch.testing.assert_close(one[k], whole[k], atol=1e-5, rtol=1e-4, msg=k)


def test_the_reranker_export_loads_in_transformers(runs):
    transformers = pytest.importorskip("transformers")
    from bertlab import BertForSequenceClassification

    folder = runs / "listwise-fsdp" / "final"
    theirs = transformers.BertForSequenceClassification.from_pretrained(str(folder)).eval()
    ours = BertForSequenceClassification.from_pretrained(folder).eval()
    ids = torch.randint(5, theirs.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(theirs(input_ids=ids).logits, ours(input_ids=ids).logits, atol=1e-5, rtol=1e-4)
    assert theirs.config.num_labels == 1



@pytest.mark.slow
def test_torchrun_finetune_reranker_command(tmp_path):
    """`torchrun --nproc-per-node 2 -m bertlab.cli finetune-reranker --sharding fsdp`: one report (rank 0's), the
    final folder written once."""
    encoder = tiny_model(tmp_path / "encoder")
    groups = write_groups(tmp_path / "groups.csv")
    out = tmp_path / "out"
    argv = ["finetune-reranker", "--model", encoder, "--train", groups, "--out", out, "--loss", "listwise",
            "--batch-size", 4, "--max-steps", 2, "--lr", 1e-3, "--no-progress", "--sharding", "fsdp"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "bertlab.cli", *map(str, argv)], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["steps"] == 2 and report["final"] == str(out / "final")
    assert (out / "final" / "model.safetensors").is_file() and len(metric(out)) == 2


@pytest.mark.parametrize("n, mini", [(7, 3), (7, 4), (3, 2), (1, 2), (9, 1)])
def test_gradcache_processes_run_alike_and_cover_the_batch(n, mini):
    """Under torchrun every process embeds its share of a column in as many mini-batches as every other (FSDP
    gathers weights at every forward: the processes' collectives must pair up), none larger than `mini`, and
    the shares' mini-batches cover the rows once, in order -- an empty one where a share has fewer rows."""
    from bertlab.train.retrieval.losses import _share, _spans

    covered, counts = [], set()
    for rank in range(2):
        sizes, lo, hi = _share(n, rank, 2)
        spans = _spans(lo, hi, -(-max(sizes) // mini))
        counts.add(len(spans))
        assert all(0 <= b - a <= mini for a, b in spans)
        covered += [i for a, b in spans for i in range(a, b)]
    assert len(counts) == 1 and covered == list(range(n))
