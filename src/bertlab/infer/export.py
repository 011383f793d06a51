"""Export a model for deployment elsewhere: ONNX (with an optional int8 copy) and the sentence-transformers folder.

    export_onnx(model_dir, out, quantize=None)
        out/model.onnx            the encoder (inputs input_ids, attention_mask, token_type_ids; output
                                  last_hidden_state) or, for a fine-tuned model, its head (output logits);
                                  batch and sequence length dynamic
        out/model_int8.onnx       with quantize="int8": ONNX Runtime's dynamic int8 quantisation of it
                                  (int8 weights with per-channel scales, activations quantised per call)
        out/config.json, vocab.txt, tokenizer_config.json   to tokenize for it
    Checked before anything is written: ONNX Runtime's outputs on sample sentences of two batch shapes (one
    padded, one not) within 1e-4 of PyTorch's; the int8 copy's cosine to fp32 is measured and reported.

    export_sentence_transformers(model_dir, out, pooling=None, normalize=None)
        the folder `SentenceTransformer(out)` loads: the encoder in the Hugging Face layout, modules.json
        (Transformer -> Pooling [-> Normalize]), 1_Pooling/config.json with the pooling the model was used with
        (the one given, else its own sentence-transformers config, else mean), sentence_bert_config.json with
        its length limit, config_sentence_transformers.json with the folder's prompts and similarity function
        (`st_folder.write_settings`). Normalize: as given, else as the folder's pipeline (a folder without
        one: normalised). With pooling="splade" (or a folder saved as one): the `SparseEncoder(out)` folder instead
        -- the masked-LM model, MLMTransformer -> SpladePooling (max, ReLU), dot product (`sparse.py`).

The ONNX graph is traced (torch.onnx's TorchScript exporter) from the plain fp32 model (no oneDNN packing) on
a padded example batch, so the attention-mask path is the one recorded: it is correct for unpadded batches
too, and the parity check runs one. (The dynamo exporter stops at the encoder's "no padding, no mask" branch,
which depends on the data.) onnx and onnxruntime are imported only here, with a one-line error when missing
(`pip install 'bertlab-paper[export]'`). Outputs are built in a temporary folder and renamed into place, so a failed
export leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch

from ..core.errors import BertlabError, OutputError, is_write_failure, output_error
from .length_buckets import model_inputs
from .embeddings import POOLINGS, l2_normalize, model_pooling
from .runtime import (InferenceOptions, check_model_dir, length_limit, load_encoder, load_head, load_model,
                      load_tokenizer)

log = logging.getLogger(__name__)

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
PARITY_ATOL = 1e-4
OPSET = 17
# Sentences of varied length for the parity check and the int8 measurement.
SAMPLE_TEXTS = (
    "A man is eating food.",
    "The new movie is awesome, and everyone who saw it says so.",
    "Paris is the capital of France.",
    "how do i reset my password",
    "The quick brown fox jumps over the lazy dog near the river bank on a sunny afternoon.",
    "Stocks fell sharply on Monday after the central bank raised interest rates again.",
    "She plays the violin.",
    "Photosynthesis converts light energy into chemical energy stored in glucose molecules.",
    "ok",
    "The committee will meet next week to discuss the budget, the schedule and the new hires.",
    "Where is the nearest train station?",
    "Neural networks learn representations of their inputs layer by layer.",
)


@dataclass
class ExportReport:
    """What was written and how it was checked."""

    out: Path
    files: list[str]
    checks: dict[str, Any] = field(default_factory=dict)

    def lines(self) -> list[str]:
        checks = ", ".join(f"{k} {v}" for k, v in self.checks.items())
        return [f"wrote {self.out}: {', '.join(self.files)}"] + ([f"checked: {checks}"] if checks else [])


def require(modules: tuple[str, ...], what: str, extra: str = "export") -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise BertlabError(f"{what} needs {' and '.join(missing)}: pip install 'bertlab-paper[{extra}]'")


def _new_folder(out: Path) -> Path:
    """A temporary folder beside `out`, refused when `out` already holds files."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BertlabError(f"{out}: already exists and is not an empty folder; choose a new output folder")
    if not out.parent.is_dir():
        raise BertlabError(f"{out}: the folder {out.parent} does not exist")
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
    except OSError as e:  # a read-only or full OUT's parent: named as the folder the user gave, not the hidden one
        raise output_error(out, e) from None
    return tmp


def failed_export(error: BaseException, tmp: Path, out: Path) -> NoReturn:
    """Every exporter's `except BaseException as e:` -- `tmp` removed, then `error` raised again, except that a
    failure to write anything under `tmp` becomes `OUT: cannot write (disk full)`, naming the folder the user
    gave (the hidden temporary one means nothing to them)."""
    shutil.rmtree(tmp, ignore_errors=True)
    if isinstance(error, Exception) and not isinstance(error, BertlabError) and is_write_failure(error, tmp):
        raise output_error(out, error) from None
    raise error


