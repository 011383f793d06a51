"""ModernBERT on a CPU: what its own pieces cost, and the memory of an 8,192-token input.

    python benchmarks/bench_modernbert.py ops [--lengths 512,8192] [--repeat 20]
    python benchmarks/bench_modernbert.py memory [--length 8192] [--layers 22] [--contenders bertlab,band,hf]

`ops`: the rotary positions (q and k of one layer) and the GeGLU (act(value) * gate of one layer) at
ModernBERT-base's widths (12 heads of 64, GeGLU 1,152), each as the model runs it and as the candidates that
would replace it, fp32, one thread, median of `--repeat` calls; beside them one whole encoder layer through
bertlab's inference runtime (packed GEMMs, C attention loops), so each piece's share of a layer is plain.

`memory`: one row of `--length` tokens embedded by a random-weight ModernBERT of the base's shape (22 layers,
H 768, window 128; `--layers` fewer for a quick look), each contender in a process of its own, fp32, one
thread: the process's peak resident memory (VmHWM) after loading the model and a warm-up on 64 tokens, and
after the long row, and the forward pass's seconds.
  bertlab   bertlab's inference runtime: local layers block by block (2·window queries against 4·window
            keys), global layers through the C attention loops (one row of scores at a time)
  band      the same runtime with each local layer as one call over the whole (T x T) band mask: the
            memory a window costs when it is only a mask
  hf        transformers' ModernBertModel (sdpa), fp32
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def median_us(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(1e6 * statistics.median(times), 1)


def base_config(layers: int = 22, **overrides):
    from bertlab.models.modernbert.config import ModernBertConfig

    config = ModernBertConfig(num_hidden_layers=layers, **overrides)
    config.check("benchmark")
    return config


def ops(args: argparse.Namespace) -> None:
    from bertlab.infer.runtime import InferenceOptions, prepare
    from bertlab.models.modernbert import modeling

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = base_config(layers=3)
    nh, hs, H, I = config.num_attention_heads, config.head_size, config.hidden_size, config.intermediate_size
    model = prepare(modeling.ModernBertModel(config).eval(), InferenceOptions())
    results = []
    with torch.inference_mode():
        for T in (int(t) for t in args.lengths.split(",")):
            qkv = torch.randn(T, 3, nh, hs)
            cos, sin = (t.unsqueeze(-2) for t in modeling.rotary_tables(config, "sliding_attention", T,
                                                                       torch.float32, torch.device("cpu")))
            wi = torch.randn(T, 2 * I)
            x = torch.randn(1, T, H)
            row = {"T": T}
            row["rope, as the model runs it (q, k)"] = median_us(
                lambda: [modeling.rotate(t, cos, sin) for t in qkv[:, :2].unbind(-3)], args.repeat)
            from bertlab.nn.cpu_kernels import rotate_qk_

            c2, s2 = cos.squeeze(-2).contiguous(), sin.squeeze(-2).contiguous()
            copy = qkv.clone()
            row["rope, C in place (nn/cpu_kernels.py)"] = median_us(lambda: rotate_qk_(copy, c2, s2), args.repeat)
            for name, fn in ROPE_CANDIDATES.items():
                row[f"rope, {name}"] = median_us(lambda fn=fn: fn(qkv, cos, sin), args.repeat)
            from bertlab.nn.elementwise import ACTIVATIONS

            act = ACTIVATIONS["gelu"]
            row["geglu, as the model runs it"] = median_us(lambda: act(wi[:, :I]) * wi[:, I:], args.repeat)
            for name, fn in GEGLU_CANDIDATES.items():
                row[f"geglu, {name}"] = median_us(lambda fn=fn: fn(wi.clone() if "place" in name else wi, I),
                                                  args.repeat)
            row["geglu, the clone the in-place candidates pay here"] = median_us(lambda: wi.clone(), args.repeat)
            for i, kind in ((0, "global"), (1, "local")):
                layer = model.layers[i]
                rope = {k: (c.unsqueeze(-2), s.unsqueeze(-2)) for k in set(config.layer_types)
                        for c, s in [modeling.rotary_tables(config, k, T, torch.float32, torch.device("cpu"))]}
                row[f"one {kind} layer, whole"] = median_us(
                    lambda layer=layer: layer(x, rope[layer.attn.layer_type], None, None), max(3, args.repeat // 4))
            results.append(row)
            print(json.dumps(row, indent=1), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


def rope_addcmul(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """q and k together: x · cos, then each half's rotated product added in place (no concatenated copy)."""
    x = qkv[..., :2, :, :]  # (T, 2, nh, hs)
    half = x.size(-1) // 2
    c, s = cos.unsqueeze(-3), sin.unsqueeze(-3)  # (T, 1, 1, hs)
    out = x * c
    out[..., :half].addcmul_(x[..., half:], s[..., :half], value=-1.0)
    out[..., half:].addcmul_(x[..., :half], s[..., half:])
    return out


