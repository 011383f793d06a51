"""The sentence-transformers settings of a model folder, read and written: pooling, normalisation, prompts,
Matryoshka dimensions, similarity function.

A sentence-transformers folder is a Hugging Face model folder plus `modules.json` (Transformer -> Pooling
[-> Normalize]), `1_Pooling/config.json`, `sentence_bert_config.json` (the length limit) and
`config_sentence_transformers.json` (`prompts`, `similarity_fn_name`). `read_settings` takes what a fine-tuning
or an evaluation starts from; `write_folder` writes a trained encoder so that `SentenceTransformer(folder)`
loads it and embeds as bertlab does (tests compare the two). Matryoshka dimensions, which sentence-transformers
does not record, are kept in `config_sentence_transformers.json` under `"bertlab": {"matryoshka_dims": [...]}`;
`truncate_dim` is the user's choice at load time in both libraries.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import BertlabError
from .embeddings import DEFAULT_POOLING, model_normalize, model_pooling
from .multivector import ST_MULTI_VECTOR, marker_tokens

log = logging.getLogger(__name__)

ST_CONFIG = "config_sentence_transformers.json"
POOLING_FLAGS = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens", "max": "pooling_mode_max_tokens"}
QUERY_PROMPT_NAMES = ("query",)
PASSAGE_PROMPT_NAMES = ("document", "passage", "corpus", "doc")
# sentence-transformers' distance-based similarities (negative distances), which bertlab does not score by
UNSCORED_SIMILARITIES = ("euclidean", "manhattan")


@dataclass
class EmbeddingSettings:
    """How a folder's encoder turns a text into a vector."""

    pooling: str = DEFAULT_POOLING
    normalize: bool = True
    query_prompt: str = ""
    passage_prompt: str = ""
    similarity: str = "cosine"  # cosine | dot
    matryoshka_dims: list[int] = field(default_factory=list)
    max_seq_length: int | None = None


def _json(path: Path) -> dict | list | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_settings(model_dir: str | Path) -> EmbeddingSettings:
    """The folder's sentence-transformers settings; a plain Hugging Face folder: mean pooling, normalised,
    no prompts (sentence-transformers' own defaults for such a folder, except normalisation: cosine needs it)."""
    folder = Path(model_dir)
    settings = EmbeddingSettings(pooling=model_pooling(folder) or DEFAULT_POOLING,
                                 normalize=model_normalize(folder) is not False)
    config = _json(folder / ST_CONFIG)
    if isinstance(config, dict):
        prompts = config.get("prompts") or {}
        if isinstance(prompts, dict):
            # a sentence-transformers ColBERT's prompts are its markers, which ColBERT's tokens place by id
            markers = set(marker_tokens(folder)) if config.get("model_type") == ST_MULTI_VECTOR else set()
            settings.query_prompt = next((prompts[k] for k in QUERY_PROMPT_NAMES
                                          if prompts.get(k) and prompts[k] not in markers), "")
            settings.passage_prompt = next((prompts[k] for k in PASSAGE_PROMPT_NAMES
                                            if prompts.get(k) and prompts[k] not in markers), "")
        similarity = config.get("similarity_fn_name")
        if similarity in ("dot", "dot_product"):
            settings.similarity = "dot"
        elif similarity in UNSCORED_SIMILARITIES:
            raise BertlabError(f"{folder / ST_CONFIG}: similarity_fn_name {similarity!r}; bertlab scores by cosine "
                               "or dot product, which would rank this model's vectors otherwise")
        own = config.get("bertlab") or {}
        settings.matryoshka_dims = [int(d) for d in own.get("matryoshka_dims", [])] if isinstance(own, dict) else []
    st = _json(folder / "sentence_bert_config.json")
    if isinstance(st, dict) and isinstance(st.get("max_seq_length"), int):
        settings.max_seq_length = st["max_seq_length"]
    return settings


def _write(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def write_settings(folder: Path, settings: EmbeddingSettings, hidden_size: int, max_seq_length: int) -> None:
    """The sentence-transformers files beside a saved encoder and tokenizer in `folder`."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if settings.normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (folder / "2_Normalize").mkdir(exist_ok=True)
    (folder / "1_Pooling").mkdir(exist_ok=True)
    _write(folder / "1_Pooling" / "config.json",
           {"word_embedding_dimension": hidden_size, **{flag: name == settings.pooling for name, flag in POOLING_FLAGS.items()},
            "pooling_mode_mean_sqrt_len_tokens": False})
    _write(folder / "modules.json", modules)
    _write(folder / "sentence_bert_config.json", {"max_seq_length": max_seq_length, "do_lower_case": False})
    prompts = {k: v for k, v in (("query", settings.query_prompt), ("document", settings.passage_prompt)) if v}
    config = {"prompts": prompts, "default_prompt_name": None,
              "similarity_fn_name": "dot" if settings.similarity == "dot" else "cosine"}
    if settings.matryoshka_dims:
        config["bertlab"] = {"matryoshka_dims": list(settings.matryoshka_dims)}
    _write(folder / ST_CONFIG, config)
