"""Charts of the main benchmark ratios for the docs: benchmarks/results.json -> docs/img/*.png.

    python benchmarks/plot_results.py [--results benchmarks/results.json] [--out docs/img]

Two PNGs: `speedups.png` (bertlab's speed against the reference implementation in each benchmark, as a
ratio; 1.0 is parity) and `finetune_scores.png` (dev scores of bertlab and Hugging Face's Trainer, mean and
standard deviation over seeds). The numbers live in the JSON, one entry per ratio naming the table of
docs/benchmarks.md it comes from; re-run this script when they change. Needs matplotlib (the `plot` extra).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def plot_speedups(entries: list[dict], path: Path) -> None:
    import matplotlib.pyplot as plt

    names = [e["what"] for e in entries][::-1]
    ratios = [float(e["ratio"]) for e in entries][::-1]
    fig, ax = plt.subplots(figsize=(8, 0.36 * len(names) + 1.0), dpi=90)
    bars = ax.barh(names, ratios, color="#3f51b5")
    ax.axvline(1.0, color="#888", linewidth=1, linestyle="--")
    for bar, ratio in zip(bars, ratios):
        ax.text(bar.get_width() + 0.05, bar.get_y() + bar.get_height() / 2, f"{ratio:.2f}x", va="center", fontsize=8)
    ax.set_xlabel("bertlab's speed / the reference's (1.0 = parity)")
    ax.set_xlim(0, max(ratios) * 1.15)
    ax.tick_params(axis="y", labelsize=8)
    ax.set_title("Speed against the reference implementations", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_scores(entries: list[dict], path: Path) -> None:
    import matplotlib.pyplot as plt
    import numpy as np

    x = np.arange(len(entries))
    ours = np.array([e["bertlab"] for e in entries], dtype=float)
    ref = np.array([e["reference"] for e in entries], dtype=float)
    fig, ax = plt.subplots(figsize=(8, 3.2), dpi=90)
    ax.bar(x - 0.2, ours[:, 0], 0.4, yerr=ours[:, 1], capsize=3, label="bertlab", color="#3f51b5")
    ax.bar(x + 0.2, ref[:, 0], 0.4, yerr=ref[:, 1], capsize=3, label="Hugging Face Trainer", color="#ff9800")
    ax.set_xticks(x, [e["task"] for e in entries], fontsize=8, rotation=15)
    ax.set_ylabel("dev score (mean ± sd over seeds)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("Fine-tuning scores: the same data, hyper-parameters and seeds", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results.json")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    results = json.loads(args.results.read_text(encoding="utf-8"))
    args.out.mkdir(parents=True, exist_ok=True)
    plot_speedups(results["speedups"], args.out / "speedups.png")
    plot_scores(results["finetune_scores"], args.out / "finetune_scores.png")
    for name in ("speedups.png", "finetune_scores.png"):
        print(f"wrote {args.out / name} ({(args.out / name).stat().st_size // 1024} KB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
