"""`finetune-embeddings` under torchrun on CPU (gloo): every process embeds its share of each global batch and the
objective sees every process's rows, so in-batch negatives are the global batch's -- 2 processes give the losses
and weights of one process with the global batch, for MNRL (DDP and FSDP, an odd batch split 4 / 3) and SPLADE
(DDP); rank 0 alone writes the final folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from bertlab.train.retrieval import finetune
from infer_support import tiny_model
from test_retrieval_finetune import write_pairs

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("one_thread")

SCRIPT = textwrap.dedent("""
    import sys
    import torch
    sys.path.insert(0, {tests!r})
    from bertlab.train.distributed import init_distributed
    from bertlab.train.retrieval import finetune
    from test_retrieval_distributed import embedding_config
    OUT, ENCODER, MLM, PAIRS = {out!r}, {encoder!r}, {mlm!r}, {pairs!r}
    init_distributed("cpu")
    finetune.run_finetune(embedding_config(ENCODER, PAIRS, OUT + "/ddp", "mnrl", "ddp"))
    finetune.run_finetune(embedding_config(ENCODER, PAIRS, OUT + "/fsdp", "mnrl", "fsdp"))
    finetune.run_finetune(embedding_config(MLM, PAIRS, OUT + "/splade-ddp", "splade", "ddp"))
    torch.distributed.destroy_process_group()
""")


def embedding_config(model: str, pairs: str, out: str, loss: str, sharding: str) -> finetune.EmbeddingFinetuneConfig:
    """3 steps of 7 rows with a hard negative each: 4 + 3 rows per process under torchrun."""
    return finetune.EmbeddingFinetuneConfig(model=model, train=pairs, out=out, loss=loss, batch_size=7, lr=1e-3,
                                            max_steps=3, warmup=0.0, progress=False, seed=3, sharding=sharding)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("embeddings")
    encoder = tiny_model(out / "encoder", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    mlm = tiny_model(out / "mlm", "BertForMaskedLM", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    pairs = write_pairs(out / "pairs.csv", rows=40)
    script = out / "runs.py"
    script.write_text(SCRIPT.format(tests=str(ROOT / "tests"), out=str(out), encoder=str(encoder), mlm=str(mlm),
                                    pairs=str(pairs)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script)], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    finetune.run_finetune(embedding_config(str(encoder), str(pairs), str(out / "one"), "mnrl", "none"))
    finetune.run_finetune(embedding_config(str(mlm), str(pairs), str(out / "splade-one"), "splade", "none"))
    return out


def metric(out: Path, name: str = "loss") -> list[float]:
    records = map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    return [r[name] for r in records if name in r]


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(out / "final" / "model.safetensors"))


@pytest.mark.parametrize("one, two", [("one", "ddp"), ("one", "fsdp"), ("splade-one", "splade-ddp")])
def test_two_processes_see_the_global_batch_as_one_process_does(runs, one, two):
    expected, got = metric(runs / one), metric(runs / two)
    assert len(expected) == len(got) == 3
    for a, b in zip(expected, got):
        assert abs(a - b) <= 1e-5 * abs(a), (expected, got)
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

