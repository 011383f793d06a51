"""ModernBERT on a CPU: what its own pieces cost, and the memory of an 8,192-token input.

    python benchmarks/bench_modernbert.py ops [--lengths 512,8192] [--repeat 20] [--dtype fp32|bf16]
    python benchmarks/bench_modernbert.py local [--shapes 256x8,512x4,2048x1,8192x1] [--dtypes fp32,bf16,int8] [--threads 1]
    python benchmarks/bench_modernbert.py memory [--length 8192] [--layers 22] [--contenders hf,bertlab,band]
    python benchmarks/bench_modernbert.py memory --contenders hf,bertlab,bertlab-int8,onnxruntime,onnxruntime-int8,openvino
    python benchmarks/bench_modernbert.py memory --layers 2 --local-only --contenders onnxruntime-band,onnxruntime,openvino-band,openvino

`ops`: the rotary positions (q and k of one layer) and the GeGLU (act(value) * gate of one layer) at
ModernBERT-base's widths (12 heads of 64, GeGLU 1,152), each as the model runs it and as the candidates that
would replace it, fp32 (`--dtype bf16`: bf16 tensors, tables and model), one thread, median of `--repeat` calls; beside them one whole encoder layer through
bertlab's inference runtime (packed GEMMs; attention as `nn/attention.py`'s `bmm` kernel picks it for the
length, see `memory` below), so each piece's share of a layer is plain.

`local`: one local layer's attention (ModernBERT-base's 12 heads of 64, a window of 64 either side) at each model
precision's kernel -- fp32 (`bmm` on fp32), bf16 (`bmm` on bf16), int8 (`bmm_bf16`, fp32 in and out) -- as blocks
of 2·window queries through the padded kernel against the C loops with the window in one call
(`nn.attention.window_attention`; on a CPU whose bf16 and int8 models keep the blocks, AMX, the bf16 loops' window
beside them, marked "not taken here"), and for int8 the fp32 windowed loops too; TxB shapes (T tokens, B rows, the last
row padded from 3/4 of T), medians of `--rounds` interleaved rounds, the largest difference from the blocks.

`memory`: one row of `--length` tokens embedded by a random-weight ModernBERT of the base's shape (22 layers,
H 768, window 128; `--layers` fewer for a quick look; the model and tokenizer of `bench_engines.py --model
modernbert-base`), each contender in a process of its own, one thread: the process's peak resident memory
(VmHWM) after loading the model and a warm-up on 64 tokens, and after the long row, the row's seconds, and
the cosine of its mean-pooled embedding to transformers' fp32 one. Contenders (`--contenders`):
  hf                     transformers' ModernBertModel (sdpa), fp32
  bertlab[-bf16|-int8]   bertlab's inference runtime: local layers in the C loops with the window (or, where
                         the kernel has no windowed form, block by block: 2·window queries against 4·window
                         keys); global layers as `nn/attention.py` picks by key count -- fp32 the C loops up
                         to `long_keys()` keys (2,047, or every length on a CPU family measured to want them)
                         and PyTorch's SDPA flash kernel from there, bf16 and int8 (attention in bf16) the AMX
                         tile kernel up to 6,143 keys and SDPA in bf16 from 6,144 (`AMX_SDPA_KEYS`) on a CPU
                         with AMX
  band                   bertlab fp32 with each local layer as one call over the whole (T x T) band mask: the
                         memory a window costs when it is only a mask
  onnxruntime[-int8], openvino[-bf16]   `bertlab export onnx --quantize int8` / `export openvino`, whose
                         local layers are traced as the same blocks (`modeling.traced_local_attention`)
  ...-band               the same engines on an export whose local layers are each one band-mask call (the
                         export as it was before the blocked trace)
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))


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
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    model = prepare(modeling.ModernBertModel(config).eval(), InferenceOptions(dtype=args.dtype))
    results = []
    with torch.inference_mode():
        for T in (int(t) for t in args.lengths.split(",")):
            qkv = torch.randn(T, 3, nh, hs, dtype=dtype)
            cos, sin = (t.unsqueeze(-2) for t in modeling.rotary_tables(config, "sliding_attention", T,
                                                                       dtype, torch.device("cpu")))
            wi = torch.randn(T, 2 * I, dtype=dtype)
            x = torch.randn(1, T, H, dtype=dtype)
            row = {"T": T, "dtype": args.dtype}
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
                        for c, s in [modeling.rotary_tables(config, k, T, dtype, torch.device("cpu"))]}
                row[f"one {kind} layer, whole"] = median_us(
                    lambda layer=layer: layer(x, rope[layer.attn.layer_type], None, None), max(3, args.repeat // 4))
            results.append(row)
            print(json.dumps(row, indent=1), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


LOCAL_KERNELS = {"fp32": ("bmm", torch.float32), "bf16": ("bmm", torch.bfloat16), "int8": ("bmm_bf16", torch.float32)}


def local(args: argparse.Namespace) -> None:
    from bench_engines import provenance, provenance_line

    from bertlab.models.modernbert import modeling
    from bertlab.nn import cpu_kernels
    from bertlab.nn.attention import window_attention

    attention_module = importlib.import_module("bertlab.nn.attention")  # (the package exports a function so named)

    def unexcluded(fn):
        """fn() with `window_attention`'s CPU check seeing no AMX"""
        level = attention_module.cpu_isa
        attention_module.cpu_isa = lambda: "avx512"
        try:
            return fn()
        finally:
            attention_module.cpu_isa = level

    torch.set_num_threads(args.threads)
    nh, hs, w = 12, 64, 64
    info, results = provenance(), []
    print("| T x rows | precision | blocks ms | window ms | window / blocks | largest difference | fp32 window ms |")
    print("|---|---|---|---|---|---|---|")
    with torch.inference_mode():
        for shape in args.shapes.split(","):
            T, B = (int(x) for x in shape.split("x"))
            g = torch.Generator().manual_seed(T)
            x = [torch.randn(B, T, nh * hs, generator=g) for _ in range(3)]
            keep = torch.ones(B, T, dtype=torch.bool)
            keep[-1, T * 3 // 4:] = False
            for dtype in args.dtypes.split(","):
                kernel, torch_dtype = LOCAL_KERNELS[dtype]
                q, k, v = (t.to(torch_dtype) for t in x)
                model = lambda: modeling.local_attention(q, k, v, nh, w, keep, kernel=kernel)[0]  # noqa: E731
                ways = {"blocks": model}  # (with window_attention declining: the model as it runs without one)
                taken = window_attention(q, k, v, nh, w, keep, kernel) is not None
                if taken:
                    ways["window"] = model
                elif dtype != "fp32" and cpu_kernels.bf16_dot_available():
                    # a CPU whose model keeps the blocks (AMX: its tiles run them): the bf16 loops' window beside
                    # them all the same, what `window_attention` would run were the CPU not excluded
                    ways["window"] = lambda: unexcluded(lambda: window_attention(q, k, v, nh, w, keep, kernel))
                if dtype == "int8":
                    ways["fp32 window"] = lambda: window_attention(q, k, v, nh, w, keep, "bmm")

                def run(name: str, calls: int = 1):
                    real = modeling.window_attention
                    if name == "blocks":
                        modeling.window_attention = lambda *a: None
                    try:
                        for _ in range(calls):
                            out = ways[name]()
                        return out
                    finally:
                        modeling.window_attention = real

                outs = {name: run(name) for name in ways}  # (each warmed once)
                reps = max(1, int(args.work / (B * T * (4 * w) * nh * hs)))
                timed, names = {name: [] for name in ways}, list(ways)
                for r in range(args.rounds):  # interleaved, the order rotating
                    for name in names[r % len(names):] + names[:r % len(names)]:
                        start = time.perf_counter()
                        run(name, reps)
                        timed[name].append((time.perf_counter() - start) / reps * 1e3)
                ms = {name: statistics.median(t) for name, t in timed.items()}
                ref = outs["blocks"].float()[keep]
                diff = {name: float((o.float()[keep] - ref).abs().max() / ref.abs().max()) for name, o in outs.items()}
                row = {"T": T, "rows": B, "precision": dtype, "ms": ms, "relative_difference": diff,
                       "window_taken": taken}
                results.append(row)
                window = (f"{ms['window']:.2f} | {ms['blocks'] / ms['window']:.2f}x{'' if taken else ' (not taken here)'}"
                          f" | {diff['window']:.1e}" if "window" in ms else "- | no windowed form here | -")
                fp32 = f"{ms['fp32 window']:.2f}" if "fp32 window" in ms else "-"
                print(f"| {T} x {B} | {dtype} | {ms['blocks']:.2f} | {window} | {fp32} |", flush=True)
    info["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    print("\n" + provenance_line(info))
    if args.json:
        args.json.write_text(json.dumps({"provenance": info, "rows": results}, indent=2) + "\n")


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
# contender -> (engine, precision, how its local layers run)
CONTENDERS = {
    "hf": ("hf", "fp32", "sliding-window mask"),
    "bertlab": ("bertlab", "fp32", "blocks"), "bertlab-bf16": ("bertlab", "bf16", "blocks"),
    "bertlab-int8": ("bertlab", "int8", "blocks"), "band": ("bertlab", "fp32", "band"),
    "onnxruntime": ("onnxruntime", "fp32", "blocks"), "onnxruntime-int8": ("onnxruntime", "int8", "blocks"),
    "openvino": ("openvino", "fp32", "blocks"), "openvino-bf16": ("openvino", "bf16", "blocks"),
    "onnxruntime-band": ("onnxruntime", "fp32", "band"), "onnxruntime-int8-band": ("onnxruntime", "int8", "band"),
    "openvino-band": ("openvino", "fp32", "band"), "openvino-bf16-band": ("openvino", "bf16", "band"),
}


def vm_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def whole_band(q, k, v, num_heads, window, keep, **kw):
    """A local layer as one attention call over the whole (T x T) band mask (what a mask-only window costs)."""
    from bertlab.models.modernbert import modeling

    T = q.size(1)
    bias = modeling.band_bias(T, T, 0, 0, window, keep, q.dtype, q.device)
    return modeling.attention(q, k, v, num_heads, None, bias, kernel=kw.get("kernel", "sdpa"))


def exports(folder: Path, root: Path, names: list[str]) -> dict[str, Path]:
    """The export folders the engine contenders read: bertlab's exporters, blocked local layers, and with
    `-band` in a name the same export with each local layer traced as one band-mask call (the export before
    `modeling.traced_local_attention`)."""
    from bertlab.infer.engines import ENGINE_EXPORTERS
    from bertlab.infer.export import export_onnx
    from bertlab.models.modernbert import modeling

    out = {}
    for engine, band in sorted({(CONTENDERS[n][0], CONTENDERS[n][2] == "band") for n in names
                                if CONTENDERS[n][0] in ("onnxruntime", "openvino")}):
        target = root / f"{engine}{'-band' if band else ''}"
        traced = modeling.traced_local_attention
        if band:
            modeling.traced_local_attention = lambda q, k, v, nh, w, keep: whole_band(q, k, v, nh, w, keep)[0]
        try:
            start = time.perf_counter()
            if engine == "onnxruntime":
                export_onnx(folder, target, quantize="int8")
            else:
                ENGINE_EXPORTERS[engine](folder, target)
            print(f"exported {target.name} in {time.perf_counter() - start:.0f} s", flush=True)
        finally:
            modeling.traced_local_attention = traced
        out[target.name] = target
    return out


def one_contender(name: str, folder: Path, length: int, exported: Path, vector_file: Path) -> dict:
    """In a child process: load, warm up on 64 tokens, reset nothing (VmHWM only grows), embed one long row
    (mean-pooled, L2-normalised: written to `vector_file` for the cosine to transformers)."""
    import numpy as np

    torch.set_num_threads(1)
    from bertlab.infer.embeddings import Embedder
    from bertlab.infer.runtime import InferenceOptions

    engine, dtype, local = CONTENDERS[name]
    g = torch.Generator().manual_seed(0)
    if engine == "hf":
        from transformers import AutoModel

        model = AutoModel.from_pretrained(folder, attn_implementation="sdpa").eval()

        def embed(rows):
            with torch.inference_mode():
                v = model(input_ids=torch.tensor(rows)).last_hidden_state.mean(1).numpy()
            return v / np.linalg.norm(v, axis=-1, keepdims=True)
    else:
        if local == "band" and engine == "bertlab":
            from bertlab.models.modernbert import modeling

            modeling.local_attention = whole_band
        source = folder if engine == "bertlab" else exported / f"{engine}{'-band' if local == 'band' else ''}"
        embedder = Embedder.from_pretrained(source, pooling="mean", normalize=True, options=InferenceOptions(
            engine=engine, dtype=dtype, threads=1, max_length=length, max_tokens=length))
        embed = embedder.embed_ids
    vocab = 8000  # the benchmark tokenizer's size (the model has 50,368 rows): ids any tokenizer could give
    ids = torch.randint(5, vocab, (1, length), generator=g).tolist()
    embed([ids[0][:64]])
    loaded = vm_kib("VmHWM")
    start = time.perf_counter()
    vector = embed(ids)
    seconds = time.perf_counter() - start
    np.save(vector_file, vector)
    return {"contender": name, "engine": engine, "precision": dtype, "local_layers": local, "length": length,
            "peak_rss_mb_loaded": round(loaded / 1024), "peak_rss_mb_after_row": round(vm_kib("VmHWM") / 1024),
            "seconds": round(seconds, 1)}


def memory(args: argparse.Namespace) -> None:
    import numpy as np

    from bench_engines import modernbert_folder

    names = args.contenders.split(",")
    unknown = [n for n in names if n not in CONTENDERS]
    if unknown:
        raise SystemExit(f"unknown contender(s) {', '.join(unknown)}; expected some of {', '.join(CONTENDERS)}")
    results, vectors = [], {}
    started = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-modernbert-") as tmp:
        torch.manual_seed(0)
        folder = modernbert_folder(Path(tmp), layers=args.layers, local_only=args.local_only)
        exported = Path(tmp) / "exports"
        exported.mkdir()
        exports(folder, exported, names)
        for name in names:
            vector_file = Path(tmp) / f"{name}.npy"
            out = subprocess.run([sys.executable, __file__, "_one", name, str(folder), str(args.length),
                                  str(exported), str(vector_file)], capture_output=True, text=True, check=False)
            if out.returncode:
                print(f"{name}: failed\n{out.stderr[-2000:]}", flush=True)
                continue
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
            vectors[name] = np.load(vector_file)[0]
            ref = vectors.get("hf")
            if ref is not None:
                for row in results:
                    row["cosine_to_hf_fp32"] = round(float(vectors[row["contender"]] @ ref), 6)
            print(json.dumps(results[-1]), f"load {os.getloadavg()[0]:.1f}", flush=True)
    ref = vectors.get("hf")
    print("\n| contender | precision | local layers | seconds | peak RSS loaded MB | peak RSS after the row MB "
          "| above loaded MB | cosine to HF fp32 |\n|---|---|---|---|---|---|---|---|")
    for r in results:
        cos = f"{float(vectors[r['contender']] @ ref):.6f}" if ref is not None else "-"
        print(f"| {r['engine']} | {r['precision']} | {r['local_layers']} | {r['seconds']} | {r['peak_rss_mb_loaded']:,} "
              f"| {r['peak_rss_mb_after_row']:,} | {r['peak_rss_mb_after_row'] - r['peak_rss_mb_loaded']:,} | {cos} |")
    print(f"load average {started[0]:.1f} -> {os.getloadavg()[0]:.1f}")
    if args.json:
        args.json.write_text(json.dumps({"load_average": [started, os.getloadavg()], "rows": results}, indent=2) + "\n")


def main() -> int:
    if len(sys.argv) == 7 and sys.argv[1] == "_one":
        print(json.dumps(one_contender(sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5]),
                                       Path(sys.argv[6]))))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    o = sub.add_parser("ops", help="RoPE and GeGLU, as run and as candidates, beside a whole layer")
    o.add_argument("--lengths", default="512,8192")
    o.add_argument("--repeat", type=int, default=20)
    o.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    o.add_argument("--json", type=Path)
    lo = sub.add_parser("local", help="a local layer's attention: blocks against the windowed C loops")
    lo.add_argument("--shapes", default="256x8,512x4,2048x1,8192x1", help="comma-separated T x rows")
    lo.add_argument("--dtypes", default="fp32,bf16,int8", help="the model precisions whose kernels run")
    lo.add_argument("--threads", type=int, default=1)
    lo.add_argument("--rounds", type=int, default=3)
    lo.add_argument("--work", type=float, default=2e9, help="about this many multiply-adds of the blocks a timing")
    lo.add_argument("--json", type=Path)
    m = sub.add_parser("memory", help="peak RSS of one long row, a process per contender")
    m.add_argument("--length", type=int, default=8192)
    m.add_argument("--layers", type=int, default=22)
    m.add_argument("--local-only", action="store_true",
                   help="every layer local: what the local layers cost alone (a band export's T x T among them)")
    m.add_argument("--contenders", default="hf,bertlab,band",
                   help=f"comma-separated, each a process of its own: {', '.join(CONTENDERS)}")
    m.add_argument("--json", type=Path)
    args = p.parse_args()
    if args.what == "local":
        for shape in args.shapes.split(","):
            if not re.fullmatch(r"[1-9][0-9]*x[1-9][0-9]*", shape):
                p.error(f"--shapes: expected T x rows such as 512x4, got {shape!r}")
        for dtype in args.dtypes.split(","):
            if dtype not in LOCAL_KERNELS:
                p.error(f"--dtypes: expected fp32, bf16 or int8, got {dtype!r}")
    {"ops": ops, "local": local, "memory": memory}[args.what](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
