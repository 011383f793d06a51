"""Check, with real TensorFlow, that TensorFlow reads the checkpoints bertlab's writer produces.

CI has no TensorFlow, so this is run by hand where it is installed (in a throw-away virtualenv, outside the repo):

    python3 -m venv /tmp/tfenv && /tmp/tfenv/bin/pip install tensorflow-cpu
    .venv/bin/python scripts/check_tf_reads_ours.py --tf-python /tmp/tfenv/bin/python

Step 1 (this interpreter, bertlab's): write, with bertlab only,
  * `export/`:    the tiny-BERT fixture converted to the Hugging Face layout and back (`bertlab convert --to tf`);
  * `dtypes`:     the odd-dtype fixture (float16, bfloat16, float64, int8..int64, uint8, bool, strings, scalar,
                  empty) read by our reader and re-written by our writer;
  * `multiblock`: 300 tensors with an index cut into many 256-byte blocks, so TensorFlow's seeks go through our
                  index separators and restart points;
  * `bf16/`:      a bfloat16 model exported with `--to tf`;
  and the values each should hold (`*.npz`).
Step 2 (`--check DIR`, run by the TensorFlow interpreter; imports no bertlab): `tf.train.load_checkpoint` each one,
compare every name, dtype, shape and value, restore them through the `RestoreV2` op as well, and make sure
TensorFlow *rejects* a copy with one flipped data byte (so the CRCs it checked were really ours).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "data" / "tf_ckpt"


def _expected(values: dict) -> dict:
    out = {}
    for name, v in values.items():
        out[name] = v.astype("S") if v.dtype == object else v
    return out


def write_all(work: Path) -> list[dict]:
    import torch

    from bertlab import BertModel
    from bertlab.models.bert.config import BertConfig
    from bertlab.models.bert.convert import convert_tf_to_hf, export_tf_checkpoint
    from bertlab.tf_checkpoint import TFCheckpointReader, write_tf_checkpoint

    cases = []
    # 1. the fixture through HF and back
    convert_tf_to_hf(FIXTURES / "bert_model.ckpt", work / "hf")
    export_tf_checkpoint(work / "hf", work / "export")
    with TFCheckpointReader(work / "export") as r:
        values = {n: r.read(n) for n in r.names()}
    cases.append({"prefix": str(work / "export" / "bert_model.ckpt"), "bf16": []})
    np.savez(work / "export.npz", **values)
    # 2. odd dtypes, rewritten in name order (TF wrote them in its own order)
    with TFCheckpointReader(FIXTURES / "dtypes.ckpt") as r:
        values = {n: r.read(n) for n in sorted(r.names(), reverse=True)}
        bf16 = [n for n, e in r.entries.items() if e.dtype_name == "bfloat16"]
    write_tf_checkpoint(work / "dtypes", values, bfloat16=bf16)
    cases.append({"prefix": str(work / "dtypes"), "bf16": bf16})
    np.savez(work / "dtypes.npz", **_expected(values))
    # 3. a many-block index
    rng = np.random.default_rng(0)
    values = {f"bert/encoder/layer_{i}/attention/self/{p}/kernel": rng.standard_normal((4, 3)).astype(np.float32)
              for i in range(100) for p in ("query", "key", "value")}
    write_tf_checkpoint(work / "multiblock", values, block_size=256)
    cases.append({"prefix": str(work / "multiblock"), "bf16": []})
    np.savez(work / "multiblock.npz", **values)
    # 4. a bfloat16 model, exported
    config = BertConfig.from_json_file(FIXTURES / "bert_config.json")
    BertModel(config).to(torch.bfloat16).save_pretrained(work / "bf16_hf")
    export_tf_checkpoint(work / "bf16_hf", work / "bf16")
    with TFCheckpointReader(work / "bf16") as r:
        values = {n: r.read(n) for n in r.names()}
    cases.append({"prefix": str(work / "bf16" / "bert_model.ckpt"), "bf16": list(values)})
    np.savez(work / "bf16.npz", **values)
    for case, name in zip(cases, ("export", "dtypes", "multiblock", "bf16")):
        case["expected"] = str(work / f"{name}.npz")
    (work / "cases.json").write_text(json.dumps(cases, indent=2))
    return cases


def check_all(work: Path) -> int:
    import tensorflow as tf

    failures = 0
    cases = json.loads((work / "cases.json").read_text())
    for case in cases:
        prefix = case["prefix"]
        with np.load(case["expected"]) as z:
            expected = {k: z[k] for k in z.files}
        reader = tf.train.load_checkpoint(prefix)
        shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
        problems = []
        if sorted(shapes) != sorted(expected):
            problems.append(f"names differ: {sorted(set(shapes) ^ set(expected))[:5]}")
        for name, want in expected.items():
            got = reader.get_tensor(name)
            if name in case["bf16"]:
                if dtypes[name] != tf.bfloat16:
                    problems.append(f"{name}: dtype {dtypes[name].name}, expected bfloat16")
                got = got.astype(np.float32)
            if got.dtype == object:
                got = got.astype("S")
            if tuple(shapes[name]) != want.shape or got.shape != want.shape or not np.array_equal(got, want):
                problems.append(f"{name}: value/shape differs")
        # the op graph-mode Saver uses, too
        names = sorted(expected)
        restored = tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                                        dtypes=[dtypes[n] for n in names])
        for name, tensor in zip(names, restored):
            got = tensor.numpy()
            got = got.astype(np.float32) if name in case["bf16"] else got
            got = got.astype("S") if got.dtype == object else got
            if not np.array_equal(got, expected[name]):
                problems.append(f"{name}: RestoreV2 value differs")
        # negative control: TF must refuse a flipped data byte
        with tempfile.TemporaryDirectory() as tmp:
            bad = Path(tmp) / "bad"
            shutil.copy(f"{prefix}.index", f"{bad}.index")
            data = bytearray(Path(f"{prefix}.data-00000-of-00001").read_bytes())
            data[len(data) // 2] ^= 0x40
            Path(f"{bad}.data-00000-of-00001").write_bytes(bytes(data))
            try:
                r = tf.train.load_checkpoint(str(bad))
                for name in names:
                    r.get_tensor(name)
                problems.append("TensorFlow accepted a corrupted copy")
            except Exception as e:  # DataLossError
                rejected = type(e).__name__ + ": " + str(e).splitlines()[0][:100]
        status = "OK" if not problems else "FAIL"
        failures += bool(problems)
        print(f"{status}  {prefix}: {len(expected)} tensors read by TensorFlow {tf.__version__} "
              f"(load_checkpoint + RestoreV2); corrupted copy rejected: {rejected}")
        for p in problems[:10]:
            print("      ", p)
    return 1 if failures else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tf-python", default="/tmp/tfenv/bin/python", help="an interpreter with tensorflow installed")
    p.add_argument("--workdir", help="where to write (default: a temporary folder)")
    p.add_argument("--check", metavar="DIR", help=argparse.SUPPRESS)  # step 2, run under --tf-python
    args = p.parse_args()
    if args.check:
        return check_all(Path(args.check))
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bertlab-tf-check-"))
    work.mkdir(parents=True, exist_ok=True)
    write_all(work)
    print(f"wrote {work}; checking with {args.tf_python}", flush=True)
    return subprocess.call([args.tf_python, __file__, "--check", str(work)])


if __name__ == "__main__":
    sys.exit(main())
