"""Google's TensorFlow checkpoints without TensorFlow: the format (tf_checkpoint.py), the name map and the
conversion both ways (convert.py, `bertlab convert`).

The fixtures in tests/data/tf_ckpt/ were written once by real TensorFlow (tests/data/make_tf_ckpt.py) together
with the values it was given (expected.npz); scripts/check_tf_reads_ours.py checks, by hand where TensorFlow is
installed, that TensorFlow reads what our writer writes.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bertlab import BertConfig, BertForPreTraining, BertForQuestionAnswering, BertForSequenceClassification, BertModel
from bertlab.cli import main as cli_main
from bertlab.models.bert.convert import (convert_tf_to_hf, export_tf_checkpoint, hf_to_tf_name, is_optimizer_state,
                             read_tf_state_dict, tf_to_hf_name)
from bertlab.core.errors import CheckpointError
from bertlab.models.bert.heads import model_classes
from bertlab.tf_checkpoint import (TFCheckpointReader, _crc_bytes, _read_table, _write_table, crc32c, mask_crc,
                                   resolve_prefix, unmask_crc, write_tf_checkpoint)

FIXTURES = Path(__file__).resolve().parents[2] / "data" / "tf_ckpt"
BERT = FIXTURES / "bert_model.ckpt"
DTYPES_CKPT = FIXTURES / "dtypes.ckpt"
DATA_SUFFIX = ".data-00000-of-00001"


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "expected.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def config() -> BertConfig:
    return BertConfig.from_json_file(FIXTURES / "bert_config.json")


@pytest.fixture
def ckpt_copy(tmp_path) -> Path:
    """A private copy of the tiny-BERT fixture folder, to damage."""
    folder = tmp_path / "google"
    folder.mkdir()
    for f in FIXTURES.iterdir():
        if f.name.startswith("bert_") or f.name == "vocab.txt":
            shutil.copy(f, folder / f.name)
    return folder


def _inputs(config, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (2, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    types = torch.zeros_like(ids)
    types[:, 5:] = 1
    return ids, mask, types


# ============================================================================================ CRC-32C
def test_crc32c_known_values():
    assert crc32c(b"123456789") == 0xE3069283  # the CRC catalogue's check value
    assert crc32c(b"") == 0
    # RFC 3720 (iSCSI), appendix B.4
    assert crc32c(bytes(32)) == 0x8A9136AA
    assert crc32c(b"\xff" * 32) == 0x62A8AB43
    assert crc32c(bytes(range(32))) == 0x46DD794E
    assert crc32c(bytes(range(31, -1, -1))) == 0x113FDB5C
    assert mask_crc(0) == 0xA282EAD8 and unmask_crc(mask_crc(0xE3069283)) == 0xE3069283


@pytest.mark.parametrize("n", [1023, 1024, 1025, 4099, 65536 + 7, 300_001, (1 << 21) + 13])
def test_crc32c_vectorized_matches_the_byte_loop(n):
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
    assert crc32c(data) == _crc_bytes(0xFFFFFFFF, data) ^ 0xFFFFFFFF
    cut = n // 3
    assert crc32c(data[cut:], crc32c(data[:cut])) == crc32c(data)  # Extend, as TF chains it
    assert crc32c(np.frombuffer(data, dtype=np.uint8)) == crc32c(data)


# ============================================================================================ reading real TF output
def test_reads_every_tensor_tensorflow_wrote(expected):
    with TFCheckpointReader(BERT) as ckpt:
        assert sorted(ckpt.names()) == sorted(expected)
        for name, want in expected.items():
            got = ckpt.read(name)
            assert got.dtype == want.dtype and got.shape == want.shape, name
            np.testing.assert_array_equal(got, want, err_msg=name)
        assert ckpt.entries["global_step"].dtype_name == "int64" and int(ckpt.read("global_step")) == 1234
        assert ckpt.entries["bert/encoder/layer_1/intermediate/dense/kernel"].shape == (32, 37)


def test_reads_odd_dtypes_tensorflow_wrote():
    with np.load(FIXTURES / "dtypes_expected.npz") as z:
        want = {k: z[k] for k in z.files}
    with TFCheckpointReader(DTYPES_CKPT) as ckpt:
        assert sorted(ckpt.names()) == sorted(want)
        dtypes = {n: e.dtype_name for n, e in ckpt.entries.items()}
        assert dtypes["bfloat16"] == "bfloat16" and dtypes["float16"] == "float16" and dtypes["string"] == "string"
        for name in want:
            got = ckpt.read(name)
            if name == "string":
                got = got.astype("S")
            assert got.dtype == want[name].dtype and got.shape == want[name].shape, name
            np.testing.assert_array_equal(got, want[name], err_msg=name)
        assert ckpt.read("scalar").shape == () and ckpt.read("empty").shape == (0, 4)
        assert ckpt.read("string")[2].decode() == "w\u00f6rld"


@pytest.mark.parametrize("prefix", [BERT, DTYPES_CKPT])
def test_writer_reproduces_tensorflows_files_byte_for_byte(tmp_path, prefix):
    with TFCheckpointReader(prefix) as ckpt:
        order = sorted(ckpt.names(), key=lambda n: ckpt.entries[n].offset)  # TF's data order
        bf16 = [n for n in order if ckpt.entries[n].dtype_name == "bfloat16"]
        write_tf_checkpoint(tmp_path / "ours", ((n, ckpt.read(n)) for n in order), bfloat16=bf16)
    assert (tmp_path / "ours.index").read_bytes() == Path(f"{prefix}.index").read_bytes()
    assert (tmp_path / f"ours{DATA_SUFFIX}").read_bytes() == Path(f"{prefix}{DATA_SUFFIX}").read_bytes()


def test_multi_block_index_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    tensors = {f"bert/encoder/layer_{i}/attention/self/{p}/kernel": rng.standard_normal((3, 2)).astype(np.float32)
               for i in range(40) for p in ("query", "key", "value")}
    tensors["\u00fcnicode/name"] = np.arange(3, dtype=np.int64)
    write_tf_checkpoint(tmp_path / "m", tensors, block_size=200)
    index = tmp_path / "m.index"
    # more than one data block, and every index key separates its block from the next one
    data = index.read_bytes()
    from bertlab.tf_checkpoint import _block_entries, _read_block, _read_varint
    footer = data[-48:]
    pos = _read_varint(footer, _read_varint(footer, 0)[1])[1]
    off, pos = _read_varint(footer, pos)
    size, _ = _read_varint(footer, pos)
    separators = list(_block_entries(_read_block(data, off, size, index, "index"), index, "index"))
    assert len(separators) > 5
    keys = [k for k, _ in _read_table(index)]
    assert keys == sorted(keys) and len(keys) == len(tensors) + 1
    with TFCheckpointReader(tmp_path / "m") as ckpt:
        for name, value in tensors.items():
            np.testing.assert_array_equal(ckpt.read(name), value)
    assert _write_table(_read_table(index), block_size=200) == data


def test_resolve_prefix_accepts_every_way_of_pointing(tmp_path, ckpt_copy):
    prefix = ckpt_copy / "bert_model.ckpt"
    for path in (prefix, ckpt_copy, Path(f"{prefix}.index"), Path(f"{prefix}{DATA_SUFFIX}")):
        assert resolve_prefix(path) == prefix
    (ckpt_copy / "checkpoint").write_text('model_checkpoint_path: "bert_model.ckpt"\n')
    assert resolve_prefix(ckpt_copy) == prefix
    with pytest.raises(CheckpointError, match="no TensorFlow checkpoint"):
        resolve_prefix(tmp_path / "nothing")


# ============================================================================================ damage
def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def test_corrupted_data_shard_names_file_and_tensor(ckpt_copy):
    name = "bert/encoder/layer_1/output/dense/kernel"
    with TFCheckpointReader(ckpt_copy / "bert_model.ckpt") as ckpt:
        entry = ckpt.entries[name]
    data_file = ckpt_copy / f"bert_model.ckpt{DATA_SUFFIX}"
    _flip(data_file, entry.offset + entry.size // 2)
    with TFCheckpointReader(ckpt_copy) as ckpt:
        with pytest.raises(CheckpointError) as e:
            ckpt.read(name)
        ckpt.read("bert/pooler/dense/kernel")  # the others are fine
    msg = str(e.value)
    assert str(data_file) in msg and repr(name) in msg and "checksum mismatch" in msg and "\n" not in msg
    with pytest.raises(CheckpointError, match=re.escape(name)):
        BertForPreTraining.from_pretrained(ckpt_copy)


def test_truncated_data_shard_names_file_and_tensor(ckpt_copy):
    data_file = ckpt_copy / f"bert_model.ckpt{DATA_SUFFIX}"
    data_file.write_bytes(data_file.read_bytes()[:5000])
    with TFCheckpointReader(ckpt_copy) as ckpt:
        cut = [n for n, e in ckpt.entries.items() if e.offset + e.size > 5000]
        with pytest.raises(CheckpointError, match=rf"{re.escape(str(data_file))}: truncated: tensor '{cut[0]}'"):
            ckpt.read(cut[0])
    data_file.unlink()
    with pytest.raises(CheckpointError, match="cannot open data shard"):
        read_tf_state_dict(ckpt_copy)


def test_corrupt_or_truncated_index_is_one_clear_line(ckpt_copy):
    index = ckpt_copy / "bert_model.ckpt.index"
    good = index.read_bytes()
    _flip(index, 300)  # inside the data block of entries
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(index))}: corrupt index: data block .* CRC-32C"):
        TFCheckpointReader(ckpt_copy)
    index.write_bytes(good[:-20])
    with pytest.raises(CheckpointError, match="not a TensorFlow checkpoint index"):
        TFCheckpointReader(ckpt_copy)
    index.write_bytes(b"")
    with pytest.raises(CheckpointError, match="not a TensorFlow checkpoint index"):
        TFCheckpointReader(ckpt_copy)


def test_garbage_entries_fail_as_value_errors_only():
    """Whatever bytes an index entry holds, parsing ends in a value or a ValueError (turned into a one-line
    CheckpointError by the reader), never in another exception."""
    from bertlab.tf_checkpoint import TensorEntry

    good = TensorEntry("x", 1, (3, 0, 7), offset=5, size=84, crc32c=123).serialize()
    assert TensorEntry.parse("x", good) == TensorEntry("x", 1, (3, 0, 7), offset=5, size=84, crc32c=123)
    rng = np.random.default_rng(0)
    samples = [good[:i] for i in range(len(good))] + [rng.bytes(int(rng.integers(1, 40))) for _ in range(500)]
    for i in range(len(good)):
        damaged = bytearray(good)
        damaged[i] ^= 0xFF
        samples.append(bytes(damaged))
    for buf in samples:
        try:
            TensorEntry.parse("x", buf)
        except ValueError:
            pass


def test_cli_reports_damage_as_one_line_and_status_2(ckpt_copy, tmp_path, capsys):
    data_file = ckpt_copy / f"bert_model.ckpt{DATA_SUFFIX}"
    _flip(data_file, 100)
    assert cli_main(["convert", str(ckpt_copy), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bertlab convert: error: ") and "checksum mismatch" in err and "\n" not in err
    assert not (tmp_path / "out").exists()  # nothing half-written


# ============================================================================================ the name map
def test_name_map_covers_google_layout(expected, config):
    mapped = {}
    for tf_name, value in expected.items():
        m = tf_to_hf_name(tf_name)
        if m is None:
            assert tf_name == "global_step" or tf_name.endswith(("/adam_m", "/adam_v"))
            continue
        mapped[m[0]] = (tf_name, m[1])
    model = BertForPreTraining(config)
    want = {k for k in model.state_dict() if k not in model.tied_weight_keys}
    assert set(mapped) == want
    assert mapped["bert.encoder.layer.0.attention.self.query.weight"] == (
        "bert/encoder/layer_0/attention/self/query/kernel", True)
    assert mapped["cls.seq_relationship.weight"] == ("cls/seq_relationship/output_weights", False)  # [2, H] as is
    assert mapped["cls.predictions.bias"] == ("cls/predictions/output_bias", False)
    assert mapped["bert.embeddings.LayerNorm.weight"] == ("bert/embeddings/LayerNorm/gamma", False)
    assert tf_to_hf_name("output_weights") == ("classifier.weight", False)
    assert tf_to_hf_name("cls/squad/output_bias") == ("qa_outputs.bias", False)
    for skipped in ("global_step", "bert/pooler/dense/kernel/adam_m", "output_bias/adam_v",
                    "bert/embeddings/word_embeddings/Adam_1", "beta1_power"):
        assert is_optimizer_state(skipped) and tf_to_hf_name(skipped) is None
    assert tf_to_hf_name("bert/encoder/layer_0/attention/self/query/gamma") == (
        "bert/encoder/layer_0/attention/self/query/gamma", False)  # unknown: passed through, to be reported


def test_name_map_inverts_for_every_model_class(config):
    for cls in model_classes().values():
        model = cls(config)
        for key in model.state_dict():
            if key in model.tied_weight_keys:
                continue
            tf_name, transpose = hf_to_tf_name(key)
            back, back_transpose = tf_to_hf_name(tf_name)
            assert back.removeprefix("bert.") == key.removeprefix("bert.") and back_transpose == transpose, key


# ============================================================================================ loading and parity
def _load_google_arrays_by_hand(hf_model, arrays):
    """What transformers' own (now removed, TensorFlow-bound) `load_tf_weights_in_bert` did: walk the TF scope
    path attribute by attribute, kernel/gamma/output_weights -> weight (kernels transposed), beta/output_bias ->
    bias. Written here independently of bertlab's map, so the parity test below checks that map."""
    for name, array in arrays.items():
        parts = name.split("/")
        if any(p in ("adam_m", "adam_v", "global_step") for p in parts):
            continue
        pointer = hf_model
        for part in parts:
            m = re.fullmatch(r"layer_(\d+)", part)
            if m:
                pointer = pointer.layer[int(m[1])]
            elif part in ("kernel", "gamma", "output_weights"):
                pointer = pointer.weight
            elif part in ("beta", "output_bias"):
                pointer = pointer.bias
            else:
                pointer = getattr(pointer, part)
        if parts[-1].endswith("_embeddings"):
            pointer = pointer.weight
        value = torch.from_numpy(array.T.copy() if parts[-1] == "kernel" else array)
        assert tuple(pointer.shape) == tuple(value.shape), name
        with torch.no_grad():
            pointer.copy_(value)


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("convert") / "hf"
    assert cli_main(["convert", str(BERT), "--config", str(FIXTURES / "bert_config.json"), "--vocab",
                     str(FIXTURES / "vocab.txt"), "--out", str(out)]) == 0
    return out


