"""Google's TensorFlow BERT variables under Hugging Face's parameter names, and a TF checkpoint read as a
state dict -- what `checkpoint.hf_layout.read_state_dict` needs to load Google's files directly, without TensorFlow.
(Conversion both ways, and the inverse map `hf_to_tf_name`, are in `convert.py`.)

Google's `modeling.py` names variables by TensorFlow scope; Hugging Face (and so bertlab) by module path:

    bert/embeddings/word_embeddings                     bert.embeddings.word_embeddings.weight
    bert/embeddings/LayerNorm/gamma | beta              bert.embeddings.LayerNorm.weight | bias
    bert/encoder/layer_3/attention/self/query/kernel    bert.encoder.layer.3.attention.self.query.weight   (T)
    bert/encoder/layer_3/output/dense/bias              bert.encoder.layer.3.output.dense.bias
    bert/pooler/dense/kernel                            bert.pooler.dense.weight                            (T)
    cls/predictions/transform/dense/kernel              cls.predictions.transform.dense.weight              (T)
    cls/predictions/output_bias                         cls.predictions.bias
    cls/seq_relationship/output_weights | output_bias   cls.seq_relationship.weight | bias
    output_weights | output_bias        (run_classifier) classifier.weight | bias
    cls/squad/output_weights | output_bias  (run_squad)  qa_outputs.weight | bias
    sbo/mlp1/dense/kernel, sbo/position_embeddings ...  sbo.mlp1.dense.weight ...   (the span-boundary head,
                                                        bertlab's names: Google released no such model)

(T): `tf.layers.dense` stores its kernel as [in, out]; `nn.Linear.weight` is [out, in], so dense kernels are
transposed. The `output_weights` variables were created by hand in Google's code already as [out, in] and are
not. Optimizer state is skipped. Any other name is passed through as it is, so the checkpoint loader reports
it as an unexpected key, by its TensorFlow name.
"""

from __future__ import annotations

import logging
import os
import re

import numpy as np
import torch

from ...core.errors import CheckpointError
from ...tf_checkpoint import TFCheckpointReader

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------- the name map
# Optimizer state: Google's AdamWeightDecayOptimizer / LAMB slots (`<var>/adam_m`, `<var>/adam_v`), tf.train
# optimizers' slots (`<var>/Adam`, `<var>/Adam_1`, `<var>/Momentum`) and accumulators (`beta1_power`), the step
# counter, and the loss-scale state of mixed-precision (fp16) training.
_OPTIMIZER_STATE = re.compile(
    r"(?:.*/)?(?:global_step|beta[12]_power(?:_\d+)?|loss_scale|good_steps|current_loss_scale)"
    r"|.*/(?:adam_[^/]*|lamb_[^/]*|Adam(?:_\d+)?|Momentum|AdamWeightDecayOptimizer(?:_\d+)?)"
)
_DENSE = (r"bert/encoder/layer_\d+/(?:attention/self/(?:query|key|value)|attention/output/dense|intermediate/dense"
          r"|output/dense)|bert/pooler/dense|cls/predictions/transform/dense|sbo/mlp[12]/dense")
_NORM = r"bert/embeddings/LayerNorm|bert/encoder/layer_\d+/(?:attention/output|output)/LayerNorm" \
        r"|cls/predictions/transform/LayerNorm|sbo/mlp[12]/LayerNorm"
_EMBEDDINGS = r"bert/embeddings/(?:word|position|token_type)_embeddings|sbo/position_embeddings"
TF_HEAD_NAMES = {  # hand-made variables, already [out, in]
    "cls/predictions/output_bias": "cls.predictions.bias",
    "cls/seq_relationship/output_weights": "cls.seq_relationship.weight",
    "cls/seq_relationship/output_bias": "cls.seq_relationship.bias",
    "output_weights": "classifier.weight",
    "output_bias": "classifier.bias",
    "cls/squad/output_weights": "qa_outputs.weight",
    "cls/squad/output_bias": "qa_outputs.bias",
}
TF_HEAD_NAMES_BACK = {v: k for k, v in TF_HEAD_NAMES.items()}


def is_optimizer_state(tf_name: str) -> bool:
    return _OPTIMIZER_STATE.fullmatch(tf_name) is not None


def _module_path(scope: str) -> str:
    """`bert/encoder/layer_3/attention/self/query` -> `bert.encoder.layer.3.attention.self.query`."""
    return re.sub(r"(?<=/)layer_(\d+)(?=/)", r"layer/\1", scope).replace("/", ".")


def tf_to_hf_name(tf_name: str) -> tuple[str, bool] | None:
    """(Hugging Face name, transpose?) for a TensorFlow variable; None for optimizer state (skipped).

    Names that are neither come back unchanged, to be reported as unexpected keys by the loader."""
    if is_optimizer_state(tf_name):
        return None
    if tf_name in TF_HEAD_NAMES:
        return TF_HEAD_NAMES[tf_name], False
    if re.fullmatch(_EMBEDDINGS, tf_name):
        return _module_path(tf_name) + ".weight", False
    m = re.fullmatch(rf"({_DENSE})/(kernel|bias)", tf_name)
    if m:
        return _module_path(m[1]) + (".weight" if m[2] == "kernel" else ".bias"), m[2] == "kernel"
    m = re.fullmatch(rf"({_NORM})/(gamma|beta)", tf_name)
    if m:
        return _module_path(m[1]) + (".weight" if m[2] == "gamma" else ".bias"), False
    return tf_name, False


# ---------------------------------------------------------------------------------------------- TF -> bertlab
def tf_plan(reader: TFCheckpointReader) -> tuple[dict[str, tuple[str, bool]], list[str]]:
    """{Hugging Face name: (TF name, transpose?)} for the checkpoint's model variables, and the skipped names."""
    plan: dict[str, tuple[str, bool]] = {}
    skipped = []
    for tf_name in reader.names():
        mapped = tf_to_hf_name(tf_name)
        if mapped is None:
            skipped.append(tf_name)
        else:
            plan[mapped[0]] = (tf_name, mapped[1])
    if skipped:
        log.info("%s: skipped %d optimizer-state tensors (%s, ...)", reader.prefix, len(skipped), skipped[0])
    return plan, skipped


def tf_to_torch(array: np.ndarray, tf_name: str, source) -> torch.Tensor:
    if array.dtype == object:
        raise CheckpointError(f"{source}: tensor {tf_name!r} holds strings, not weights")
    return torch.from_numpy(np.ascontiguousarray(array))


def read_tf_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every model tensor of a TensorFlow BERT checkpoint, under Hugging Face names, kernels transposed."""
    with TFCheckpointReader(path) as reader:
        plan, _ = tf_plan(reader)
        state = {}
        for hf_name, (tf_name, transpose) in plan.items():
            tensor = tf_to_torch(reader.read(tf_name), tf_name, reader.prefix)
            state[hf_name] = tensor.T.contiguous() if transpose else tensor
        return state


def tf_meta_state(reader: TFCheckpointReader, plan: dict[str, tuple[str, bool]]) -> dict[str, torch.Tensor]:
    """Shape-only stand-ins (no storage) for checking a plan against a model before reading any data."""
    out = {}
    for hf_name, (tf_name, transpose) in plan.items():
        shape = reader.entries[tf_name].shape
        out[hf_name] = torch.empty(shape[::-1] if transpose else shape, device="meta")
    return out
