"""Multi-vector (ColBERT) embeddings: one small L2-normalised vector per token, scored by MaxSim.

ColBERT (Khattab & Zaharia, 2020; v2: Santhanam et al., 2022) as PyLate computes it, so that a folder moves
between the two unchanged:

    query     [CLS] [Q] tokens [SEP] [MASK] ... [MASK]  cut, or padded with [MASK], to `query_length` (32) tokens:
              the [MASK]s are the query augmentation -- they attend to the query, nothing attends to them
              (`attend_to_expansion_tokens` false) -- and every position, [MASK]s included, gives a vector
    document  [CLS] [D] tokens [SEP]                   cut to `document_length` (180) tokens, never padded; the
              vectors of punctuation tokens (`skiplist_words`, Python's string.punctuation) are dropped
    vector    normalize(W h_t): h_t the encoder's last layer at token t, W a (dim x hidden) linear map without
              bias (dim 128)

The markers are tokens of their own, "[Q] " and "[D] " (PyLate's defaults, the trailing space included),
appended to the vocabulary (`add_markers`; their embedding rows start at the mean of the others) and inserted
by id after the first token -- never looked for in the text. The skiplist is PyLate's: each word's id by
`convert_tokens_to_ids`, so a word missing from the vocabulary puts [UNK] on the list.

MaxSim: score(q, d) = Σ_i max_j q_i · d_j over the query's vectors i and the document's kept vectors j
(`maxsim`).

A ColBERT folder is PyLate's layout: the encoder in the Hugging Face layout, the markers as added tokens of
`tokenizer_config.json` (at the ids after the vocabulary's), `modules.json` (Transformer -> Dense), `1_Dense/`
(`config.json`, `model.safetensors` holding `linear.weight`) and `config_sentence_transformers.json` with the
settings above and `similarity_fn_name` "MaxSim" (`write_colbert_files`, `read_colbert_settings`). The tests
read it with `transformers` as PyLate does and compare token ids, vectors and scores with PyLate's formulas.

sentence-transformers 6's `MultiVectorEncoder` folders are read too (`model_type` "MultiVectorEncoder":
Transformer -> Dense -> MultiVectorMask -> Normalize, `_read_st_settings`): the same computation with the
settings kept elsewhere -- the query expansion and the lengths in `sentence_bert_config.json`, the markers as
its `prompts` (text put before the text, each one of the tokenizer's added tokens, so the same ids land after
[CLS]), the skiplist in the mask module's config, where a word missing from the vocabulary is dropped from the
list instead of skipping [UNK]. What that layout can say and bertlab does not compute (a "min" expansion,
another expansion token, skiplists on queries, allow-lists, MeanMaxSim, other modules) is refused in one line.

Ragged output: the vectors of many texts are one (total tokens, dim) array and N + 1 offsets, text i's vectors
being rows offsets[i]:offsets[i + 1] (`Ragged`): written as `.npz` (`vectors`, `offsets`[, `ids`]) or JSON Lines
(one list of vectors per text).
"""

from __future__ import annotations

import json
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..core.errors import BertlabError
from . import length_buckets
from .inputs import encode
from .runtime import InferenceOptions, load_encoder, load_tokenizer

PYLATE_CONFIG = "config_sentence_transformers.json"
DENSE_DIR = "1_Dense"
DENSE_TYPE = "pylate.models.Dense.Dense"
SIMILARITY = "MaxSim"
ST_MULTI_VECTOR = "MultiVectorEncoder"  # sentence-transformers 6's model_type for its ColBERT folders
ST_MODULES = ("Transformer", "Dense", "MultiVectorMask", "Normalize")  # the pipeline of such a folder
TEXT_KINDS = ("query", "document")
MULTI_VECTOR_POOLINGS = ("colbert",)  # `embed --pooling` names beside the sentence poolings


