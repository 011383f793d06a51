"""`bertlab params [PRESET | config.json ...] [--format table|json]`: parameter counts per model part.

BERT presets (base, large, L4-H256, ...) and T5 presets (t5-small, t5-base, t5-large, t5-v1_1-*) by name; a
config.json (or model folder) is counted by its family, from its `model_type` (BERT, RoBERTa, XLM-R, T5,
DistilBERT, ALBERT: ALBERT's shared blocks counted once)."""

from __future__ import annotations

import argparse
import json
import os
from functools import partial

from ..core.errors import BertlabError
from ..models.registry import model_type_of
from ..models.bert.config import BertConfig, is_preset, preset_names
from ..params import (albert_parameter_table, distilbert_parameter_table, format_t5_table, format_table,
                      parameter_table, roberta_parameter_table, t5_parameter_table)
from ..models.albert.config import AlbertConfig
from ..models.distilbert.config import DistilBertConfig
from ..models.roberta.config import RobertaConfig
from ..models.xlm_roberta.config import XLMRobertaConfig
from ..models.t5.config import MODEL_TYPE as T5_MODEL_TYPE
from ..models.t5.config import PRESETS as T5_PRESETS
from ..models.t5.config import T5Config

# model family -> (config from a preset name or path, rows, table)
PARAMETER_TABLES = {
    "bert": (BertConfig.from_name_or_path, parameter_table, format_table),
    T5_MODEL_TYPE: (T5Config.from_name_or_path, t5_parameter_table, format_t5_table),
    # shared weights counted once (ALBERT); BERT's blocks without token types or pooler (DistilBERT)
    "albert": (AlbertConfig.from_name_or_path, albert_parameter_table,
               partial(format_table, rows=albert_parameter_table)),
    "distilbert": (DistilBertConfig.from_name_or_path, distilbert_parameter_table,
                   partial(format_table, rows=distilbert_parameter_table)),
    **{model_type: (config.from_name_or_path, roberta_parameter_table,
                    partial(format_table, rows=roberta_parameter_table))
       for model_type, config in (("roberta", RobertaConfig), ("xlm-roberta", XLMRobertaConfig))},
}


def family(name: str) -> str:
    if name in T5_PRESETS:
        return T5_MODEL_TYPE
    if is_preset(name) or not os.path.exists(name):
        return "bert"  # BERT's loader reports an unknown name
    model_type = model_type_of(name)
    if model_type not in PARAMETER_TABLES:  # another family's config must not be counted as a BERT
        raise BertlabError(f"{name}: bertlab params counts {', '.join(sorted(PARAMETER_TABLES))} configs, not "
                           f"model_type {model_type!r}")
    return model_type


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("models", nargs="*", default=["base", "large"],
                   help=f"presets ({', '.join(preset_names()[:6])}, L2-H128 ... L12-H768; {', '.join(T5_PRESETS)}) "
                        "or config.json paths (default: base large)")
    p.add_argument("--format", choices=["table", "json"], default="table")


def run(args: argparse.Namespace) -> int:
    tables = [(name, PARAMETER_TABLES[family(name)]) for name in args.models]
    configs = [(name, fam, fam[0](name)) for name, fam in tables]
    if args.format == "json":
        print(json.dumps({name: dict(fam[1](c)) for name, fam, c in configs}, indent=2))
    else:
        print("\n\n".join(fam[2](name, c) for name, fam, c in configs))
    return 0
