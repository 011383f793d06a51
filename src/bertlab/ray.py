"""Embeddings and predictions over Ray Data, for programs already in Ray: `bertlab.ray.embed(dataset,
model=...)` and `bertlab.ray.predict(dataset, model=...)` return Ray Datasets; `read_output(folder)` reads what
`bertlab embed --ray` wrote. The work is `bertlab.infer.ray_data`'s; Ray itself is imported only when called.
"""

from .infer.ray_data import embed, predict, read_output

__all__ = ["embed", "predict", "read_output"]
