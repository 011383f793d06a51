"""Helpers for the inference tests (not a test module): a tiny vocabulary and tiny models of every head,
saved in the Hugging Face layout, so every command runs end to end in milliseconds."""

from __future__ import annotations

import string
from pathlib import Path

WORDS = ("the cat sat on mat a dog is good bad paris france capital of what who where city river big small "
         "john lives in london works for acme corp . , ? !").split()


def vocab_tokens() -> list[str]:
    """Google's layout in miniature: [PAD], a few [unused], [UNK] [CLS] [SEP] [MASK], characters, words."""
    chars = list(string.ascii_lowercase + string.digits)
    return (["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + chars + [f"##{c}" for c in chars]
            + [w for w in WORDS if w not in chars])


def write_vocab(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "vocab.txt"
    path.write_text("\n".join(vocab_tokens()) + "\n", encoding="utf-8")
    return path


def tiny_config(**overrides):
    from bertlab import BertConfig

    fields = dict(vocab_size=len(vocab_tokens()), hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                  intermediate_size=37, max_position_embeddings=128, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0)
    fields.update(overrides)
    return BertConfig(**fields)


def tiny_model(folder: Path, cls_name: str = "BertModel", seed: int = 0, **config_overrides) -> Path:
    """A randomly initialised `cls_name` (any bertlab model class) with the tiny vocabulary, saved to `folder`."""
    import torch

    import bertlab

    torch.manual_seed(seed)
    model = getattr(bertlab, cls_name)(tiny_config(**config_overrides))
    vocab = write_vocab(folder.parent / f".{folder.name}-vocab")
    model.save_pretrained(folder, vocab_file=vocab)
    return folder


def one_call_layers(monkeypatch) -> list:
    """The one-call post-LN layers (`nn.encoder_layer`) run from here on, counted; each must be run by the
    kernels, not declined by them after the gate passed it."""
    from bertlab.nn import encoder_layer

    calls, real = [], encoder_layer._post_ln_layer

    def counted(*args):
        out = real(*args)
        assert out is not None, "the kernels declined a layer the gate passed"
        calls.append(1)
        return out

    monkeypatch.setattr(encoder_layer, "_post_ln_layer", counted)
    return calls


def one_call_against_modules(model, layer_class, monkeypatch, threads: int | None = None) -> None:
    """Three passes through `model` -- a batch without a mask, the same with padded rows (an additive mask per row),
    and a shorter single row -- with every block in one call, then again on the modules (`layer_class.in_one_call`
    off): the same bits, and each of the six blocks ran in one call. `threads`: torch's thread count meanwhile."""
    import torch

    if threads is not None:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return one_call_against_modules(model, layer_class, monkeypatch)
        finally:
            torch.set_num_threads(before)

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 40, (3, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    mask[2, 2:] = 0
    calls = one_call_layers(monkeypatch)

    def passes():
        return [model(ids).last_hidden_state, model(ids, attention_mask=mask).last_hidden_state,
                model(ids[:1, :9]).last_hidden_state]

    with torch.inference_mode():
        fused = passes()
        assert len(calls) == 6  # every block of the three passes
        monkeypatch.setattr(layer_class, "in_one_call", lambda self, x, m: None)
        modules = passes()
    for a, b in zip(fused, modules):
        assert torch.equal(a, b)
