"""Peer inference engines behind bertlab's own API: `--engine onnxruntime|openvino|ctranslate2`.

bertlab's own runtime (`--engine bertlab`, the default) is the reference. A user who deploys on one of the
engines CPU users choose can run it through the same commands (`embed`, `predict`, `serve`) with the same
tokenizer, length buckets, long-document windows, pooling and outputs: only the encoder's forward pass moves.

    engine        package        precisions            model file (written by `bertlab export ENGINE`)
    onnxruntime   onnxruntime    fp32, int8 (dynamic)  DIR/model.onnx, DIR/model_int8.onnx
    openvino      openvino       fp32, bf16            DIR/openvino/openvino_model.xml (+ .bin)
    ctranslate2   ctranslate2    fp32, int8            DIR/ctranslate2/model.bin  (encoders only: no task heads)

Every encoder family runs on ONNX Runtime and OpenVINO (the export traces the family's own model); CTranslate2
converts the families that list it in their `engines` (BERT, RoBERTa, XLM-R, DistilBERT), and refuses the
others (ALBERT) in one line.

`--model DIR` may be an export folder (the engine's file is used as it is) or any bertlab model folder (the
model is converted for the engine into a temporary folder first, a few seconds, with one log line saying so).
An engine whose package is not installed is refused in one line naming the extra to install.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import nn

from ..core.errors import BertlabError, OutputError
from .runtime import ENGINE_LOADERS, ENGINE_PRECISIONS, check_model_dir, model_family, require_engine

log = logging.getLogger(__name__)

ONNX_FILES = {"fp32": "model.onnx", "int8": "model_int8.onnx"}
OPENVINO_FILE = Path("openvino") / "openvino_model.xml"
CTRANSLATE2_FILE = Path("ctranslate2") / "model.bin"


def _threads(options) -> int:
    return options.threads or torch.get_num_threads()


# ---------------------------------------------------------------------------------------------- runners
# Each runner: (input_ids, attention_mask, token_type_ids) int64 numpy arrays of (B, T) -> one float32 array.
class OnnxRuntimeRunner:
    def __init__(self, path: Path, options):
        from .export import ort_session

        self.session = ort_session(path, _threads(options))
        self.names = [i.name for i in self.session.get_inputs()]

    def __call__(self, ids, mask, types) -> np.ndarray:
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        return self.session.run(None, {k: feeds[k] for k in self.names})[0]


class OpenVinoRunner:
    def __init__(self, path: Path, options):
        import openvino as ov

        core = ov.Core()
        config = {"INFERENCE_PRECISION_HINT": ENGINE_PRECISIONS["openvino"][options.dtype],
                  "INFERENCE_NUM_THREADS": _threads(options), "PERFORMANCE_HINT": "LATENCY"}
        self.model = core.compile_model(core.read_model(str(path)), "CPU", config)
        self.request = self.model.create_infer_request()
        self.names = [i.get_any_name() for i in self.model.inputs]

    def __call__(self, ids, mask, types) -> np.ndarray:
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        result = self.request.infer({k: feeds[k] for k in self.names})
        return np.asarray(result[self.model.outputs[0]])


class CTranslate2Runner:
    def __init__(self, path: Path, options):
        import ctranslate2

        folder = path.parent if path.is_file() else path  # model.bin or its folder
        compute_type = ENGINE_PRECISIONS["ctranslate2"][options.dtype]
        if compute_type not in ctranslate2.get_supported_compute_types("cpu"):  # it would silently use another
            raise BertlabError(f"--engine ctranslate2: this CPU build does not run {compute_type}")
        self.encoder = ctranslate2.Encoder(str(folder), device="cpu", compute_type=compute_type,
                                           intra_threads=_threads(options))

    def __call__(self, ids, mask, types) -> np.ndarray:
        import ctranslate2

        lengths = mask.sum(1).astype(np.int32)
        out = self.encoder.forward_batch(ctranslate2.StorageView.from_array(ids.astype(np.int32)),
                                         ctranslate2.StorageView.from_array(lengths), types.tolist())
        return np.asarray(out.last_hidden_state)


RUNNERS = {"onnxruntime": OnnxRuntimeRunner, "openvino": OpenVinoRunner, "ctranslate2": CTranslate2Runner}


class EngineModel(nn.Module):
    """A peer engine's forward pass in the shape of a bertlab model: called with the tensors
    `length_buckets.model_inputs` makes, it returns an output with the fields the inference code reads (`last_hidden_state`, or the head's
    `logits` / `start_logits` and `end_logits`). Owns the temporary folder of a model converted on load."""

    def __init__(self, runner, config, output: str, engine: str, workdir: tempfile.TemporaryDirectory | None = None):
        super().__init__()
        self.runner, self.config, self.output, self.engine = runner, config, output, engine
        self.num_labels = config.num_labels
        self._workdir = workdir  # removed with the model
        self.anchor = nn.Parameter(torch.empty(0), requires_grad=False)  # `next(model.parameters()).device`: cpu

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, **_: Any):
        ids = input_ids.cpu().numpy()
        mask = np.ones_like(ids) if attention_mask is None else attention_mask.cpu().numpy()
        types = np.zeros_like(ids) if token_type_ids is None else token_type_ids.cpu().numpy()
        out = torch.from_numpy(np.ascontiguousarray(self.runner(ids, mask, types), dtype=np.float32))
        if self.output == "last_hidden_state":
            from ..models.outputs import EncoderOutput

            return EncoderOutput(last_hidden_state=out)
        if self.output == "spans":  # question answering: start and end logits stacked on the last axis
            return SimpleNamespace(start_logits=out[..., 0], end_logits=out[..., 1])
        return SimpleNamespace(logits=out)


def engine_file(engine: str, folder: Path, dtype: str) -> Path:
    if engine == "onnxruntime":
        return folder / ONNX_FILES[dtype]
    return folder / (OPENVINO_FILE if engine == "openvino" else CTRANSLATE2_FILE)


def load_engine_model(cls: type, model_dir: Path, options, head: bool) -> EngineModel:
    """`cls` (a bertlab model class) run by `options.engine`: from the engine's file in `model_dir`, else converted
    into a temporary folder first."""
    engine = options.engine
    require_engine(engine, options.dtype)
    family = model_family(model_dir)
    if engine == "ctranslate2":
        _require_ctranslate2_converter(model_dir, family)
    if head and engine == "ctranslate2":
        raise BertlabError(f"{model_dir}: --engine ctranslate2 runs encoders only (no task heads); "
                           "use --engine onnxruntime, openvino or bertlab for this model")
    from .predict import find_head

    config = family.config_class.from_json_file(model_dir)
    spec = find_head(model_dir)  # the export of a folder with a task head computes its logits
    if head and spec is None:
        raise BertlabError(f"{model_dir}: --engine {engine} runs encoders and fine-tuned task heads, not this model's "
                           "head; use --engine bertlab")
    if not head and spec is not None:
        raise BertlabError(f"{model_dir}: --engine {engine} runs this fine-tuned model's head ({spec.architecture}), "
                           "not its encoder alone; give an encoder folder, or --engine bertlab")
    output = "last_hidden_state" if not head else "spans" if spec.task == "question-answering" else "logits"
    path, workdir = engine_file(engine, model_dir, options.dtype), None
    # an export folder without the file asked for has no weights to convert it from
    if not path.is_file() and engine_file(engine, model_dir, "fp32").is_file():
        raise BertlabError(f"{model_dir}: has {ONNX_FILES['fp32']} but no {path.name}; export it with "
                           "`bertlab export onnx --quantize int8`")
    if not path.is_file():
        workdir = tempfile.TemporaryDirectory(prefix=f"bertlab-{engine}-")
        log.warning("%s: no %s model in the folder; converting it now (`bertlab export %s` once saves this)",
                    model_dir, engine, "onnx" if engine == "onnxruntime" else engine)
        out = Path(workdir.name) / "model"
        EXPORTS[engine](model_dir, out, options.dtype)
        path = engine_file(engine, out, options.dtype)
    return EngineModel(RUNNERS[engine](path, options), config, output, engine, workdir)


# ---------------------------------------------------------------------------------------------- exports
OPENVINO_ATOL = 1e-2


def _engine_options(dtype: str = "fp32"):
    return SimpleNamespace(dtype=dtype, threads=None)


def export_openvino(model_dir: str | Path, out: str | Path):
    """out/openvino/openvino_model.xml (+ .bin): OpenVINO's IR of the ONNX export (fp32 weights; the precision is
    chosen when it is run), checked in OpenVINO at f32 against PyTorch; config and tokenizer beside it."""
    from .export import (
        INPUT_NAMES,
        ExportReport,
        _finish,
        _new_folder,
        check_against_pytorch,
        export_onnx,
        failed_export,
        load_exportable,
        require,
        write_failure_without_errno,
    )

    require(("openvino", "onnx", "onnxruntime"), "bertlab export openvino", extra="openvino")
    import openvino as ov

    model_dir, out = check_model_dir(Path(model_dir)), Path(out)
    tmp = _new_folder(out)
    try:
        try:
            export_onnx(model_dir, tmp / "onnx")
        except OutputError as e:  # it names its own output, a folder inside the hidden temporary one
            raise OutputError(str(e).replace(str(tmp / "onnx"), str(out), 1)) from None
        (tmp / OPENVINO_FILE).parent.mkdir()
        onnx_file = tmp / "onnx" / "model.onnx"
        try:
            ov.save_model(ov.convert_model(str(onnx_file)), str(tmp / OPENVINO_FILE))
        except RuntimeError as e:  # its C++ stream error carries no errno: a full disk said as one
            raise write_failure_without_errno(e, "OpenVINO's IR", out, tmp, onnx_file.stat().st_size) from None
        for name in (tmp / "onnx").iterdir():  # config and tokenizer files
            if name.suffix != ".onnx":
                name.rename(tmp / name.name)
        shutil.rmtree(tmp / "onnx")
        runner = OpenVinoRunner(tmp / OPENVINO_FILE, _engine_options())
        exportable = load_exportable(model_dir)
        # OpenVINO's CPU plugin at f32 still differs by ~3e-3 on MiniLM's hidden states (its own GELU and softmax
        # kernels), against ~1e-6 for ONNX Runtime and CTranslate2: checked to 1e-2 (cosine ~1 - 1e-6).
        diff = check_against_pytorch(lambda b: runner(*(b[k].numpy() for k in INPUT_NAMES)), exportable,
                                     "OpenVINO export: OpenVINO", atol=OPENVINO_ATOL)
        files = _finish(tmp, out)
    except BaseException as e:
        failed_export(e, tmp, out)
    return ExportReport(out, files, {"max_abs_diff_vs_pytorch": diff})


def _require_ctranslate2_converter(model_dir: Path, family) -> None:
    if "ctranslate2" not in family.engines:  # the families whose encoders CTranslate2's converter takes
        raise BertlabError(f"{model_dir}: --engine ctranslate2 has no converter for {family.name} models; use "
                           "--engine onnxruntime or openvino (`bertlab export onnx` or `openvino`), or bertlab")


def export_ctranslate2(model_dir: str | Path, out: str | Path):
    """out/ctranslate2/model.bin: CTranslate2's converted encoder (fp32 weights; int8 or bf16 chosen when run),
    checked in CTranslate2 at float32 against PyTorch; our config and tokenizer beside it. Encoders only:
    CTranslate2 has no BERT task heads."""
    from ..checkpoint.pretrained import save_pretrained
    from .export import (
        INPUT_NAMES,
        ExportReport,
        _finish,
        _new_folder,
        _write_json,
        check_against_pytorch,
        failed_export,
        load_exportable,
        require,
    )
    from .predict import find_head

    require(("ctranslate2", "transformers"), "bertlab export ctranslate2", extra="ctranslate2")
    from ctranslate2.converters import TransformersConverter

    model_dir, out = check_model_dir(Path(model_dir)), Path(out)
    family = model_family(model_dir)
    _require_ctranslate2_converter(model_dir, family)
    if find_head(model_dir) is not None:
        raise BertlabError(f"{model_dir}: CTranslate2 runs encoders only (no task heads); export this model "
                           "with `bertlab export onnx` or `openvino`")
    exportable = load_exportable(model_dir)
    tmp = _new_folder(out)
    try:
        # CTranslate2 converts a Hugging Face folder: ours, written as the family's bare encoder (BertModel,
        # DistilBertModel, ...: the architecture its loaders read)
        hf = tmp / "hf"
        save_pretrained(exportable.model, hf)
        config = json.loads((hf / "config.json").read_text())
        config["architectures"] = [family.base_model.__name__]
        config.setdefault("position_embedding_type", "absolute")  # the converter reads it; ours is always absolute
        _write_json(hf / "config.json", config)
        exportable.tokenizer.save_pretrained(hf)
        previous = logging.root.manager.disable
        logging.disable(logging.WARNING)  # transformers' load messages
        try:
            TransformersConverter(str(hf)).convert(str(tmp / CTRANSLATE2_FILE.parent), quantization=None, force=True)
        finally:
            logging.disable(previous)
        for name in ("config.json",):
            (hf / name).rename(tmp / name)
        exportable.tokenizer.save_pretrained(tmp)
        shutil.rmtree(hf)
        runner = CTranslate2Runner(tmp / CTRANSLATE2_FILE.parent, _engine_options())
        diff = check_against_pytorch(lambda b: runner(*(b[k].numpy() for k in INPUT_NAMES)), exportable,
                                     "CTranslate2 export: CTranslate2")
        files = _finish(tmp, out)
    except BaseException as e:
        failed_export(e, tmp, out)
    return ExportReport(out, files, {"max_abs_diff_vs_pytorch": diff})


def _export_for_onnxruntime(model_dir: Path, out: Path, dtype: str) -> None:
    from .export import export_onnx

    export_onnx(model_dir, out, quantize="int8" if dtype == "int8" else None)


# engine -> its exporter (model_dir, out) -> ExportReport: `bertlab export openvino|ctranslate2`
ENGINE_EXPORTERS = {"openvino": export_openvino, "ctranslate2": export_ctranslate2}
# engine -> (model_dir, out, dtype): the files it runs, written for a model converted on load
EXPORTS = {"onnxruntime": _export_for_onnxruntime,
           **{name: (lambda model_dir, out, dtype, f=f: f(model_dir, out)) for name, f in ENGINE_EXPORTERS.items()}}

for _engine in RUNNERS:
    ENGINE_LOADERS[_engine] = load_engine_model
