"""`bertlab predict --model DIR [--input FILE] [--output FILE]`: run any fine-tuned model over a file or stdin.

The task comes from the model's config.json ("architectures"): sequence classification, token
classification (NER), question answering or multiple choice; a T5 model (model_type "t5") generates text for
each input, with the filled spans for a text holding <extra_id_N> sentinels.

Input (`bertlab.infer.input_files`): a table -- CSV, TSV, JSON Lines, JSON, Parquet, told by the file name or
--format -- is read as `finetune` reads it: a classifier's text is the column it was fine-tuned on (config.json
input_columns), or --text-column, or a common name (text, sentence, ...); other tasks take the row's fields.
Anything else is one item per line: a plain text or a JSON object ({"text", "text_pair"}, {"tokens"},
{"question", "context"}, {"context", "choices"}). Output: one JSON object per input row, in input order (see
`bertlab.infer.predict`), each starting with
  "id"    the row's id column / the record's own "id" field, else its line (record) number (1, 2, ...)
  "text"  the text the prediction is for (and "text_pair" / "question" when the input has them)
then the prediction. A blank line is not sent to the model: its row is {"id": N, "text": "", "skipped":
"blank line"}, so output row i still answers input line i. With `--ray`, a classifier over Ray Data
(`bertlab.infer.ray_data`): tables in (a file, a folder or a glob), a folder of Parquet shards out (`id`, then
the prediction's fields).
"""

from __future__ import annotations

import argparse

ECHOED = ("text", "text_pair", "question")  # input fields repeated in the output row (not long contexts)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..infer.input_files import INPUT_FORMATS
    from ..infer.ray_data import add_ray_arguments
    from ..infer.runtime import add_engine_argument, add_inference_arguments

    add_inference_arguments(p)
    add_engine_argument(p)
    p.add_argument("--input", metavar="FILE",
                   help="a table (.csv, .tsv, .jsonl, .json, .parquet), or one text or JSON object per line "
                        "(default: stdin)")
    p.add_argument("--output", metavar="FILE", help="JSON Lines (default: stdout); with --ray a folder of Parquet "
                                                    "shards (id, then the prediction's fields)")
    p.add_argument("--format", choices=INPUT_FORMATS,
                   help="how to read --input when its name does not say (text: one item per line)")
    p.add_argument("--text-column", metavar="NAME",
                   help="the column (field) holding the text (default: the one the model was fine-tuned on, "
                        "else text, sentence, ...)")
    p.add_argument("--text-pair-column", metavar="NAME", help="the column holding the second text of a pair")
    p.add_argument("--id-column", metavar="NAME",
                   help="a table's column holding the row's id (default: id, guid, idx, index; else the line number)")
    add_ray_arguments(p)


def row_head(record: dict | str, row_id) -> dict:
    """The id and text fields that start an output row."""
    if isinstance(record, str):
        return {"id": row_id, "text": record}
    return {"id": row_id, **{k: record[k] for k in ECHOED if k in record}}


def generates_text(model_dir) -> bool:
    """Whether `model_dir` holds a model of a family that answers by generating text (T5: `Family.generates_text`,
    from config.json's model_type); a folder without a readable config or of an unknown type is not."""
    from ..core.errors import BertlabError
    from ..models.registry import family_of

    try:
        return family_of(model_dir).generates_text
    except (OSError, ValueError, BertlabError):
        return False  # the predictor's loader reports a missing or broken config.json in its own words


def run(args: argparse.Namespace) -> int:
    from ..infer.input_files import TextColumns, read_inputs
    from ..infer.outputs import json_line, text_output
    from ..infer.predict import Predictor
    from ..infer.runtime import InferenceOptions
    from ..core.progress import track

    from ..infer import ray_data

    ray_data.check_ray_arguments(args)
    if args.ray is not None:
        return ray_data.run_command(args, ray_data.run_predict)
    options = InferenceOptions.from_args(args)
    if generates_text(args.model):  # an encoder-decoder answers by generating text (infer/generate.py)
        from ..infer.generate import Generator

        predictor = Generator.from_pretrained(args.model, options)
        config_extra, reads_text = {}, True
    else:
        predictor = Predictor.from_pretrained(args.model, options)
        config_extra, reads_text = predictor.model.config.extra, predictor.runner.task == "text-classification"
    columns = TextColumns.for_model(args.text_column, args.text_pair_column, config_extra)
    rows, _ = read_inputs(args.input, columns, args.format, classify=reads_text, id_column=args.id_column)
    kept = [i for i, row in enumerate(rows) if row.item is not None]
    answers = predictor.iter_predict([rows[i].item for i in kept], where=lambda k: rows[kept[k]].where)
    with text_output(args.output) as f:
        for row in track(rows, len(rows), "predict", "row"):
            if row.item is None:
                f.write(json_line({"id": row.id, "text": row.blank, "skipped": "blank line"}))
                continue
            f.write(json_line({**row_head(row.item, row.id), **next(answers)}))
    return 0
