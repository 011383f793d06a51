"""`bertlab plot RUN_DIR [--out curves.png] [--smooth 20]`: training curves from RUN_DIR/metrics.jsonl.

Four panels: losses (training, smoothed, and held-out), accuracies and other held-out metrics, learning
rate, throughput. Works for any run of the training loop (pre-training, fine-tuning, distillation): it
plots the keys it finds. Needs matplotlib (`pip install 'bertlab-paper[plot]'`); the drawing is in
`bertlab.train.curves`.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a training run directory (holds metrics.jsonl)")
    p.add_argument("--out", type=Path, default=None, help="PNG file (default: RUN_DIR/curves.png)")
    p.add_argument("--smooth", type=int, default=20, help="moving-average window for training curves (default: 20)")


def run(args: argparse.Namespace) -> int:
    from ..train.curves import draw_curves

    print(draw_curves(args.run_dir, args.out, args.smooth))
    return 0