def test_convert_writes_the_hugging_face_layout(converted, expected):
    assert sorted(p.name for p in converted.iterdir()) == ["config.json", "model.safetensors", "vocab.txt"]
    model = BertForPreTraining.from_pretrained(converted)
    assert model.config.vocab_size == 99 and model.config.hidden_size == 32
    q = model.bert.encoder.layer[1].attention.self.query.weight
    np.testing.assert_array_equal(q.detach().numpy(), expected["bert/encoder/layer_1/attention/self/query/kernel"].T)
    np.testing.assert_array_equal(model.cls.seq_relationship.weight.detach().numpy(),
                                  expected["cls/seq_relationship/output_weights"])


def test_outputs_match_transformers(converted, expected, config):
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.BertConfig(**{k: v for k, v in config.to_dict().items() if k != "extra"})
    by_hand = transformers.BertForPreTraining(hf_config).eval()
    _load_google_arrays_by_hand(by_hand, expected)
    theirs = transformers.BertForPreTraining.from_pretrained(converted).eval()  # transformers reads our output
    ours = BertForPreTraining.from_pretrained(converted)
    from_tf_folder = BertForPreTraining.from_pretrained(FIXTURES)  # the from_pretrained hook, no conversion
    ids, mask, types = _inputs(config)
    with torch.no_grad():
        ref = by_hand(input_ids=ids, attention_mask=mask, token_type_ids=types)
        for model in (theirs,):
            out = model(input_ids=ids, attention_mask=mask, token_type_ids=types)
            torch.testing.assert_close(out.prediction_logits, ref.prediction_logits, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(out.seq_relationship_logits, ref.seq_relationship_logits, rtol=1e-5, atol=1e-5)
        for model in (ours, from_tf_folder):
            out = model(ids, attention_mask=mask, token_type_ids=types)
            torch.testing.assert_close(out.prediction_logits, ref.prediction_logits, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(out.seq_relationship_logits, ref.seq_relationship_logits, rtol=1e-5, atol=1e-5)


def test_from_pretrained_on_a_google_folder(expected):
    model, report = BertModel.from_pretrained(FIXTURES, return_report=True)
    assert not report.initialized and all(k.startswith("cls.") for k in report.unused) and len(report.unused) == 7
    np.testing.assert_array_equal(model.embeddings.word_embeddings.weight.detach().numpy(),
                                  expected["bert/embeddings/word_embeddings"])
    state = read_tf_state_dict(FIXTURES / "bert_model.ckpt.index")
    assert "cls.predictions.bias" in state and not any("adam" in k or "step" in k for k in state)


def test_streaming_load_keeps_ties_and_initialises_missing_heads(expected, config):
    from bertlab.models.bert.convert import load_tf_weights

    model, report, skipped = load_tf_weights(BertForPreTraining, config, BERT)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert not report.initialized and len(skipped) == 7
    # a classifier on top of the pre-trained encoder: the new layer is initialised N(0, σ) (TaskOutputLayer),
    # not left with whatever memory the meta-device load allocated
    clf, report, _ = load_tf_weights(BertForSequenceClassification, config, BERT)
    assert sorted(report.initialized) == ["classifier.bias", "classifier.weight"]
    assert torch.all(clf.classifier.bias == 0) and clf.classifier.weight.abs().max() <= 6 * config.initializer_range
    assert config.initializer_range / 2 < clf.classifier.weight.std() < 2 * config.initializer_range
    np.testing.assert_array_equal(clf.bert.pooler.dense.weight.detach().numpy(),
                                  expected["bert/pooler/dense/kernel"].T)


def test_unknown_variable_is_reported_by_its_tensorflow_name(tmp_path, expected):
    tensors = {k: v for k, v in expected.items()}
    tensors["bert/encoder/layer_0/attention/self/rotary/kernel"] = np.zeros((2, 2), np.float32)
    write_tf_checkpoint(tmp_path / "bert_model.ckpt", tensors)
    shutil.copy(FIXTURES / "bert_config.json", tmp_path)
    with pytest.raises(CheckpointError, match="unexpected keys: bert/encoder/layer_0/attention/self/rotary/kernel"):
        convert_tf_to_hf(tmp_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _encoder_only(expected):
    return {k: v for k, v in expected.items() if k.startswith("bert/") and not is_optimizer_state(k)}


def test_run_classifier_and_run_squad_heads(tmp_path, expected, config):
    rng = np.random.default_rng(3)
    cls_dir, squad_dir = tmp_path / "mnli", tmp_path / "squad"
    for folder in (cls_dir, squad_dir):
        folder.mkdir()
        shutil.copy(FIXTURES / "bert_config.json", folder)
    w, b = rng.standard_normal((3, 32)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    write_tf_checkpoint(cls_dir / "bert_model.ckpt", {**_encoder_only(expected), "output_weights": w,
                                                       "output_bias": b, "output_weights/adam_m": w})
    qw, qb = rng.standard_normal((2, 32)).astype(np.float32), rng.standard_normal(2).astype(np.float32)
    write_tf_checkpoint(squad_dir / "bert_model.ckpt", {**_encoder_only(expected), "cls/squad/output_weights": qw,
                                                         "cls/squad/output_bias": qb})
    summary = convert_tf_to_hf(cls_dir, tmp_path / "mnli_hf")
    assert summary["model_class"] == "BertForSequenceClassification" and summary["skipped_optimizer_tensors"] == 1
    clf = BertForSequenceClassification.from_pretrained(tmp_path / "mnli_hf")
    assert clf.config.num_labels == 3
    encoder = BertModel.from_pretrained(tmp_path / "mnli_hf")
    ids, mask, types = _inputs(config)
    with torch.no_grad():
        pooled = encoder(ids, attention_mask=mask, token_type_ids=types).pooler_output
        torch.testing.assert_close(clf(ids, attention_mask=mask, token_type_ids=types).logits,
                                   pooled @ torch.from_numpy(w).T + torch.from_numpy(b))
    summary = convert_tf_to_hf(squad_dir, tmp_path / "squad_hf")
    assert summary["model_class"] == "BertForQuestionAnswering" and summary["unused"][0].startswith("pooler.")
    qa = BertForQuestionAnswering.from_pretrained(tmp_path / "squad_hf")
    np.testing.assert_array_equal(qa.qa_outputs.weight.detach().numpy(), qw)


# ============================================================================================ --to tf
def test_export_round_trip_gives_back_googles_tensors(converted, tmp_path, expected):
    out = tmp_path / "tf"
    assert cli_main(["convert", str(converted), "--to", "tf", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["bert_config.json", "bert_model.ckpt.data-00000-of-00001",
                                                     "bert_model.ckpt.index", "vocab.txt"]
    assert (out / "bert_config.json").read_text() == (FIXTURES / "bert_config.json").read_text()
    with TFCheckpointReader(out) as ckpt:
        want = {k: v for k, v in expected.items() if not is_optimizer_state(k)}
        assert sorted(ckpt.names()) == sorted(want)
        for name, value in want.items():
            got = ckpt.read(name)
            assert got.dtype == value.dtype
            np.testing.assert_array_equal(got, value, err_msg=name)
    # and back again: the same model
    again = convert_tf_to_hf(out, tmp_path / "hf2")
    assert again["model_class"] == "BertForPreTraining"
    a, b = read_tf_state_dict(out), read_tf_state_dict(BERT)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_export_bfloat16_model(tmp_path, config):
    model = BertModel(config).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "bf16")
    export_tf_checkpoint(tmp_path / "bf16", tmp_path / "tf")
    with TFCheckpointReader(tmp_path / "tf") as ckpt:
        assert {e.dtype_name for e in ckpt.entries.values()} == {"bfloat16"}
        np.testing.assert_array_equal(ckpt.read("bert/pooler/dense/kernel"),
                                      model.pooler.dense.weight.detach().float().numpy().T)


def test_checkpoint_reads_tensorflow_names_only_through_the_family_hook(tmp_path):
    """`checkpoint/` knows no family's variable names: BERT's classes hand it Google's map
    (`read_tf_checkpoint`); without a hook a TensorFlow checkpoint is one line, never BERT's names guessed."""
    from bertlab.checkpoint.hf_layout import read_state_dict
    from bertlab.models.bert.modeling import BertPreTrainedModel

    index = FIXTURES / "bert_model.ckpt.index"
    ours = read_state_dict(index, BertPreTrainedModel.read_tf_checkpoint)
    assert ours.keys() == read_tf_state_dict(index).keys()
    with pytest.raises(CheckpointError, match="a TensorFlow checkpoint, which this model family does not read"):
        read_state_dict(index)
