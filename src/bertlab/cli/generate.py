"""`bertlab generate --model DIR [--input FILE] [--max-new-tokens N] [--num-beams K]`: text-to-text generation
with a T5 model folder, JSON Lines out.

Texts come from the command line, or one per line from `--input FILE` (default: stdin). Each output line is
{"text", "generated", "token_ids"}; a text with `<extra_id_N>` sentinels also gets {"spans": {sentinel: span},
"filled"} -- T5's span filling: "The <extra_id_0> walks in <extra_id_1> park" -> the two spans and the filled
text. An input longer than the model allows is an error naming its line (`--on-long truncate` cuts it instead:
generating from a cut input answers a different question).
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..infer.runtime import add_inference_arguments

    add_inference_arguments(p)
    p.set_defaults(on_long="reject")
    p.add_argument("texts", nargs="*", metavar="TEXT", help="input text(s) (instead of --input)")
    p.add_argument("--input", metavar="FILE", help="one input text per line (default: stdin)")
    p.add_argument("--output", metavar="FILE", help="JSON Lines (default: stdout)")
    p.add_argument("--max-new-tokens", type=int, default=20, metavar="N", help="generated tokens at most (default 20)")
    p.add_argument("--num-beams", type=int, default=1, metavar="K", help="1: greedy (default); more: beam search")
    p.add_argument("--length-penalty", type=float, default=1.0, metavar="F",
                   help="beam search: scores divided by length^F (default 1.0; above 0 favours longer outputs)")
    p.add_argument("--early-stopping", default="false", choices=["false", "true", "never"],
                   help="beam search: stop when K beams have ended (true), when none can improve by the "
                        "heuristic (false, default), or only when none can improve at all (never); as transformers")


def run(args: argparse.Namespace) -> int:
    from ..core.errors import BertlabError
    from ..infer.generate import Generator
    from ..infer.inputs import Lines, read_lines
    from ..infer.outputs import json_line, text_output
    from ..infer.runtime import InferenceOptions

    if args.input and args.texts:
        raise BertlabError("give texts as arguments or with --input FILE, not both")
    lines = Lines(args.texts, "argument") if args.texts else read_lines(args.input)
    early = {"false": False, "true": True, "never": "never"}[args.early_stopping]
    generator = Generator.from_pretrained(args.model, InferenceOptions.from_args(args),
                                          max_new_tokens=args.max_new_tokens, num_beams=args.num_beams,
                                          length_penalty=args.length_penalty, early_stopping=early)
    results = generator.generate(lines.items, where=lines.where)
    with text_output(args.output) as f:
        for text, result in zip(lines.items, results):
            f.write(json_line({"text": text, **result}))
    return 0
