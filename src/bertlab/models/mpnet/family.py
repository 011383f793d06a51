"""MPNet as a family: what the registry (`models/registry.py`) hands to recipes, tasks and inference."""

from __future__ import annotations

from ..family import Family
from .config import MPNetConfig
from .heads import HEADS
from .modeling import MPNetModel
from .params import PARAMETERS
from .tokenizer import MPNetTokenizer

# Loaded, fine-tuned, embedded, served and exported; not pre-trained here (no `data_tokenizer`: MPNet's own
# objective is permuted language modelling, which bertlab does not have)
FAMILY = Family(model_type="mpnet", name="MPNet", config_class=MPNetConfig, base_model=MPNetModel, heads=HEADS,
                tokenizer=MPNetTokenizer.from_pretrained, parameters=PARAMETERS,
                # q and v are the attention's projections; adapters follow its output projection and the FFN's
                lora_targets=("q", "v"), adapter_layers=r"(attention\.attn\.o|layer\.\d+\.output\.dense)$")
