"""Make the TensorFlow checkpoint fixtures in tests/data/tf_ckpt/ with real TensorFlow (run once, by hand).

The fixtures are committed; CI never needs TensorFlow. To regenerate them:

    python3 -m venv /tmp/tfenv && /tmp/tfenv/bin/pip install tensorflow-cpu
    /tmp/tfenv/bin/python tests/data/make_tf_ckpt.py tests/data/tf_ckpt

It writes, with TensorFlow's own `tf.compat.v1.train.Saver` (the writer Google's BERT code used):
  * `bert_model.ckpt.{index,data-00000-of-00001}`: a tiny BERT (vocab 99, hidden 32, 2 layers, 4 heads,
    FFN 37) under Google's variable names (`bert/encoder/layer_0/attention/self/query/kernel`, ...), with the
    pre-training heads (`cls/predictions/...`, `cls/seq_relationship/...`), `global_step`, and AdamWeightDecay
    slots (`.../adam_m`, `.../adam_v`) for a few variables (all of them would triple the fixture's size for
    no extra coverage);
  * `bert_config.json` and `vocab.txt` beside it, as in Google's release folders;
  * `expected.npz`: every tensor of that checkpoint by its TensorFlow name, as numpy wrote it;
  * `dtypes.ckpt.*` + `dtypes_expected.npz`: odd dtypes for the format reader (float16, bfloat16, float64,
    int8/16/32/64, uint8, bool, a string tensor, a scalar, an empty tensor). bfloat16 values are stored in the
    .npz as float32 (exact: every bfloat16 is a float32), under the same name.
"""

import json
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data/tf_ckpt")
OUT.mkdir(parents=True, exist_ok=True)
CONFIG = {
    "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 32,
    "initializer_range": 0.02, "intermediate_size": 37, "max_position_embeddings": 40, "num_attention_heads": 4,
    "num_hidden_layers": 2, "type_vocab_size": 2, "vocab_size": 99,
}
rng = np.random.default_rng(20181011)  # BERT's arXiv date