def rope_cat_joint(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The model's formula on q and k in one call each op (half the calls)."""
    x = qkv[..., :2, :, :]
    half = x.size(-1) // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.unsqueeze(-3) + rotated * sin.unsqueeze(-3)


ROPE_CANDIDATES = {"q and k in one call, addcmul_ halves": rope_addcmul, "q and k in one call, cat": rope_cat_joint}


def geglu_inplace(wi: torch.Tensor, I: int) -> torch.Tensor:
    """gelu written over the value half, then one product into a new (contiguous) tensor."""
    return torch.mul(torch.ops.aten.gelu_(wi[:, :I]), wi[:, I:])


def geglu_inplace_both(wi: torch.Tensor, I: int) -> torch.Tensor:
    """gelu and the product both written over the value half (a strided view: the next GEMM reads it so)."""
    return torch.ops.aten.gelu_(wi[:, :I]).mul_(wi[:, I:])


GEGLU_CANDIDATES = {"gelu in place, one product": geglu_inplace, "gelu and product in place": geglu_inplace_both}


# ----------------------------------------------------------------------------------------------- memory
def vm_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def one_contender(name: str, folder: Path, length: int) -> dict:
    """In a child process: load, warm up, reset nothing (VmHWM only grows), embed one long row."""
    torch.set_num_threads(1)
    from bertlab.infer.runtime import InferenceOptions, prepare

    g = torch.Generator().manual_seed(0)
    if name == "hf":
        from transformers import AutoModel

        model = AutoModel.from_pretrained(folder, attn_implementation="sdpa").eval()
        vocab = model.config.vocab_size
    else:
        from bertlab.models.modernbert import modeling

        model = prepare(modeling.ModernBertModel.from_pretrained(folder).eval(), InferenceOptions())
        vocab = model.config.vocab_size
        if name == "band":  # each local layer as one call over the whole band mask
            def whole_band(q, k, v, num_heads, window, keep, **kw):
                T = q.size(1)
                bias = modeling.band_bias(T, T, 0, 0, window, keep, q.dtype, q.device)
                return modeling.attention(q, k, v, num_heads, None, bias, kernel=kw["kernel"])

            modeling.local_attention = whole_band
    ids = torch.randint(5, vocab, (1, length), generator=g)
    with torch.inference_mode():
        model(input_ids=ids[:, :64])
        loaded = vm_kib("VmHWM")
        start = time.perf_counter()
        model(input_ids=ids)
        seconds = time.perf_counter() - start
    return {"contender": name, "length": length, "peak_rss_mb_loaded": round(loaded / 1024),
            "peak_rss_mb_after_row": round(vm_kib("VmHWM") / 1024), "seconds": round(seconds, 1)}


def memory(args: argparse.Namespace) -> None:
    import transformers

    results = []
    with tempfile.TemporaryDirectory(prefix="bench-modernbert-") as tmp:
        folder = Path(tmp) / "model"
        torch.manual_seed(0)
        config = transformers.ModernBertConfig(num_hidden_layers=args.layers)
        transformers.ModernBertModel(config).eval().save_pretrained(folder)
        for name in args.contenders.split(","):
            out = subprocess.run([sys.executable, __file__, "_one", name, str(folder), str(args.length)],
                                 capture_output=True, text=True, check=False)
            if out.returncode:
                print(f"{name}: failed\n{out.stderr[-2000:]}")
                continue
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(results[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"load_average": os.getloadavg(), "rows": results}, indent=2) + "\n")


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "_one":
        print(json.dumps(one_contender(sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]))))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    o = sub.add_parser("ops", help="RoPE and GeGLU, as run and as candidates, beside a whole layer")
    o.add_argument("--lengths", default="512,8192")
    o.add_argument("--repeat", type=int, default=20)
    o.add_argument("--json", type=Path)
    m = sub.add_parser("memory", help="peak RSS of one long row, a process per contender")
    m.add_argument("--length", type=int, default=8192)
    m.add_argument("--layers", type=int, default=22)
    m.add_argument("--contenders", default="bertlab,band,hf")
    m.add_argument("--json", type=Path)
    args = p.parse_args()
    (ops if args.what == "ops" else memory)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
