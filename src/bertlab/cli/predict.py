"""`bertlab predict --model DIR [--input FILE] [--output FILE]`: run any fine-tuned model over a file or stdin.

The task comes from the model's config.json ("architectures"): sequence classification, token
classification (NER), question answering or multiple choice; a T5 model (model_type "t5") generates text for
each input, with the filled spans for a text holding <extra_id_N> sentinels. Input: one item per line, a plain text or a
JSON object ({"text", "text_pair"}, {"tokens"}, {"question", "context"}, {"context", "choices"}). Output:
one JSON object per input line, in input order (see `bertlab.infer.predict`), each starting with
  "id"    the record's own "id" field, else the input's line number (1, 2, ...)
  "text"  the text the prediction is for (and "text_pair" / "question" when the input has them)
then the prediction. A blank line is not sent to the model: its row is {"id": N, "text": "", "skipped":
"blank line"}, so output row i still answers input line i.
"""

from __future__ import annotations

import argparse

ECHOED = ("text", "text_pair", "question")  # input fields repeated in the output row (not long contexts)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..infer.runtime import add_inference_arguments

    add_inference_arguments(p)
    p.add_argument("--input", metavar="FILE", help="one text or JSON object per line (default: stdin)")
    p.add_argument("--output", metavar="FILE", help="JSON Lines (default: stdout)")


def row_head(record: dict | str, line_number: int) -> dict:
    """The id and text fields that start an output row."""
    if isinstance(record, str):
        return {"id": line_number, "text": record}
    return {"id": record.get("id", line_number), **{k: record[k] for k in ECHOED if k in record}}


def is_t5_folder(model_dir) -> bool:
    """Whether `model_dir` holds a T5 model (config.json's model_type); a folder without one is not."""
    import json
    from pathlib import Path

    try:
        return json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8")).get("model_type") == "t5"
    except (OSError, ValueError, AttributeError):
        return False  # the BERT loader reports a missing or broken config.json in its own words


def run(args: argparse.Namespace) -> int:
    from ..errors import BertlabError
    from ..infer.inputs import parse_record, read_lines
    from ..infer.outputs import json_line, text_output
    from ..infer.predict import Predictor
    from ..infer.runtime import InferenceOptions
    from ..progress import track

    lines = read_lines(args.input)
    kept = [i for i, line in enumerate(lines.items) if line.strip()]
    if not kept:
        raise BertlabError(f"{lines.source}: only blank lines; expected one text or JSON object per line")
    options = InferenceOptions.from_args(args)
    if is_t5_folder(args.model):  # a T5 model answers by generating text (infer/generate.py)
        from ..infer.generate import Generator

        predictor = Generator.from_pretrained(args.model, options)
    else:
        predictor = Predictor.from_pretrained(args.model, options)
    records = {i: parse_record(lines.items[i], lines.where(i)) for i in kept}
    answers = predictor.iter_predict([records[i] for i in kept], where=lambda k: lines.where(kept[k]))
    with text_output(args.output) as f:
        for i, line in track(enumerate(lines.items), len(lines.items), "predict", "line"):
            if i not in records:
                f.write(json_line({"id": i + 1, "text": line, "skipped": "blank line"}))
                continue
            f.write(json_line({**row_head(records[i], i + 1), **next(answers)}))
    return 0