def bert_variables(c):
    """Google's modeling.py variable names and shapes (kernels are [in, out])."""
    H, I, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    shapes = {
        "bert/embeddings/word_embeddings": [V, H],
        "bert/embeddings/token_type_embeddings": [c["type_vocab_size"], H],
        "bert/embeddings/position_embeddings": [c["max_position_embeddings"], H],
        "bert/embeddings/LayerNorm/beta": [H],
        "bert/embeddings/LayerNorm/gamma": [H],
    }
    for i in range(c["num_hidden_layers"]):
        p = f"bert/encoder/layer_{i}"
        for name in ("attention/self/query", "attention/self/key", "attention/self/value", "attention/output/dense"):
            shapes[f"{p}/{name}/kernel"] = [H, H]
            shapes[f"{p}/{name}/bias"] = [H]
        shapes[f"{p}/attention/output/LayerNorm/beta"] = [H]
        shapes[f"{p}/attention/output/LayerNorm/gamma"] = [H]
        shapes[f"{p}/intermediate/dense/kernel"] = [H, I]
        shapes[f"{p}/intermediate/dense/bias"] = [I]
        shapes[f"{p}/output/dense/kernel"] = [I, H]
        shapes[f"{p}/output/dense/bias"] = [H]
        shapes[f"{p}/output/LayerNorm/beta"] = [H]
        shapes[f"{p}/output/LayerNorm/gamma"] = [H]
    shapes.update({
        "bert/pooler/dense/kernel": [H, H],
        "bert/pooler/dense/bias": [H],
        "cls/predictions/transform/dense/kernel": [H, H],
        "cls/predictions/transform/dense/bias": [H],
        "cls/predictions/transform/LayerNorm/beta": [H],
        "cls/predictions/transform/LayerNorm/gamma": [H],
        "cls/predictions/output_bias": [V],
        "cls/seq_relationship/output_weights": [2, H],  # [out, in]: Google wrote this one by hand, untransposed
        "cls/seq_relationship/output_bias": [2],
    })
    values = {}
    for name, shape in shapes.items():
        if name.endswith("gamma"):
            values[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            values[name] = (0.2 * rng.standard_normal(shape)).astype(np.float32)
    return values


def save(prefix, values, dtypes):
    graph = tf.Graph()
    with graph.as_default():
        variables = {}
        for name, value in values.items():
            variables[name] = tf.compat.v1.get_variable(name, initializer=tf.constant(value, dtype=dtypes[name]))
        saver = tf.compat.v1.train.Saver(var_list=variables)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.save(sess, str(prefix), write_meta_graph=False, write_state=False)


# ---------------------------------------------------------------------------------------- the tiny BERT
bert = bert_variables(CONFIG)
values = dict(bert)
for name in ("bert/embeddings/LayerNorm/gamma", "bert/pooler/dense/kernel", "cls/seq_relationship/output_bias"):
    values[f"{name}/adam_m"] = (0.01 * rng.standard_normal(bert[name].shape)).astype(np.float32)
    values[f"{name}/adam_v"] = (0.001 * rng.random(bert[name].shape)).astype(np.float32)
values["global_step"] = np.array(1234, dtype=np.int64)
dtypes = {k: (tf.int64 if k == "global_step" else tf.float32) for k in values}
save(OUT / "bert_model.ckpt", values, dtypes)
np.savez(OUT / "expected.npz", **values)
(OUT / "bert_config.json").write_text(json.dumps(CONFIG, indent=2, sort_keys=True) + "\n")
vocab = ["[PAD]"] + [f"[unused{i}]" for i in range(4)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
vocab += [chr(c) for c in range(ord("a"), ord("z") + 1)] + [f"##{chr(c)}" for c in range(ord("a"), ord("z") + 1)]
vocab += ["the", "of", "and", "to", "in", "is", "it", "that", "was", "for", "on", "with", "as", "he", "she",
          "they", "we", "you", "bert", "model", "text", "word", "piece", "mask", "##ness", "##ed", "##ing", "##ly",
          "##er", "##est", "un", "##able", "re", "##tion", "pre", "train"]
vocab += [f"[unused{i}]" for i in range(4, 4 + CONFIG["vocab_size"] - len(vocab))]
assert len(vocab) == CONFIG["vocab_size"] == len(set(vocab)), len(vocab)
(OUT / "vocab.txt").write_text("\n".join(vocab) + "\n")

# ---------------------------------------------------------------------------------------- odd dtypes
odd = {
    "float16": (rng.standard_normal((3, 5)).astype(np.float16), tf.float16),
    "bfloat16": (rng.standard_normal((4, 3)).astype(np.float32), tf.bfloat16),
    "float64": (rng.standard_normal((2, 2, 2)), tf.float64),
    "int8": (rng.integers(-128, 128, (7,)).astype(np.int8), tf.int8),
    "int16": (rng.integers(-2**15, 2**15, (3, 2)).astype(np.int16), tf.int16),
    "int32": (rng.integers(-2**31, 2**31, (2, 3)).astype(np.int32), tf.int32),
    "int64": (rng.integers(-2**62, 2**62, (5,)).astype(np.int64), tf.int64),
    "uint8": (rng.integers(0, 256, (9,)).astype(np.uint8), tf.uint8),
    "bool": (rng.random((2, 3)) > 0.5, tf.bool),
    "scalar": (np.array(3.25, dtype=np.float32), tf.float32),
    "empty": (np.zeros((0, 4), dtype=np.float32), tf.float32),
    "string": (np.array([b"hello", b"", "w\u00f6rld".encode(), b"x" * 200], dtype=object), tf.string),
    "nested/scope/name": (np.arange(6, dtype=np.float32).reshape(2, 3), tf.float32),
}
odd_values = {k: v for k, (v, _) in odd.items()}
save(OUT / "dtypes.ckpt", odd_values, {k: d for k, (_, d) in odd.items()})
# What TensorFlow will read back: bfloat16 rounded; stored as float32.
expected = {}
reader = tf.train.load_checkpoint(str(OUT / "dtypes.ckpt"))
for k in odd_values:
    t = reader.get_tensor(k)
    expected[k] = t.astype(np.float32) if k == "bfloat16" else t
    if k == "string":
        expected[k] = np.array([bytes(s) for s in t.reshape(-1)], dtype=object)
np.savez(OUT / "dtypes_expected.npz", **{k: v for k, v in expected.items() if k != "string"},
         string=np.array([s for s in expected["string"]], dtype="S"))
print("wrote", sorted(p.name for p in OUT.iterdir()))
print("tf", tf.__version__)
