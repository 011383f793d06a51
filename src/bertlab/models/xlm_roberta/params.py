"""XLM-R's parameter table (`bertlab params`): RoBERTa's arithmetic on XLM-R's sizes."""

from __future__ import annotations

from ..bert.params import sizes
from ..family import ParameterTable
from ..roberta.params import roberta_parameter_table
from .config import XLMRobertaConfig

PARAMETERS = ParameterTable(config_class=XLMRobertaConfig, rows=roberta_parameter_table, sizes=sizes)
