"""Building blocks shared by the model families, with no knowledge of any model.

    attention.py      one attention function with an explicit seam: mask kind (bidirectional with padding,
                      causal, prefix-LM), an optional additive bias (relative positions), the unpadded token
                      layout, and a kernel chosen by name (eager, sdpa; room for a variable-length kernel)
    token_layout.py   where the real tokens of a padded batch sit: compute position-wise layers on them only
    elementwise.py    activations (also in place), a fast CPU dropout mask, residual adds into a free buffer
    packed_linear.py  CPU inference: linear layers from weights packed once (the C fp32 GEMM, or oneDNN)
    encoder_layer.py  CPU inference: a post-LN encoder block (attention, Add & Norm, GELU FFN) in one C call
    precision.py      precision names (fp32, bf16, fp16) -> torch dtypes, for training and inference alike
    rms_norm.py       RMS layer norm (scale only, statistics in fp32), as T5 uses it
    relative_position.py  T5's log-spaced relative position buckets and the additive attention bias from a table
    adapters.py       bottleneck adapters, LoRA, freezing and gradual unfreezing, by module names

The model files (`model.py`, and the families beside it) read like their papers; the performance machinery
they use lives here, each piece named for what it does.
"""

from .attention import ATTENTION_KERNELS, AttentionMask, attention, register_attention_kernel
from .elementwise import ACTIVATIONS, INPLACE_ACTIVATIONS, Dropout, add_and_norm, add_residual, dropout
from .token_layout import TokenLayout

__all__ = ["ATTENTION_KERNELS", "AttentionMask", "attention", "register_attention_kernel", "ACTIVATIONS",
           "INPLACE_ACTIVATIONS", "Dropout", "add_and_norm", "add_residual", "dropout", "TokenLayout"]
