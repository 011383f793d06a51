"""MPNet test helpers (not a test module): a WordPiece vocabulary laid out as MPNet's (`<s> <pad> </s> <unk>`
first, `<mask>` last), random-weight `transformers` folders with `transformers`' own MPNet tokenizer files, and
the masked-LM folder the family harness (tests/test_families.py) runs the commands on."""

from __future__ import annotations

from pathlib import Path

import torch

# dropout off so training-mode numbers compare
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=130, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
# Four topics, chance 0.25; the tiny random encoder reaches past 0.6 from every start tried (seeds 0-3)
END_TO_END = dict(lr=3e-3, epochs=30, min_accuracy=0.5)


def mpnet_vocab(path: Path) -> list[str]:
    """The news tables' words (tests/own_data_support.py) between MPNet's special tokens, as its vocabulary
    orders them; `path` gets it as vocab.txt."""
    from own_data_support import SPECIAL, write_vocab

    words = [w for w in write_vocab(path).read_text().split("\n") if w and w not in SPECIAL]
    tokens = ["<s>", "<pad>", "</s>", "<unk>", "[UNK]", *words, "##s", "##ed", "##ing", "<mask>"]
    path.write_text("\n".join(tokens) + "\n")
    return tokens


def mpnet_folder(folder: Path, architecture: str, seed: int = 0, **config) -> Path:
    """A random-weight `transformers` MPNet of class `architecture` ("MPNetForMaskedLM", ...) with `transformers`'
    MPNet tokenizer saved beside it (tokenizer.json + tokenizer_config.json, as `transformers` 5 writes them)."""
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    tokens = mpnet_vocab(folder.parent / f"{folder.name}-vocab.txt")
    torch.manual_seed(seed)
    hf_config = transformers.MPNetConfig(vocab_size=len(tokens), **{**TINY, **config})
    getattr(transformers, architecture)(hf_config).eval().save_pretrained(folder)
    transformers.MPNetTokenizer(vocab={t: i for i, t in enumerate(tokens)}).save_pretrained(folder)
    return folder


def masked_lm_folder(folder: Path) -> Path:
    """A random MPNetForMaskedLM over the news tables' words."""
    return mpnet_folder(folder, "MPNetForMaskedLM", seed=1)
