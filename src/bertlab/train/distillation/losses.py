"""Distillation's loss terms (Hinton et al., 2015; DistilBERT): the soft-target KL at temperature T and the
hidden-state cosine distance. The terms are combined per recipe by the distillers (`distillers.py`); the
package docstring says which positions and layers each recipe takes them over, and why."""

from __future__ import annotations

import torch
import torch.nn.functional as F

MASKED_LOGIT = -1e4  # a padding position's logit in a softmax over tokens: probability 0, log finite


def distillation_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """T² · mean over rows of KL(p_t ‖ p_s), p = softmax(logits / T) over the last dimension; 0 for no rows."""
    if student_logits.numel() == 0:
        return student_logits.sum() * 0.0  # a zero that keeps the graph
    log_p_s = F.log_softmax(student_logits.float() / temperature, dim=-1)
    log_p_t = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    kl = (log_p_t.exp() * (log_p_t - log_p_s)).sum(-1)  # Σ_v p_t (log p_t − log p_s), one per row
    return temperature ** 2 * kl.mean()


def cosine_distance(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """mean over the kept tokens of 1 − cos(h_s, h_t); `keep` (B, T) is the attention mask. Either side may be
    padded (B, T, H) or already its N real tokens (N, H): a model in training mode runs its layers unpadded (the
    token layout keeps the real tokens in (B, T) row-major order, the order `h[keep]` selects), while the teacher,
    in eval mode, may not."""
    rows = keep.bool()
    n = int(rows.sum())

    def real(h: torch.Tensor) -> torch.Tensor:
        if h.dim() == 2:
            if h.size(0) != n:
                raise ValueError(f"hidden states of {h.size(0)} tokens for an attention mask of {n} real tokens")
            return h
        return h[rows]

    cos = F.cosine_similarity(real(student_hidden).float(), real(teacher_hidden).float(), dim=-1)  # (N,)
    return (1.0 - cos).mean() if cos.numel() else student_hidden.sum() * 0.0



__all__ = ["MASKED_LOGIT", "cosine_distance", "distillation_kl"]