def write_failure_without_errno(error: Exception, what: str, out: Path, folder: Path, need: int) -> BertlabError:
    """A C++ writer's failure that carries no errno (OpenVINO's `basic_ios::clear: iostream error`): disk full
    when `folder` has less room than `need` bytes, else the writer's first line -- one line either way."""
    free = shutil.disk_usage(folder).free
    if free < need:
        return OutputError(f"{out}: cannot write (disk full: {free:,} bytes free; {what} needs about {need:,})")
    first = (str(error).strip().splitlines() or [""])[0]
    return BertlabError(f"{out}: {what} failed ({type(error).__name__}: {first[:200]})")


def _finish(tmp: Path, out: Path) -> list[str]:
    if out.is_dir():
        out.rmdir()  # empty (checked in _new_folder)
    os.replace(tmp, out)
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())


# ---------------------------------------------------------------------------------------------- the model
@dataclass
class Exportable:
    """The model to export, as a module `(input_ids, attention_mask, token_type_ids) -> one tensor`."""

    module: torch.nn.Module
    output: str  # last_hidden_state | logits
    model: Any  # the loaded bertlab model
    tokenizer: Any
    max_length: int


class _Traced(torch.nn.Module):
    def __init__(self, model, pick: Callable[[Any], torch.Tensor]):
        super().__init__()
        self.model, self.pick = model, pick

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.pick(self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids))


def load_exportable(model_dir: Path) -> Exportable:
    """The folder's fine-tuned head when it has a predictable one (output `logits`), else its encoder."""
    from .predict import find_head

    # the plain graph: oneDNN's packed operators and bertlab's CPU attention kernels do not export
    options = InferenceOptions(packed_linear=False, cpu_attention=False)
    head = find_head(model_dir)
    tokenizer = load_tokenizer(model_dir)
    if head is not None:
        model = load_model(head.model_class, model_dir, options, head_prefix=head.prefix, purpose="export")
        module, output = _Traced(model, head.logits), "logits"
    else:
        model = load_encoder(model_dir, options)
        module, output = _Traced(model, lambda out: out.last_hidden_state), "last_hidden_state"
    return Exportable(module.eval(), output, model, tokenizer,
                      length_limit(model_dir, model.config, tokenizer, None))


def _sample_batches(tokenizer, max_length: int) -> list[dict[str, torch.Tensor]]:
    """Two batches of different shapes: the sample sentences padded, and four rows of one length (no mask)."""
    rows = tokenizer(list(SAMPLE_TEXTS), truncation=True, max_length=max_length)["input_ids"]
    same = [r[:5] + [r[-1]] for r in rows if len(r) >= 6][:4]
    return [model_inputs(rows), model_inputs(same)]


# ---------------------------------------------------------------------------------------------- ONNX
def export_onnx(model_dir: str | Path, out: str | Path, quantize: str | None = None) -> ExportReport:
    require(("onnx", "onnxruntime"), "bertlab export onnx")
    model_dir, out = check_model_dir(Path(model_dir)), Path(out)
    if quantize not in (None, "int8"):
        raise BertlabError(f"--quantize must be int8, got {quantize!r}")
    exportable = load_exportable(model_dir)
    tmp = _new_folder(out)
    try:
        onnx_path = tmp / "model.onnx"
        example = _sample_batches(exportable.tokenizer, exportable.max_length)[0]
        args = tuple(example[k] for k in INPUT_NAMES)
        with torch.inference_mode():
            rank = exportable.module(*args).dim()  # (B, K) per sequence, (B, T, ...) per token
        axes = {name: {0: "batch", 1: "sequence"} for name in INPUT_NAMES}
        axes[exportable.output] = {0: "batch", 1: "sequence"} if rank >= 3 else {0: "batch"}
        with warnings.catch_warnings(), torch.no_grad():
            # The tracer warns about each Python branch on a tensor; the padded example takes the masked path,
            # which is right for every input (the parity check below runs an unpadded batch too).
            warnings.simplefilter("ignore")
            torch.onnx.export(exportable.module, args, str(onnx_path), dynamo=False, input_names=list(INPUT_NAMES),
                              output_names=[exportable.output], dynamic_axes=axes, opset_version=OPSET)
        checks = {"max_abs_diff_vs_pytorch": _parity(onnx_path, exportable)}
        if quantize == "int8":
            checks.update(_quantize_int8(onnx_path, tmp / "model_int8.onnx", exportable, out))
        config = exportable.model.config.to_dict()
        config["architectures"] = [type(exportable.model).__name__]
        _write_json(tmp / "config.json", config)
        exportable.tokenizer.save_pretrained(tmp)
        files = _finish(tmp, out)
    except BaseException as e:
        failed_export(e, tmp, out)
    return ExportReport(out, files, checks)


