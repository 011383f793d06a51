"""A BERT-layout model (a distilled student: `BertForPreTraining`, `BertForMaskedLM`, `BertModel`) written as a
DistilBERT: the same numbers under DistilBERT's names and config, so `transformers.DistilBertModel` (and every
tool that knows DistilBERT) loads it.

    embeddings.word_embeddings                  -> distilbert.embeddings.word_embeddings
    embeddings.position_embeddings + type[0]    -> distilbert.embeddings.position_embeddings
    encoder.layer.i.attention.self.query|key|value  -> transformer.layer.i.attention.q_lin|k_lin|v_lin
    encoder.layer.i.attention.output.dense     -> ....attention.out_lin       (.LayerNorm -> .sa_layer_norm)
    encoder.layer.i.intermediate.dense         -> ....ffn.lin1
    encoder.layer.i.output.dense               -> ....ffn.lin2                (.LayerNorm -> .output_layer_norm)
    cls.predictions.transform.dense / LayerNorm / bias -> vocab_transform / vocab_layer_norm / vocab_projector.bias

Token types. DistilBERT has no token type table; BERT adds `token_type_embeddings[type]` to every position
before the embedding LayerNorm. Folding row 0 into every row of the position table is exact for inputs whose
token types are all 0 -- a single text, and every input a DistilBERT tokenizer makes (it returns no token
types). A text pair's second segment, which BERT saw with row 1, gets row 0: the converted model reads a pair
as DistilBERT does, as one sequence with [SEP] between. The conversion therefore goes ahead whatever row 1
holds, and logs how far it is from row 0 (a student trained on pairs with NSP has learned a distinct row 1).

What does not convert: the pooler and the NSP head (DistilBERT has neither; dropped), a task head on the pooler
(DistilBERT's sentence classifier is `pre_classifier` + ReLU on the first token, not tanh on the pooler: no
exact mapping; refused), and a LayerNorm epsilon other than DistilBERT's fixed 1e-12 (refused).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import torch

from ...checkpoint.hf_layout import build_and_load, canonical_state_dict, read_state_dict
from ...checkpoint.pretrained import save_pretrained
from ...core.errors import BertlabError
from ...core.fsio import atomic_directory
from ..bert.config import BertConfig
from .config import DistilBertConfig
from .heads import DistilBertForMaskedLM
from .modeling import DistilBertModel

log = logging.getLogger(__name__)

# BERT's per-layer names -> DistilBERT's
LAYER_NAMES = {
    "attention.self.query": "attention.q_lin", "attention.self.key": "attention.k_lin",
    "attention.self.value": "attention.v_lin", "attention.output.dense": "attention.out_lin",
    "attention.output.LayerNorm": "sa_layer_norm", "intermediate.dense": "ffn.lin1", "output.dense": "ffn.lin2",
    "output.LayerNorm": "output_layer_norm",
}
HEAD_NAMES = {"cls.predictions.transform.dense": "vocab_transform",
              "cls.predictions.transform.LayerNorm": "vocab_layer_norm"}
# Weights a DistilBERT has no place for, dropped
DROPPED = ("pooler.", "cls.seq_relationship.", "cls.predictions.decoder.", "embeddings.token_type_embeddings.")
CONVERTIBLE = ("BertModel", "BertForPreTraining", "BertForMaskedLM")
_BERT_LAYER_KEY = re.compile(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias)")


def distilbert_config(bert: BertConfig) -> DistilBertConfig:
    """The DistilBERT config of a `BertConfig` (same sizes; DistilBERT's default dropouts for its heads)."""
    if bert.layer_norm_eps != DistilBertConfig.layer_norm_eps:
        raise BertlabError(f"layer_norm_eps is {bert.layer_norm_eps:g}; DistilBERT's is fixed at 1e-12, so this model "
                           "cannot be written as a DistilBERT")
    keep = {k: v for k, v in bert.extra.items() if k in ("transformers_version", "dtype", "torch_dtype")}
    return DistilBertConfig(vocab_size=bert.vocab_size, max_position_embeddings=bert.max_position_embeddings,
                            n_layers=bert.num_hidden_layers, n_heads=bert.num_attention_heads, dim=bert.hidden_size,
                            hidden_dim=bert.intermediate_size, dropout=bert.hidden_dropout_prob,
                            attention_dropout=bert.attention_probs_dropout_prob, activation=bert.hidden_act,
                            initializer_range=bert.initializer_range, pad_token_id=bert.pad_token_id,
                            id2label=bert.id2label, extra=keep)


def distilbert_state_dict(state: dict[str, torch.Tensor], source: str = "state") -> dict[str, torch.Tensor]:
    """A BERT-layout state dict (bare or `bert.`-prefixed keys) in DistilBERT's layout; see the module docstring."""
    state = canonical_state_dict(state, source, "bert", ("embeddings.position_ids", "embeddings.token_type_ids"))
    out: dict[str, torch.Tensor] = {}
    has_head = any(k.startswith("cls.predictions.") for k in state)
    for key, tensor in state.items():
        if key.startswith(DROPPED):
            continue
        if key == "embeddings.position_embeddings.weight":
            types = state["embeddings.token_type_embeddings.weight"]
            out["distilbert.embeddings.position_embeddings.weight"] = tensor + types[0]
            if types.shape[0] > 1:
                moved = float((types[1:] - types[0]).norm(dim=-1).max() / types[0].norm().clamp_min(1e-30))
                log.info("%s: token type 0 folded into the positions; the other types' rows differ from it by up to "
                         "%.3g of its norm (a text pair's second segment reads as type 0 in DistilBERT)", source, moved)
        elif key.startswith("embeddings."):
            out[f"distilbert.{key}"] = tensor
        elif (m := _BERT_LAYER_KEY.fullmatch(key)) and m[2] in LAYER_NAMES:
            out[f"distilbert.transformer.layer.{m[1]}.{LAYER_NAMES[m[2]]}.{m[3]}"] = tensor
        elif key.rpartition(".")[0] in HEAD_NAMES:
            module, _, param = key.rpartition(".")
            out[f"{HEAD_NAMES[module]}.{param}"] = tensor
        elif key == "cls.predictions.bias":
            out["vocab_projector.bias"] = tensor
        else:
            raise BertlabError(f"{source}: {key} has no place in a DistilBERT (only an encoder and its masked-LM head "
                               "convert)")
    if not has_head:  # a bare encoder: DistilBertModel's keys, no prefix
        out = {k.removeprefix("distilbert."): v for k, v in out.items()}
    return out


def write_distilbert(source: str | os.PathLike, target: str | os.PathLike | None = None) -> Path:
    """The BERT-layout folder `source` written as a DistilBERT folder at `target` (default: in place), with the
    tokenizer files it has. `DistilBertForMaskedLM` when it has a masked-LM head, else `DistilBertModel`."""
    source = Path(source)
    target = Path(target) if target is not None else source
    bert = BertConfig.from_json_file(source)
    architecture = (bert.extra.get("architectures") or ["BertModel"])[0]
    if architecture not in CONVERTIBLE:
        raise BertlabError(f"{source}: a {architecture} cannot be written as a DistilBERT (convertible: "
                           f"{', '.join(CONVERTIBLE)}: an encoder and its masked-LM head)")
    config = distilbert_config(bert)
    state = distilbert_state_dict(read_state_dict(source, DistilBertModel.read_tf_checkpoint), str(source))
    cls = DistilBertForMaskedLM if "vocab_projector.bias" in state else DistilBertModel
    model, report = build_and_load(cls, config, state, str(source))
    if report.initialized or report.unused:
        raise BertlabError(f"{source}: conversion left weights unmatched: {report.initialized + report.unused}")
    if target == source:
        save_pretrained(model, target)  # atomic; the vocabulary and tokenizer files are carried over
    else:
        with atomic_directory(target) as tmp:
            for f in source.iterdir():
                if f.is_file() and f.name.startswith(("vocab", "tokenizer", "special_tokens")):
                    (tmp / f.name).write_bytes(f.read_bytes())
        save_pretrained(model, target)
    return target
