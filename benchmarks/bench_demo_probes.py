"""Which fill-in-the-blank sentences show what the demo's model learned: a pool of candidates, screened on demo
runs with other seeds than command 1's, so the probes `bertlab pretrain --demo` prints are not chosen on the
runs the README reports.

    python benchmarks/bench_demo_probes.py [--seeds 1,2] [--minutes 4.8] [--json out.json]

Each seed is one whole demo (`run_demo`, the default corpus and settings, `DemoSettings.seed` changed); every
candidate is then filled in by the model it made. A candidate is a sentence written in the docs' style (not
copied from them) whose blank the docs' own usage determines: the word two neighbours on each side most often
surround in the corpus. Printed per candidate: whether the docs' word is in the top 3 for each seed and its
probability; the demo's `PROBES` are six of the candidates every screening run got right, with different
answers.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bertlab.train.demo import PROBES, DemoSettings, fill_in_the_blank, run_demo  # noqa: E402

CANDIDATES = [
    # the demo's first six probes (until the screening below replaced three that no screening run got right)
    ('a python program can raise an exception with the "[MASK]" statement.', "raise"),
    ('it terminates the nearest enclosing [MASK], skipping the optional "else" clause.', "loop"),
    ("a function definition is an executable [MASK].", "statement"),
    ("if the index is out of range, an [MASK] is raised.", "exception"),
    ("the [MASK] of the expression is assigned to the target.", "value"),
    ("names are bound to [MASK] in the local namespace.", "objects"),
    # written for the screening, each around a word the docs' own neighbours determine
    ("every object is an [MASK] of some class.", "instance"),
    ("the operands are evaluated from [MASK] to right.", "left"),
    ('the "with" statement calls the [MASK] manager first.', "context"),
    ("a [MASK] block is executed in an execution frame.", "code"),
    ("this [MASK] should return a new object.", "method"),
    ("names in the global [MASK] are visible to the whole module.", "namespace"),
    ("keyword [MASK] are passed by name.", "arguments"),
    ("the result is a floating [MASK] number.", "point"),
    ("the [MASK] body is executed in a new namespace.", "class"),
    ('a "return" statement may only occur in a [MASK] definition.', "function"),
    ("an [MASK] handler is selected by the type of the exception.", "exception"),
    ('the "yield" expression is used in a [MASK] function.', "generator"),
    ("a string [MASK] is enclosed in single or double quotes.", "literal"),
    ("the [MASK] operand is evaluated first.", "left"),
    ('the "for" statement iterates over the elements of a [MASK].', "sequence"),
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="1,2", help="demo seeds to screen on (command 1 uses 0)")
    p.add_argument("--minutes", type=float, default=DemoSettings.minutes)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    hits: dict[str, list[tuple[bool, float]]] = {text: [] for text, _ in CANDIDATES}
    with tempfile.TemporaryDirectory() as work:
        for seed in seeds:
            out = Path(work) / f"seed{seed}"
            print(f"== demo, seed {seed}", flush=True)
            run_demo(out, minutes=args.minutes, progress=False, settings=replace(DemoSettings(), seed=seed),
                     echo=lambda s: print("   ", s, flush=True))
            for text, want, guesses in fill_in_the_blank(out / "run" / "final", CANDIDATES, k=3):
                words = [w for w, _ in guesses]
                shown = ", ".join(f"{w} {q:.0%}" for w, q in guesses)
                hits[text].append((want in words, dict(guesses).get(want, 0.0)))
                print(f"    {'ok' if want in words else '--'} {text:62s} -> {shown}  ({want})", flush=True)
    print(f"\n| candidate (* the demo's probes) | docs' word | in the top 3 (its probability), seeds {args.seeds} |"
          "\n|---|---|---|")
    for text, want in CANDIDATES:
        marks = " / ".join(f"{'yes' if ok else 'no'} ({q:.2f})" for ok, q in hits[text])
        star = "*" if (text, want) in PROBES else ""
        print(f"| {star}{text} | {want} | {marks} |")
    if args.json:
        args.json.write_text(json.dumps({"seeds": seeds, "hits": hits}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