def ort_session(path: Path, threads: int | None = None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run_ort(session, batch: dict[str, torch.Tensor]) -> np.ndarray:
    """The graph's output for `batch`, fed the inputs the graph has (a family without token types -- DistilBERT
    -- traces to a graph without `token_type_ids`, as its Hugging Face exports are)."""
    names = {i.name for i in session.get_inputs()}
    return session.run(None, {k: batch[k].numpy() for k in INPUT_NAMES if k in names})[0]


def _parity(onnx_path: Path, exportable: Exportable) -> float:
    session = ort_session(onnx_path)
    return check_against_pytorch(lambda batch: run_ort(session, batch), exportable, "ONNX export: ONNX Runtime")


def check_against_pytorch(run: Callable[[dict[str, torch.Tensor]], np.ndarray], exportable: Exportable, what: str,
                          atol: float = PARITY_ATOL) -> float:
    """The largest difference between `run(batch)` and PyTorch's output on the sample batches (padding positions
    left out); an error naming `what` when it is over `atol`."""
    worst = 0.0
    for batch in _sample_batches(exportable.tokenizer, exportable.max_length):
        with torch.inference_mode():
            expected = exportable.module(*(batch[k] for k in INPUT_NAMES)).float().numpy()
        got = np.asarray(run(batch))
        if got.shape != expected.shape:
            raise BertlabError(f"{what}: output of shape {got.shape} for a batch of shape "
                               f"{tuple(batch['input_ids'].shape)}, PyTorch gives {expected.shape}")
        if exportable.output == "last_hidden_state":  # padding positions are not part of the answer
            keep = batch["attention_mask"].numpy().astype(bool)
            got, expected = got[keep], expected[keep]
        worst = max(worst, float(np.abs(got - expected).max()))
    if worst > atol:
        raise BertlabError(f"{what} differs from PyTorch by {worst:.2e} (more than {atol:g}); nothing written")
    return float(f"{worst:.2e}")


def _vectors(output: np.ndarray, batch: dict[str, torch.Tensor], kind: str) -> np.ndarray:
    """One vector per row to compare: mean-pooled hidden states, or the logits."""
    if kind == "logits":
        return output.reshape(output.shape[0], -1)
    mask = batch["attention_mask"].numpy()[..., None].astype(np.float32)
    return (output * mask).sum(1) / mask.sum(1)


@contextlib.contextmanager
def _temporary_files_in(folder: Path) -> Iterator[None]:
    """Python's temporary files (ONNX Runtime's quantiser writes a copy of the model there for shape
    inference) go into `folder`, the export's own temporary folder: on the disk the user chose, removed with
    it, and never a second full-size copy in /tmp."""
    folder.mkdir(exist_ok=True)
    previous, tempfile.tempdir = tempfile.tempdir, str(folder)
    try:
        yield
    finally:
        tempfile.tempdir = previous
        shutil.rmtree(folder, ignore_errors=True)


class _QuantiserLog(logging.Filter):
    """What ONNX Runtime's quantiser logs through the root logger while it runs -- a line per tensor it quantizes,
    a multi-line warning per integer tensor it cannot (a ModernBERT export's local-attention block shapes: ~30 lines
    a layer), and advice to pre-process the graph -- kept off the console (errors pass); the tensors it left are
    counted for one line after (`left`)."""

    def __init__(self):
        super().__init__()
        self.left = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        self.left += "unsupported type to quantize" in record.getMessage()
        return False


def _quantize_int8(fp32_path: Path, int8_path: Path, exportable: Exportable, out: Path) -> dict[str, float]:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # Per-channel weight scales: per-tensor ones measured a sentence-embedding cosine to fp32 of 0.85 at worst
    # on all-MiniLM-L6-v2's samples, per-channel 0.96 (mean 0.96 -> 0.99).
    quiet = _QuantiserLog()
    logging.root.addFilter(quiet)
    try:
        with _temporary_files_in(fp32_path.parent / ".quantize"):
            quantize_dynamic(str(fp32_path), str(int8_path), weight_type=QuantType.QInt8, per_channel=True)
        fp32, int8 = ort_session(fp32_path), ort_session(int8_path)
    except Exception as e:
        # The quantiser's shape inference (C++) writes its side file without reporting a short write; on a full
        # disk the failure surfaces as a protobuf DecodeError reading it back, or ONNX Runtime refusing the file.
        if is_write_failure(e, fp32_path.parent):
            raise output_error(out, e) from None
        free = shutil.disk_usage(fp32_path.parent).free
        if free < 2 * fp32_path.stat().st_size:  # less room than the side file and the int8 model need
            raise OutputError(f"{out}: cannot write (disk full: {free:,} bytes free; ONNX Runtime's int8 "
                              "quantisation could not read back the files it wrote)") from None
        first = (str(e).strip().splitlines() or [""])[0]
        raise BertlabError(f"{out}: ONNX Runtime's int8 quantisation failed ({type(e).__name__}: "
                           f"{first[:200]})") from None
    finally:
        logging.root.removeFilter(quiet)
    if quiet.left:
        log.info("%s: int8: %d integer tensors left as they are (shape arithmetic: nothing to quantize)", out,
                 quiet.left)
    batch = _sample_batches(exportable.tokenizer, exportable.max_length)[0]
    a = _vectors(run_ort(fp32, batch), batch, exportable.output)
    b = _vectors(run_ort(int8, batch), batch, exportable.output)
    cos = (l2_normalize(a) * l2_normalize(b)).sum(-1)
    return {"int8_cosine_to_fp32_min": round(float(cos.min()), 5), "int8_cosine_to_fp32_mean": round(float(cos.mean()), 5)}


# ---------------------------------------------------------------------------------------------- sentence-transformers
def export_sentence_transformers(model_dir: str | Path, out: str | Path, pooling: str | None = None,
                                 normalize: bool | None = None) -> ExportReport:
    """The sentence-transformers folder of the model's encoder (see the module docstring)."""
    from ..checkpoint.pretrained import save_pretrained

    from .sparse import SPARSE_POOLINGS, folder_pooling
    from .st_folder import read_settings, write_settings

    model_dir, out = check_model_dir(Path(model_dir)), Path(out)
    if (pooling or folder_pooling(model_dir)) in SPARSE_POOLINGS:
        return export_sparse_encoder(model_dir, out)
    if pooling is not None and pooling not in POOLINGS:
        raise BertlabError(f"unknown pooling {pooling!r}; expected one of {', '.join(POOLINGS)}")
    declared = model_pooling(model_dir)
    if pooling is not None and declared is not None and pooling != declared:
        log.warning("%s was used with %s pooling; exporting with %s as asked", model_dir, declared, pooling)
    # what the folder already says (prompts, similarity, Matryoshka dimensions, Normalize) is kept unless overridden
    settings = read_settings(model_dir, pooling)
    settings.normalize = settings.normalize if normalize is None else normalize
    encoder = load_encoder(model_dir, InferenceOptions(packed_linear=False, cpu_attention=False))
    tokenizer = load_tokenizer(model_dir)
    limit = length_limit(model_dir, encoder.config, tokenizer, None)
    tmp = _new_folder(out)
    try:
        folder = tmp / "model"
        save_pretrained(encoder, folder)
        tokenizer.save_pretrained(folder)
        write_settings(folder, settings, encoder.config.hidden_size, limit)
        files = _finish(folder, out)
        tmp.rmdir()
    except BaseException as e:
        failed_export(e, tmp, out)
    return ExportReport(out, files, {"pooling": settings.pooling, "normalize": settings.normalize,
                                     "max_seq_length": limit})


def export_sparse_encoder(model_dir: Path, out: Path) -> ExportReport:
    """The sentence-transformers SparseEncoder folder of the model's masked-LM head (refused without its weights)."""
    from ..checkpoint.pretrained import save_pretrained
    from .embeddings import folder_prompts
    from .sparse import write_sparse_encoder_files

    options = InferenceOptions(packed_linear=False, cpu_attention=False)
    model = load_head("masked-lm", model_dir, options, purpose="a SPLADE (SparseEncoder) export")
    tokenizer = load_tokenizer(model_dir)
    limit = length_limit(model_dir, model.config, tokenizer, None)
    prompts = folder_prompts(model_dir)
    tmp = _new_folder(out)
    try:
        folder = tmp / "model"
        save_pretrained(model, folder)
        tokenizer.save_pretrained(folder)
        write_sparse_encoder_files(folder, int(model.config.vocab_size), limit, prompts.get("query", ""),
                                   prompts.get("document", ""))
        files = _finish(folder, out)
        tmp.rmdir()
    except BaseException as e:
        failed_export(e, tmp, out)
    return ExportReport(out, files, {"pooling": "splade", "max_seq_length": limit})


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


# format name -> exporter(model_dir, out, **options)
# (OpenVINO and CTranslate2: `engines.ENGINE_EXPORTERS`, beside their runners)
EXPORTERS: dict[str, Callable[..., ExportReport]] = {"onnx": export_onnx,
                                                     "sentence-transformers": export_sentence_transformers}
