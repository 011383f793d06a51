"""The sentence-transformers settings of a model folder, read and written: pooling, normalisation, prompts,
Matryoshka dimensions, similarity function.

A sentence-transformers folder is a Hugging Face model folder plus `modules.json` (Transformer -> Pooling
[-> Normalize]), `1_Pooling/config.json`, `sentence_bert_config.json` (the length limit) and
`config_sentence_transformers.json` (`prompts`, `default_prompt_name`, `similarity_fn_name`). `read_settings`
takes what an embedding, a fine-tuning or an evaluation starts from -- which prompt goes before a text is
picked as sentence-transformers picks it (`FolderPrompts.pick`), and vectors are ranked by the similarity it
declares (`EmbeddingSettings.scored_normalized`); `write_settings` writes a trained encoder so that
`SentenceTransformer(folder)` loads it and embeds as bertlab does (tests compare the two). Matryoshka
dimensions, which sentence-transformers does not record, are kept in `config_sentence_transformers.json` under
`"bertlab": {"matryoshka_dims": [...]}`; `truncate_dim` is the user's choice at load time in both libraries
(`--dimensions`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import BertlabError
from .embeddings import DEFAULT_POOLING, ST_POOLING_FLAGS, folder_prompts, model_pooling, resolve_normalize
from .multivector import ST_MULTI_VECTOR, marker_tokens

log = logging.getLogger(__name__)

ST_CONFIG = "config_sentence_transformers.json"
QUERY_PROMPT_NAMES = ("query",)
PASSAGE_PROMPT_NAMES = ("document", "passage", "corpus")  # in encode_document's order
# sentence-transformers' distance-based similarities (negative distances), which bertlab does not score by
UNSCORED_SIMILARITIES = ("euclidean", "manhattan")


@dataclass
class FolderPrompts:
    """A folder's prompts by name, the name of its default one, and which goes before a text, as
    sentence-transformers picks it."""

    prompts: dict[str, str] = field(default_factory=dict)
    default_name: str | None = None  # encode's prompt when none is named
    source: str = ""  # the file they were read from (for messages)

    def pick(self, name: str | None = None, text_kind: str | None = None) -> str:
        """The prompt called `name` (refused in one line when there is none of that name); else `encode_query`'s
        (text_kind "query": the "query" prompt) or `encode_document`'s ("document": the first of "document",
        "passage", "corpus" the folder has, even an empty one, as sentence-transformers 6 saves "document": "");
        else `encode`'s: the default prompt, if the folder names one."""
        if name is not None and name not in self.prompts:
            raise BertlabError(f"{self.source}: no prompt named {name!r} (its prompts: "
                               f"{', '.join(map(repr, self.prompts)) or 'none'})")
        names = QUERY_PROMPT_NAMES if text_kind == "query" else PASSAGE_PROMPT_NAMES if text_kind == "document" else ()
        name = name or next((k for k in names if k in self.prompts), self.default_name)
        return self.prompts.get(name, "") if name is not None else ""


@dataclass
class EmbeddingSettings:
    """How a folder's encoder turns a text into a vector, and how its vectors are compared."""

    pooling: str = DEFAULT_POOLING
    normalize: bool = True  # the pipeline's Normalize module
    query_prompt: str = ""  # encode_query's (`FolderPrompts.pick`)
    passage_prompt: str = ""  # encode_document's
    similarity: str = "cosine"  # cosine | dot, or a distance (UNSCORED_SIMILARITIES) kept as the folder says it
    matryoshka_dims: list[int] = field(default_factory=list)
    max_seq_length: int | None = None
    named_prompts: FolderPrompts = field(default_factory=FolderPrompts)  # all of them, and the default

    @property
    def scored_normalized(self) -> bool:
        """Whether the vectors are L2-normalised before the dot products that rank them: cosine needs it
        whatever the pipeline does (sentence-transformers' `similarity` and evaluators score a model without a
        Normalize module by cosine unless it declares `dot`)."""
        return self.normalize or self.similarity == "cosine"

    def check_scored(self) -> None:
        """Refuse, in one line, to rank by a similarity bertlab does not compute."""
        if self.similarity in UNSCORED_SIMILARITIES:
            raise BertlabError(f"{self.named_prompts.source}: similarity_fn_name {self.similarity!r}; bertlab "
                               "scores by cosine or dot product, which would rank this model's vectors otherwise")


def _json(path: Path) -> dict | list | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_prompts(model_dir: str | Path) -> FolderPrompts:
    """A folder's prompts; a default that names none of them is refused in one line, as sentence-transformers
    refuses to load it."""
    folder = Path(model_dir)
    config = _json(folder / ST_CONFIG)
    if not isinstance(config, dict):
        return FolderPrompts(source=str(folder / ST_CONFIG))
    # a sentence-transformers ColBERT's prompts are its markers, which ColBERT's tokens place by id
    markers = set(marker_tokens(folder)) if config.get("model_type") == ST_MULTI_VECTOR else set()
    prompts = {k: v for k, v in folder_prompts(folder).items() if v not in markers}
    default = config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise BertlabError(f"{folder / ST_CONFIG}: default_prompt_name {default!r} names none of its prompts "
                           f"({', '.join(map(repr, prompts)) or 'none'})")
    return FolderPrompts(prompts, default, str(folder / ST_CONFIG))


def read_settings(model_dir: str | Path, pooling: str | None = None) -> EmbeddingSettings:
    """The folder's sentence-transformers settings; a plain Hugging Face folder: mean pooling, normalised,
    no prompts (sentence-transformers' own defaults for such a folder, except normalisation: cosine needs it).
    `pooling`: the caller's own (`--pooling`), for which the folder's Pooling module is not read."""
    folder = Path(model_dir)
    prompts = read_prompts(folder)
    settings = EmbeddingSettings(pooling=pooling or model_pooling(folder) or DEFAULT_POOLING,
                                 normalize=resolve_normalize(folder, None),
                                 query_prompt=prompts.pick(None, "query"), passage_prompt=prompts.pick(None, "document"),
                                 named_prompts=prompts)
    config = _json(folder / ST_CONFIG)
    if isinstance(config, dict):
        similarity = config.get("similarity_fn_name")
        if similarity in ("dot", "dot_product"):
            settings.similarity = "dot"
        elif similarity in UNSCORED_SIMILARITIES:
            settings.similarity = similarity
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
    _write(folder / "1_Pooling" / "config.json",  # every flag sentence-transformers has, the pooling's alone true
           {"word_embedding_dimension": hidden_size,
            **{flag: name == settings.pooling for flag, name in ST_POOLING_FLAGS.items()}})
    _write(folder / "modules.json", modules)
    _write(folder / "sentence_bert_config.json", {"max_seq_length": max_seq_length, "do_lower_case": False})
    # the folder's other prompts kept; the query and document ones as the settings have them now
    named = settings.named_prompts
    prompts = {k: v for k, v in named.prompts.items() if k not in (*QUERY_PROMPT_NAMES, *PASSAGE_PROMPT_NAMES)}
    prompts.update((k, v) for k, v in (("query", settings.query_prompt), ("document", settings.passage_prompt)) if v)
    config = {"prompts": prompts, "default_prompt_name": named.default_name if named.default_name in prompts else None,
              "similarity_fn_name": settings.similarity}
    if settings.matryoshka_dims:
        config["bertlab"] = {"matryoshka_dims": list(settings.matryoshka_dims)}
    _write(folder / ST_CONFIG, config)
