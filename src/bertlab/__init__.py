"""bertlab: BERT (Devlin et al., 2018) as software -- tokenizer, encoder, pre-training, fine-tuning, serving.

The public API is importable from here: `from bertlab import BertConfig, BertModel, BertTokenizer`.
"""

from .config import BertConfig, preset, preset_names
from .errors import BertlabError, CheckpointError, ConfigError
from .heads import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from .model import BertModel, BertModelOutput
from .tokenizer import BertTokenizer

__version__ = "0.1.0"

__all__ = [
    "BertConfig", "preset", "preset_names", "BertlabError", "CheckpointError", "ConfigError",
    "BertModel", "BertModelOutput", "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification",
    "BertForTokenClassification", "BertForQuestionAnswering", "BertForMultipleChoice", "BertTokenizer",
]
