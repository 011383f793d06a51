"""ELECTRA's parameter table (`bertlab params`): BERT's blocks on embeddings of width E, projected to H when they
differ; no pooler. ELECTRA-Small (E=128, H=256, L=12) comes to 13.5M in the encoder, the paper's 14M."""

from __future__ import annotations

from ..bert.config import preset_names
from ..bert.params import block_rows, linear, sizes
from ..family import ParameterTable
from .config import ElectraConfig, is_electra_preset


def electra_parameter_table(config: ElectraConfig) -> list[tuple[str, int]]:
    V, E, H, L = config.vocab_size, config.embedding_size, config.hidden_size, config.num_hidden_layers
    embeddings = [("embeddings.word", V * E), ("embeddings.position", config.max_position_embeddings * E),
                  ("embeddings.segment", config.type_vocab_size * E), ("embeddings.layer_norm", 2 * E)]
    project = [("embeddings.project (E -> H)", linear(E, H))] if E != H else []
    one_layer = block_rows(H, config.intermediate_size)
    per_layer = sum(n for _, n in one_layer)
    encoder = sum(n for _, n in embeddings) + sum(n for _, n in project) + L * per_layer
    discriminator = linear(H, H) + linear(H, 1)  # dense, then one score per token
    generator = linear(H, E) + 2 * E + V  # dense to E, LayerNorm, output bias (the matrix is the token table)
    return [*embeddings, ("embeddings.total", sum(n for _, n in embeddings)), *project, *one_layer,
            ("layer.total", per_layer), (f"layers.total (x{L})", L * per_layer),
            ("heads.replaced_token_detection", discriminator), ("heads.masked_lm", generator),
            ("total.encoder (ElectraModel)", encoder),
            ("total.discriminator (ElectraForPreTraining)", encoder + discriminator),
            ("total.generator (ElectraForMaskedLM, this size)", encoder + generator)]


PARAMETERS = ParameterTable(config_class=ElectraConfig, rows=electra_parameter_table, sizes=sizes,
                            is_preset=is_electra_preset,
                            presets=f"small, base, large (ELECTRA's); {', '.join(preset_names()[:2])}, L2-H128 ... "
                                    "(BERT's sizes, E = H)")
