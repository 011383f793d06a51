"""`bertlab predict --model DIR [--input FILE] [--output FILE]`: run any fine-tuned model over a file or stdin.

The task comes from the model's config.json ("architectures"): sequence classification, token
classification (NER), question answering or multiple choice. Input: one item per line, a plain text or a
JSON object ({"text", "text_pair"}, {"tokens"}, {"question", "context"}, {"context", "choices"}); an "id"
field is echoed back. Output: one JSON object per line, in input order (see `bertlab.infer.predict`).
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..infer.runtime import add_inference_arguments

    add_inference_arguments(p)
    p.add_argument("--input", metavar="FILE", help="one text or JSON object per line (default: stdin)")
    p.add_argument("--output", metavar="FILE", help="JSON Lines (default: stdout)")


def run(args: argparse.Namespace) -> int:
    from ..infer.inputs import parse_record, read_lines
    from ..infer.outputs import json_line, text_output
    from ..infer.predict import Predictor
    from ..infer.runtime import InferenceOptions

    lines = read_lines(args.input)
    predictor = Predictor.from_pretrained(args.model, InferenceOptions.from_args(args))
    records = [parse_record(line, lines.where(i)) for i, line in enumerate(lines.items)]
    with text_output(args.output) as f:
        for record, answer in zip(records, predictor.iter_predict(records, where=lines.where)):
            if isinstance(record, dict) and "id" in record:
                answer = {"id": record["id"], **answer}
            f.write(json_line(answer))
    return 0
