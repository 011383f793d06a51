"""Training curves to PNG from RUN_DIR/metrics.jsonl: what `bertlab plot` and the pre-training demo draw.

Four panels: losses (training, smoothed, and held-out), accuracies and other held-out metrics, learning
rate, throughput. Works for any run of the training loop (pre-training, fine-tuning, distillation): it
plots the keys it finds. Needs matplotlib (the `plot` extra: `pip install 'bertlab-paper[plot]'`).
"""

from __future__ import annotations

from pathlib import Path

from ..core.errors import BertlabError
from .loop import read_metrics

PLOT_EXTRA = "pip install 'bertlab-paper[plot]' (or pip install matplotlib)"


def _smooth(values: list[float], window: int) -> list[float]:
    if window <= 1:
        return values
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pts], [float(p[1]) for p in pts]


def draw_curves(run_dir: str | Path, out: str | Path | None = None, smooth: int = 20) -> Path:
    """Draw RUN_DIR's curves to `out` (default RUN_DIR/curves.png) and return its path."""
    try:
        import matplotlib
    except ImportError:
        raise BertlabError(f"plotting needs matplotlib: {PLOT_EXTRA}") from None
    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    if not records:
        raise BertlabError(f"{run_dir / 'metrics.jsonl'}: no records yet")
    train = [r for r in records if "loss" in r]
    evals = [r for r in records if any(k.startswith("eval/") for k in r)]
    train_keys = sorted({k for r in train for k in r if isinstance(r[k], (int, float))})
    eval_keys = sorted({k for r in evals for k in r if k.startswith("eval/")})

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    (ax_loss, ax_acc), (ax_lr, ax_speed) = axes
    for key in [k for k in train_keys if k == "loss" or k.endswith("_loss")]:
        x, y = _series(train, key)
        ax_loss.plot(x, _smooth(y, smooth), label=f"train {key}")
    for key in [k for k in eval_keys if k.endswith("loss")]:
        x, y = _series(evals, key)
        ax_loss.plot(x, y, "o-", label=key)
    ax_loss.set_title("loss")

    for key in [k for k in train_keys if "acc" in k]:
        x, y = _series(train, key)
        ax_acc.plot(x, _smooth(y, smooth), label=f"train {key}")
    for key in [k for k in eval_keys if not k.endswith("loss") and k != "eval/perplexity"]:
        x, y = _series(evals, key)
        ax_acc.plot(x, y, "o-", label=key)
    ax_acc.set_title("accuracy and held-out metrics")

    x, y = _series(train, "lr")
    ax_lr.plot(x, y)
    ax_lr.set_title("learning rate")
    x, y = _series(train, "tokens_per_s")
    ax_speed.plot(x, _smooth(y, smooth))
    ax_speed.set_title("tokens / s")
    for ax in axes.flat:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(str(run_dir))
    fig.tight_layout()
    out = Path(out) if out is not None else run_dir / "curves.png"
    try:
        fig.savefig(out, dpi=100)
    except OSError as e:
        raise BertlabError(f"{out}: cannot write ({e.strerror or e})") from None
    plt.close(fig)
    return out
