"""The toy family: a bag-of-words encoder (token embeddings, one feed-forward layer, no attention) with a
text-classification head. It shares no model code with BERT: it proves that recipes, tasks and inference
reach a family only through its `FAMILY` (config class, encoder, heads, tokenizer)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.checkpoint import load_pretrained, save_pretrained
from bertlab.core.jsonconfig import JsonConfig
from bertlab.models.family import Family
from bertlab.models.heads import HeadOutput, HeadRegistry, TaskOutputLayer
from bertlab.tokenizer import BertTokenizer


@dataclass
class ToyConfig(JsonConfig):
    vocab_size: int = 50
    hidden_size: int = 16
    max_position_embeddings: int = 64
    initializer_range: float = 0.02
    num_hidden_layers: int = 1
    pad_token_id: int = 0
    id2label: dict | None = None
    extra: dict = field(default_factory=dict)

    config_files = ("config.json",)

    @property
    def num_labels(self) -> int:
        return len(self.id2label) if self.id2label else 2

    @classmethod
    def from_dict(cls, data, source="config"):
        data = dict(data)
        known = {k: data.pop(k) for k in list(data) if k in cls.__dataclass_fields__ and k != "extra"}
        if known.get("id2label"):
            known["id2label"] = {int(k): v for k, v in known["id2label"].items()}
        return cls(**known, extra=data)

    def to_dict(self):
        data = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "extra"}
        return {**self.extra, **data, "model_type": "toy"}


@dataclass
class ToyOutput:
    last_hidden_state: torch.Tensor
    pooler_output: torch.Tensor | None = None


class ToyPreTrainedModel(nn.Module):
    config_class = ToyConfig
    base_model_prefix = "toy"
    base_model_parts = ("embed.", "ffn.")
    optional_base_parts = ()
    ignored_checkpoint_keys = ()
    tied_weight_keys = ()

    def __init__(self, config):
        super().__init__()
        self.config = config

    def init_weights(self, module=None):
        for m in (module or self).modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=self.config.initializer_range)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)

    @classmethod
    def from_pretrained(cls, path, config=None, **kwargs):
        return load_pretrained(cls, path, config=config, **kwargs)

    def save_pretrained(self, path, vocab_file=None):
        save_pretrained(self, path, vocab_file=vocab_file)


class ToyModel(ToyPreTrainedModel):
    """h_t = tanh(W e_t + b): each token on its own, no attention."""

    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.ffn = nn.Linear(config.hidden_size, config.hidden_size)
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, **_):
        return ToyOutput(torch.tanh(self.ffn(self.embed(input_ids))))  # (B, T, H)


HEADS = HeadRegistry()


@HEADS.register("text-classification", output=HeadOutput, prefix="classifier.", soft_target="classes")
class ToyForSequenceClassification(ToyPreTrainedModel):
    """logits = W · mean of the real tokens' states + b."""

    def __init__(self, config):
        super().__init__(config)
        self.toy = ToyModel(config)
        self.classifier = TaskOutputLayer(config.hidden_size, config.num_labels)
        self.init_weights(self.classifier)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, **_):
        h = self.toy(input_ids).last_hidden_state
        keep = (attention_mask if attention_mask is not None else torch.ones_like(input_ids))[..., None].float()
        logits = self.classifier((h * keep).sum(1) / keep.sum(1))  # (B, num_labels)
        loss = F.cross_entropy(logits.float(), labels.view(-1)) if labels is not None else None
        return HeadOutput(logits, loss)


FAMILY = Family(model_type="toy", name="Toy", config_class=ToyConfig, base_model=ToyModel, heads=HEADS,
                tokenizer=BertTokenizer.from_pretrained, data_tokenizer="wordpiece")
