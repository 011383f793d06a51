#!/usr/bin/env bash
# Re-takes the ModernBERT-base-shape rows of docs/benchmarks.md: the 8,192-token row (every engine and precision,
# the full 22-layer model, one row per contender, one round) and, unless --long-only, the 512-token row (4 rows,
# 3 interleaved rounds). On a quiet 2-core AVX-512/AMX Xeon, estimated from the CPU seconds of loaded runs (the
# 8,192 row's contenders take ~10-75 CPU s each, ~290 s together, plus the ONNX and OpenVINO exports): about 6-7
# minutes with --long-only, 9-10 with both rows; several times that under load. Run it on a quiet machine: the
# load average before and after is written beside the results, so a reader can tell.
#
#     benchmarks/modernbert_rows.sh [--long-only] [OUT_DIR]      (default OUT_DIR: ./modernbert-rows)
#
# Writes OUT_DIR/rows-8192.json and rows-512.json (bench_engines.py --json: seconds a row, CPU seconds, peak RSS
# while loading and the row's peak above the loaded model, the minimum cosine to transformers fp32), the printed
# tables in OUT_DIR/*.txt, and OUT_DIR/machine.txt (lscpu model name and flags that matter, uptime, commit).
# The default tuning table is used (BERTLAB_CPU_TUNING=default): a cache tuned under another load would skew it.
set -euo pipefail
long_only=0
if [[ "${1:-}" == "--long-only" ]]; then long_only=1; shift; fi
out="${1:-modernbert-rows}"
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
[[ -x "$python" ]] || python=python3
mkdir -p "$out"
export BERTLAB_CPU_TUNING=default
{
  echo "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  lscpu | grep -E "^Model name|^CPU\(s\)|^Thread|^Model:|^CPU family|^Hypervisor" || true
  grep -o -w -E "avx512f|avx512_vnni|avx_vnni|avx512_bf16|amx_bf16|amx_int8" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
  echo "before: $(uptime)"
} > "$out/machine.txt"
"$python" "$root/benchmarks/bench_engines.py" --model modernbert-base --shapes 8192 --n-long 1 --rounds-long 1 \
    --threads 1 --engines hf,bertlab,onnxruntime,openvino --dtypes fp32,bf16,int8 --json "$out/rows-8192.json" \
    | tee "$out/rows-8192.txt"
echo "after 8192: $(uptime)" >> "$out/machine.txt"
if (( ! long_only )); then
  "$python" "$root/benchmarks/bench_engines.py" --model modernbert-base --shapes 512 --n 4 --latency-n 0 \
      --rounds 3 --threads 1 --engines hf,bertlab,onnxruntime,openvino --dtypes fp32,bf16,int8 \
      --json "$out/rows-512.json" | tee "$out/rows-512.txt"
  echo "after 512: $(uptime)" >> "$out/machine.txt"
fi
cat "$out/machine.txt"