@dataclass
class ColbertSettings:
    """How a ColBERT folder turns a query or a document into vectors (PyLate's defaults)."""

    dim: int = 128
    query_prefix: str = "[Q] "
    document_prefix: str = "[D] "
    query_length: int = 32
    document_length: int = 180
    do_query_expansion: bool = True
    attend_to_expansion_tokens: bool = False
    skiplist_words: list[str] = field(default_factory=lambda: list(string.punctuation))
    skip_unknown: bool = True
    """a skiplist word missing from the vocabulary skips [UNK] (PyLate); False: it is left off the list
    (sentence-transformers 6)"""

    def marker_tokens(self) -> tuple[str, ...]:
        """The query and document prefixes that are tokens (an empty prefix: no marker)."""
        return tuple(t for t in (self.query_prefix, self.document_prefix) if t)

    def __post_init__(self) -> None:
        for name in ("dim", "query_length", "document_length"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 3:
                raise BertlabError(f"ColBERT {name} must be an integer of at least 3, got {getattr(self, name)!r}")


def _json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def is_colbert_folder(model_dir: str | Path | None) -> bool:
    """Whether the folder is a ColBERT folder: PyLate's (its sentence-transformers config says MaxSim) or a
    sentence-transformers `MultiVectorEncoder`."""
    if model_dir is None:
        return False
    config = _json(Path(model_dir) / PYLATE_CONFIG)
    return isinstance(config, dict) and (config.get("similarity_fn_name") == SIMILARITY
                                         or config.get("model_type") == ST_MULTI_VECTOR)


def _st_multi_vector(folder: Path) -> bool:
    config = _json(folder / PYLATE_CONFIG)
    return isinstance(config, dict) and config.get("model_type") == ST_MULTI_VECTOR


def _dense_dir(folder: Path) -> Path:
    if _st_multi_vector(folder):
        return _st_module_paths(folder)["Dense"]
    modules = _json(folder / "modules.json")
    if not isinstance(modules, list):
        raise BertlabError(f"{folder}: a ColBERT folder needs modules.json (Transformer, then Dense)")
    dense = [m for m in modules if isinstance(m, dict) and str(m.get("type", "")).endswith("Dense")]
    if len(dense) != 1:
        raise BertlabError(f"{folder}/modules.json: a ColBERT folder has one Dense module (the projection), "
                           f"found {len(dense)}")
    return folder / str(dense[0].get("path", DENSE_DIR))


def marker_tokens(model_dir: str | Path | None) -> tuple[str, ...]:
    """A ColBERT folder's marker tokens (its query and document prefixes), which a PyLate folder's tokenizer.json
    holds as tokens added after the vocabulary; () for any other folder."""
    if not is_colbert_folder(model_dir):
        return ()
    return read_colbert_settings(model_dir).marker_tokens()


def _projection_dim(folder: Path, dense_dir: Path) -> int:
    dense = _json(dense_dir / "config.json")
    if not isinstance(dense, dict) or not isinstance(dense.get("out_features"), int):
        raise BertlabError(f"{dense_dir}/config.json: expected the projection's out_features")
    if dense.get("bias") or dense.get("use_residual") or "Identity" not in str(dense.get("activation_function",
                                                                                        "Identity")):
        raise BertlabError(f"{dense_dir}/config.json: a projection with a bias, a residual or an activation "
                           "is not ColBERT's linear map; bertlab does not run it")
    return dense["out_features"]


def read_colbert_settings(model_dir: str | Path) -> ColbertSettings:
    """A ColBERT folder's settings (`config_sentence_transformers.json`, the Dense module's dimension; a
    sentence-transformers `MultiVectorEncoder`'s from its modules, `_read_st_settings`)."""
    folder = Path(model_dir)
    if _st_multi_vector(folder):
        return _read_st_settings(folder)
    config = _json(folder / PYLATE_CONFIG)
    if not isinstance(config, dict) or config.get("similarity_fn_name") != SIMILARITY:
        raise BertlabError(f"{folder}: not a ColBERT folder ({PYLATE_CONFIG} does not say similarity_fn_name "
                           f"{SIMILARITY!r}); train one with finetune-embeddings --loss colbert")
    settings = ColbertSettings(dim=_projection_dim(folder, _dense_dir(folder)))
    for name in ("query_prefix", "document_prefix", "query_length", "document_length", "do_query_expansion",
                 "attend_to_expansion_tokens", "skiplist_words"):
        if config.get(name) is not None:
            setattr(settings, name, config[name])
    settings.__post_init__()
    return settings


def _added_tokens(folder: Path) -> set[str]:
    """The tokens a folder's tokenizer files add to the vocabulary (tokenizer.json's `added_tokens`,
    tokenizer_config.json's `added_tokens_decoder`)."""
    out = set()
    data = _json(folder / "tokenizer.json")
    for entry in (data.get("added_tokens") or []) if isinstance(data, dict) else []:
        if isinstance(entry, dict) and isinstance(entry.get("content"), str):
            out.add(entry["content"])
    config = _json(folder / "tokenizer_config.json")
    decoder = config.get("added_tokens_decoder") if isinstance(config, dict) else None
    out.update(e["content"] for e in (decoder or {}).values()
               if isinstance(e, dict) and isinstance(e.get("content"), str))
    return out


def _refusal(folder: Path, where: str, what: str) -> BertlabError:
    return BertlabError(f"{folder / where}: {what}; bertlab does not compute that ColBERT variant")


def _st_module_paths(folder: Path) -> dict[str, Path]:
    """A `MultiVectorEncoder` folder's module folders by class name, its pipeline checked to be `ST_MODULES`."""
    modules = _json(folder / "modules.json")
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise BertlabError(f"{folder}/modules.json: missing or not a list of modules")
    names = tuple(str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules)
    if names != ST_MODULES:
        raise _refusal(folder, "modules.json", f"modules {' -> '.join(names)}, not {' -> '.join(ST_MODULES)}")
    return {name: folder / str(m.get("path", "")) for name, m in zip(names, modules)}


def _read_st_settings(folder: Path) -> ColbertSettings:
    """A sentence-transformers 6 `MultiVectorEncoder` folder's settings, or a one-line refusal of what bertlab
    does not compute (see the module docstring)."""
    def refuse(where: str, what: str) -> BertlabError:
        return _refusal(folder, where, what)

    paths = _st_module_paths(folder)
    config = _json(folder / PYLATE_CONFIG)
    if config.get("similarity_fn_name") not in (None, "maxsim"):
        raise refuse(PYLATE_CONFIG, f"similarity_fn_name {config['similarity_fn_name']!r}, not maxsim")
    dense = _json(paths["Dense"] / "config.json") or {}
    if dense.get("module_input_name", "token_embeddings") != "token_embeddings":
        raise refuse(f"{paths['Dense'].name}/config.json", "a projection of something else than the token embeddings")
    normalize = _json(paths["Normalize"] / "config.json") or {}
    if normalize.get("module_input_name", "token_embeddings") != "token_embeddings":
        raise refuse(f"{paths['Normalize'].name}/config.json", "a Normalize of something else than the token vectors")
    mask = _json(paths["MultiVectorMask"] / "config.json") or {}
    if mask.get("keep_only_token_ids") is not None:
        raise refuse(f"{paths['MultiVectorMask'].name}/config.json", "keep_only_token_ids (an allow-list)")
    if list(mask.get("skiplist_tasks") or ["document"]) != ["document"]:
        raise refuse(f"{paths['MultiVectorMask'].name}/config.json",
                     f"skiplist_tasks {mask['skiplist_tasks']!r}, not documents alone")
    transformer = _json(folder / "sentence_bert_config.json") or {}
    if transformer.get("do_lower_case"):
        raise refuse("sentence_bert_config.json", "do_lower_case (lower-casing before the tokenizer)")
    expansion = transformer.get("query_expansion")
    if expansion is not None:
        if not isinstance(expansion, dict) or expansion.get("strategy") != "fixed" or expansion.get("token") \
                is not None or not isinstance(expansion.get("length"), int):
            raise refuse("sentence_bert_config.json", f"query_expansion {expansion!r}; bertlab pads queries to a "
                         "fixed length with the mask token ({'strategy': 'fixed', 'token': null, 'length': N})")
    tokenizer_config = _json(folder / "tokenizer_config.json") or {}
    longest = transformer.get("max_seq_length") or tokenizer_config.get("model_max_length")

    def length(value, name: str) -> int:
        value = value or longest
        if not isinstance(value, int) or not 3 <= value <= 1_000_000:
            raise BertlabError(f"{folder}/sentence_bert_config.json: no {name} (nor max_seq_length, nor the "
                               "tokenizer's model_max_length) to cut texts at")
        return value

    prompts = config.get("prompts")
    prompts = prompts if isinstance(prompts, dict) else {}
    added = _added_tokens(folder)
    prefixes = {}
    for kind in TEXT_KINDS:
        prompt = prompts.get(kind) or ""
        if prompt and prompt not in added:
            raise refuse(PYLATE_CONFIG, f"the {kind} prompt {prompt!r} is text, not one of the tokenizer's added "
                         "tokens (a marker)")
        prefixes[kind] = prompt
    settings = ColbertSettings(
        dim=_projection_dim(folder, paths["Dense"]), query_prefix=prefixes["query"],
        document_prefix=prefixes["document"],
        query_length=expansion["length"] if expansion else length(transformer.get("query_length"), "query_length"),
        document_length=length(transformer.get("document_length"), "document_length"),
        do_query_expansion=expansion is not None,
        attend_to_expansion_tokens=bool(expansion and expansion.get("attend")),
        skiplist_words=[str(w) for w in mask.get("skiplist_words") or []], skip_unknown=False)
    settings.__post_init__()
    return settings


def read_projection(model_dir: str | Path) -> torch.Tensor:
    """The folder's (dim, hidden) projection weight, from the Dense module's safetensors."""
    from safetensors.torch import load_file

    path = _dense_dir(Path(model_dir)) / "model.safetensors"
    if not path.is_file():
        raise BertlabError(f"{path}: missing; the projection's weights are read from safetensors only")
    state = load_file(str(path))
    if set(state) != {"linear.weight"}:
        raise BertlabError(f"{path}: expected one tensor, linear.weight; found {', '.join(sorted(state))}")
    return state["linear.weight"].float()


def write_colbert_files(folder: Path, settings: ColbertSettings, weight: torch.Tensor, prompts: dict | None = None,
                        tokenizer=None) -> None:
    """The PyLate files beside an encoder and tokenizer saved in `folder`: modules.json, 1_Dense/, the settings;
    the markers as added tokens of the tokenizer's files."""
    from safetensors.torch import save_file

    def write(path: Path, data) -> None:
        path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")

    if tokenizer is not None and (folder / "vocab.txt").is_file():
        # `transformers` strips vocab.txt's lines ("[Q] " would come back as "[Q]", a new token to PyLate): the
        # markers go into tokenizer_config.json as added tokens, at their ids, as `transformers` saves them
        markers_ = {t: i for t in (settings.query_prefix, settings.document_prefix) if t
                    and (i := _vocab_id(tokenizer, t)) is not None}
        lines = (folder / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
        first = min(markers_.values(), default=len(lines))
        if sorted(markers_.values()) != list(range(first, len(lines))):
            raise BertlabError(f"{folder}/vocab.txt: the marker tokens are not its last lines")
        (folder / "vocab.txt").write_text("".join(t + "\n" for t in lines[:first]), encoding="utf-8")
        config = _json(folder / "tokenizer_config.json") or {}
        config["added_tokens_decoder"] = {**config.get("added_tokens_decoder", {}), **{
            str(i): {"content": t, "lstrip": False, "normalized": True, "rstrip": False, "single_word": False,
                     "special": False} for t, i in markers_.items()}}
        write(folder / "tokenizer_config.json", config)

    skiplist = list(settings.skiplist_words)
    if not settings.skip_unknown:  # PyLate's layout skips [UNK] for a word missing from the vocabulary
        if tokenizer is None:
            raise BertlabError("writing a sentence-transformers ColBERT's skiplist in PyLate's layout needs its "
                               "tokenizer")
        skiplist = [w for w in skiplist if _vocab_id(tokenizer, w) is not None]
    write(folder / "modules.json",
          [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
           {"idx": 1, "name": "1", "path": DENSE_DIR, "type": DENSE_TYPE}])
    (folder / DENSE_DIR).mkdir(exist_ok=True)
    write(folder / DENSE_DIR / "config.json",
          {"in_features": int(weight.shape[1]), "out_features": int(weight.shape[0]), "bias": False,
           "activation_function": "torch.nn.modules.linear.Identity", "use_residual": False})
    save_file({"linear.weight": weight.detach().float().contiguous().cpu()},
              str(folder / DENSE_DIR / "model.safetensors"), metadata={"format": "pt"})
    # sentence-transformers' Transformer module reads its length limit here; PyLate sets it per text kind
    write(folder / "sentence_bert_config.json", {"max_seq_length": settings.document_length - 1,
                                                 "do_lower_case": False})
    write(folder / PYLATE_CONFIG,
          {"model_type": "ColBERT", "prompts": prompts or {}, "default_prompt_name": None,
           "similarity_fn_name": SIMILARITY, "query_prefix": settings.query_prefix,
           "document_prefix": settings.document_prefix, "query_length": settings.query_length,
           "document_length": settings.document_length,
           "attend_to_expansion_tokens": settings.attend_to_expansion_tokens,
           "skiplist_words": skiplist, "do_query_expansion": settings.do_query_expansion})


# ---------------------------------------------------------------------------------------------- tokens
@dataclass
class Markers:
    """The ids ColBERT puts into a text's tokens."""

    query: int | None  # None: no marker ("" as the prefix)
    document: int | None
    expansion: int  # [MASK]: the query augmentation
    skiplist: list[int]


def _vocab_id(tokenizer, token: str) -> int | None:
    return getattr(tokenizer, "vocab", {}).get(token)


def folder_markers(folder: Path, settings: ColbertSettings) -> dict[str, int]:
    """The marker tokens a ColBERT folder's tokenizer files hold as added tokens (`tokenizer_config.json`'s
    `added_tokens_decoder`, as `transformers` writes them): token -> id."""
    config = _json(Path(folder) / "tokenizer_config.json")
    decoder = config.get("added_tokens_decoder") if isinstance(config, dict) else None
    wanted = {settings.query_prefix, settings.document_prefix} - {""}
    out = {}
    for key, entry in (decoder or {}).items():
        if isinstance(entry, dict) and entry.get("content") in wanted:
            try:
                out[entry["content"]] = int(key)
            except ValueError:
                raise BertlabError(f"{folder}/tokenizer_config.json: added token id {key!r} is not a number") from None
    return out


def add_markers(tokenizer, settings: ColbertSettings, folder: str | Path | None = None) -> list[str]:
    """Give the tokenizer the marker tokens: at the ids the folder's tokenizer files give them, else appended
    to the vocabulary (PyLate adds them the same way); returns those appended anew."""
    for token, i in sorted(folder_markers(Path(folder), settings).items() if folder else [], key=lambda kv: kv[1]):
        if _vocab_id(tokenizer, token) is None:
            if i != len(getattr(tokenizer, "ids_to_tokens", ())):
                raise BertlabError(f"{folder}/tokenizer_config.json: the marker {token!r} has id {i}; the vocabulary "
                                   f"ends at {len(tokenizer) - 1}, so it would not follow it")
            tokenizer.vocab[token] = i
            tokenizer.ids_to_tokens.append(token)
    added = []
    for token in (settings.query_prefix, settings.document_prefix):
        if token and _vocab_id(tokenizer, token) is None:
            if not isinstance(getattr(tokenizer, "vocab", None), dict) or not isinstance(
                    getattr(tokenizer, "ids_to_tokens", None), list):
                raise BertlabError(f"this tokenizer ({type(tokenizer).__name__}) cannot take new tokens; give marker "
                                   "prefixes that are tokens of its vocabulary")
            tokenizer.vocab[token] = len(tokenizer.ids_to_tokens)
            tokenizer.ids_to_tokens.append(token)
            added.append(token)
    return added


def resize_embeddings(encoder: nn.Module, size: int) -> None:
    """Grow the encoder's word-embedding table to `size` rows, the new rows at the mean of the old ones."""
    old = encoder.config.vocab_size
    if size <= old:
        return
    table = next((m for m in encoder.modules() if isinstance(m, nn.Embedding) and m.num_embeddings == old), None)
    if table is None:
        raise BertlabError(f"no word-embedding table of {old} rows in this encoder to add the marker tokens to")
    with torch.no_grad():
        weight = table.weight
        grown = torch.cat([weight, weight.mean(0, keepdim=True).expand(size - old, -1)])
    table.weight = nn.Parameter(grown)
    table.num_embeddings = size
    encoder.config.vocab_size = size


def markers(tokenizer, settings: ColbertSettings) -> Markers:
    ids = []
    for name in ("query_prefix", "document_prefix"):
        token = getattr(settings, name)
        if token and _vocab_id(tokenizer, token) is None:
            raise BertlabError(f"the {name.replace('_', ' ')} {token!r} is not a token of the vocabulary")
        ids.append(_vocab_id(tokenizer, token) if token else None)
    if tokenizer.mask_token_id is None:
        raise BertlabError("ColBERT's query augmentation pads with the mask token; this tokenizer has none")
    skiplist = [tokenizer.convert_tokens_to_ids(w) for w in settings.skiplist_words]
    if not settings.skip_unknown:
        skiplist = [i for i, w in zip(skiplist, settings.skiplist_words)
                    if i != tokenizer.unk_token_id or w == tokenizer.unk_token]
    return Markers(ids[0], ids[1], tokenizer.mask_token_id, skiplist)


def _with_marker(ids: list[int], marker: int | None) -> list[int]:
    return ids if marker is None else [ids[0], marker, *ids[1:]]


@dataclass
class Rows:
    """Tokenized texts of one kind: ids, how many leading positions attend, which positions give a vector."""

    ids: list[list[int]]
    attended: list[int]
    kept: list[list[bool]]


def tokenize(tokenizer, texts: Sequence[str], kind: str, settings: ColbertSettings, marks: Markers,
             where=None) -> Rows:
    """`texts` as ColBERT reads them as queries or documents (see the module docstring)."""
    if kind not in TEXT_KINDS:
        raise BertlabError(f"unknown text kind {kind!r}; expected query or document")
    query = kind == "query"
    marker = marks.query if query else marks.document
    length = settings.query_length if query else settings.document_length
    out = Rows([], [], [])
    if not texts:
        return out
    enc = encode(tokenizer, list(texts), length - (marker is not None), where=where)
    skip = set(marks.skiplist)
    for ids in enc.input_ids:
        ids = _with_marker(list(ids), marker)
        real = len(ids)
        if query and settings.do_query_expansion:
            ids += [marks.expansion] * (length - real)
            out.attended.append(len(ids) if settings.attend_to_expansion_tokens else real)
            out.kept.append([True] * len(ids))
        else:
            out.attended.append(real)
            out.kept.append([True] * real if query else [t not in skip for t in ids])
        out.ids.append(ids)
    return out


def batch_inputs(rows: Rows, index: Sequence[int], device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """One batch of `rows` as model inputs: ids (padding 0), attention mask, token types, `kept` (bool)."""
    ids = [rows.ids[i] for i in index]
    width = max(map(len, ids))
    attended = torch.tensor([rows.attended[i] for i in index])
    positions = torch.arange(width)[None, :]
    kept = length_buckets.pad_rows([[int(k) for k in rows.kept[i]] for i in index], 0, width).bool()
    input_ids = length_buckets.pad_rows(ids, 0, width)
    return {"input_ids": input_ids.to(device), "attention_mask": (positions < attended[:, None]).long().to(device),
            "token_type_ids": torch.zeros_like(input_ids).to(device), "kept": kept.to(device)}


# ---------------------------------------------------------------------------------------------- the model
class ColbertModel(nn.Module):
    """An encoder and ColBERT's projection: a batch's inputs -> (B, T, dim) fp32 L2-normalised token vectors."""

    def __init__(self, encoder: nn.Module, dim: int, weight: torch.Tensor | None = None):
        super().__init__()
        self.encoder = encoder
        self.linear = nn.Linear(encoder.config.hidden_size, dim, bias=False)
        if weight is not None:
            if tuple(weight.shape) != (dim, encoder.config.hidden_size):
                raise BertlabError(f"the projection is {tuple(weight.shape)}; the encoder needs "
                                   f"({dim}, {encoder.config.hidden_size})")
            with torch.no_grad():
                self.linear.weight.copy_(weight)

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        mask = inputs["attention_mask"]
        # Positions that do not attend but give a vector (the query's [MASK]s) must be computed as a dense
        # encoder computes them: asking for every layer's output keeps the encoder from skipping padding.
        every_position = bool((inputs["kept"] & ~mask.bool()).any())
        out = self.encoder(input_ids=inputs["input_ids"], attention_mask=mask,
                           token_type_ids=inputs["token_type_ids"], output_hidden_states=every_position)
        return nn.functional.normalize(self.linear(out.last_hidden_state).float(), dim=-1)


def maxsim(queries: Sequence[torch.Tensor], documents: Sequence[torch.Tensor]) -> torch.Tensor:
    """(Q, D) MaxSim scores of every query against every document, each a (tokens, dim) tensor."""
    q = nn.utils.rnn.pad_sequence([t.float() for t in queries], batch_first=True)  # zero rows add 0
    d = nn.utils.rnn.pad_sequence([t.float() for t in documents], batch_first=True)
    lengths = torch.tensor([len(t) for t in documents])
    valid = torch.arange(d.shape[1])[None, :] < lengths[:, None]
    return padded_maxsim(q, d, valid)


def padded_maxsim(q: torch.Tensor, d: torch.Tensor, d_valid: torch.Tensor) -> torch.Tensor:
    """(A, B) MaxSim of (A, S, dim) queries (dropped vectors as zero rows) and (B, T, dim) documents whose
    vectors `d_valid` (B, T) keeps; no document may keep none."""
    sims = torch.einsum("ash,bth->abst", q, d)
    sims = sims.masked_fill(~d_valid[None, :, None, :], float("-inf"))
    return sims.amax(-1).sum(-1)


# ---------------------------------------------------------------------------------------------- inference
@dataclass
class Ragged:
    """Many texts' vectors: one (total, dim) array and offsets, text i's rows offsets[i]:offsets[i + 1]."""

    vectors: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.vectors[self.offsets[i]:self.offsets[i + 1]]


class ColbertEmbedder:
    """Queries or documents -> their token vectors, with a loaded ColBERT model and its tokenizer."""

    def __init__(self, model: ColbertModel, tokenizer, settings: ColbertSettings,
                 options: InferenceOptions | None = None):
        self.model, self.tokenizer, self.settings = model, tokenizer, settings
        self.options = options or InferenceOptions()
        self.markers = markers(tokenizer, settings)
        self.device = next(model.parameters()).device

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, options: InferenceOptions | None = None) -> "ColbertEmbedder":
        options = options or InferenceOptions()
        if options.engine != "bertlab":
            raise BertlabError(f"--pooling colbert runs on bertlab's engine, not {options.engine}")
        settings = read_colbert_settings(model_dir)
        encoder = load_encoder(Path(model_dir), options)
        model = ColbertModel(encoder, settings.dim, read_projection(model_dir))
        model = model.to(device=options.device, dtype=options.torch_dtype).eval()
        model.linear.weight.requires_grad_(False)
        tokenizer = load_tokenizer(Path(model_dir), settings.marker_tokens())
        if add_markers(tokenizer, settings, model_dir):
            raise BertlabError(f"{model_dir}: its tokenizer files lack the marker tokens "
                               f"{settings.query_prefix!r} / {settings.document_prefix!r}")
        return cls(model, tokenizer, settings, options)

    @property
    def dim(self) -> int:
        return self.settings.dim

    def embed(self, texts: Sequence[str], kind: str = "document", where=None) -> list[np.ndarray]:
        """Each text's (tokens, dim) float32 vectors: a query's `query_length`, a document's kept tokens."""
        rows = tokenize(self.tokenizer, texts, kind, self.settings, self.markers, where=where)
        out: list[np.ndarray] = [None] * len(texts)  # type: ignore[list-item]
        for batch in length_buckets.plan_batches([len(r) for r in rows.ids], self.options.max_tokens,
                                                 self.options.max_batch, max_waste=self.options.max_waste):
            for i, vectors in zip(batch, self._forward(rows, batch)):
                out[i] = vectors
        return out

    @torch.inference_mode()
    def _forward(self, rows: Rows, batch: list[int]) -> list[np.ndarray]:
        inputs = batch_inputs(rows, batch, self.device)
        vectors = self.model(inputs).cpu()
        kept = inputs["kept"].cpu()
        return [v[k].numpy() for v, k in zip(vectors, kept)]


class RaggedNpzWriter:
    """Streams texts' vectors into an `.npz` -- `vectors` (total, dim) in `dtype`, `offsets` (N + 1), `kind`[,
    `ids`] -- holding one chunk in memory: the vectors go to a `.npy` beside it first, then are copied into the
    archive (stored, not compressed, as `numpy.savez` writes it); the file appears whole or not at all."""

    def __init__(self, path: str | Path, dim: int, dtype: str = "float32"):
        from .outputs import NpyWriter

        self.path = Path(path)
        self.vectors_path = self.path.with_name(f".{self.path.name}.vectors.npy")
        self.vectors = NpyWriter(self.vectors_path, (dim,), np.dtype(dtype).str)
        self.lengths: list[int] = []

    def write(self, arrays: Sequence[np.ndarray]) -> None:
        for a in arrays:
            self.vectors.write(a)
            self.lengths.append(len(a))

    def close(self, ids: list | None = None, kind: str = "document") -> None:
        import io
        import zipfile

        self.vectors.close()
        offsets = np.zeros(len(self.lengths) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum(self.lengths)
        extras = {"offsets": offsets, "kind": np.array(kind)}
        if ids is not None:
            extras["ids"] = np.array([str(i) for i in ids])
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
                z.write(self.vectors_path, "vectors.npy")
                for name, array in extras.items():
                    buf = io.BytesIO()
                    np.save(buf, array)
                    z.writestr(f"{name}.npy", buf.getvalue())
            tmp.replace(self.path)
        finally:
            tmp.unlink(missing_ok=True)
            self.vectors_path.unlink(missing_ok=True)

    def abort(self) -> None:
        self.vectors.abort()
        self.vectors_path.unlink(missing_ok=True)


def read_npz(path: str | Path) -> tuple[Ragged, list[str] | None]:
    """An `.npz` of `RaggedNpzWriter` (float32 in memory) and its ids, if any."""
    with np.load(path) as z:
        ids = z["ids"].tolist() if "ids" in z.files else None
        return Ragged(z["vectors"].astype(np.float32), z["offsets"]), ids
