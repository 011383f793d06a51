"""Loading a model for inference: device, precision, threads, the head a command needs, the length limit.

Every inference command (features, embed, similarity, fill-mask, predict, serve) shares these options and
rules, so they are stated once here:

  * the model runs in eval mode under `torch.inference_mode()` (no autograd bookkeeping at all);
  * `--dtype bf16` casts the whole model to bfloat16 (on CPUs with AVX-512 BF16/AMX and on GPUs the
    matmuls run at twice the fp32 rate); pooling and outputs are computed in fp32; a CPU without native bf16
    runs fp32 instead, said in one line (`resolve_dtype`); `--dtype auto` picks bf16 where it is native;
  * `--dtype int8` (CPU) runs the linear layers as int8 GEMMs, weights per output channel and activations per
    token row (`nn/int8_linear.py`; min cosine to fp32 ≥ 0.99 on all-MiniLM-L6-v2), everything else in fp32;
  * a command that needs a head (fill-mask: the MLM head; predict: the task head) checks that the
    checkpoint has its weights *before* building the model, so a plain encoder folder gives one clear
    line instead of predictions from a randomly initialised layer;
  * texts longer than the limit are truncated with a warning, or rejected (`--on-long reject`);
  * on a CPU (fp32, bf16) the linear layers run from weights packed once (`nn/packed_linear.py`): by
    bertlab's own GEMMs where the CPU has AVX-512 or AVX2 (fp32) or AVX-512 BF16 without AMX (bf16), by oneDNN's
    elsewhere (its AMX kernel for bf16 on AMX; same numbers to ~1e-6 in fp32; `nn/cpu_kernels.cpu_isa` is the one
    dispatch); `--no-packed-linear` keeps plain `nn.Linear` (neither bertlab's GEMMs nor oneDNN's).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..core.errors import BertlabError
from ..core.host_memory import retain_freed_memory, trim_heap
from ..core.jsonconfig import read_json_object
from ..nn.adapters import lora_layers, merge_lora
from ..nn.attention import use_attention_kernel
from ..nn.precision import DTYPES, cpu_has_native_bf16
from ..core.threads import add_threads_argument, set_threads
from .length_buckets import DEFAULT_MAX_TOKENS, DEFAULT_MAX_TOKENS_GPU, MAX_WASTE, MAX_WASTE_GPU

log = logging.getLogger(__name__)

ON_LONG = ("truncate", "reject")
# The engines that can run the forward pass: bertlab's own, and peers where their packages are installed
ENGINES = ("bertlab", "onnxruntime", "openvino", "ctranslate2")
# engine -> the packages its runtime needs (checked before anything is loaded)
PACKAGES = {"onnxruntime": ("onnxruntime",), "openvino": ("openvino",), "ctranslate2": ("ctranslate2",)}
# engine -> the --dtype values it runs, and the name each has in the engine
ENGINE_PRECISIONS = {"onnxruntime": {"fp32": None, "int8": None},
              "openvino": {"fp32": "f32", "bf16": "bf16"},
              "ctranslate2": {"fp32": "float32", "int8": "int8"}}  # its CPU build has no bfloat16
# engine -> load_model for it (cls, model_dir, options, head) -> a model; filled by infer/engines.py, which the
# package imports (the engines' converters use this module's loader: registered, not imported from here)
ENGINE_LOADERS: dict[str, Any] = {}


def require_engine(engine: str, dtype: str = "fp32") -> None:
    """One line when the engine is unknown, its package is missing, or it does not run `dtype`."""
    if engine not in ENGINES:
        raise BertlabError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")
    if engine == "bertlab":
        return
    missing = [m for m in PACKAGES[engine] if importlib.util.find_spec(m) is None]
    if missing:
        raise BertlabError(f"--engine {engine} needs the {' and '.join(missing)} package: "
                           f"pip install 'bertlab-paper[{engine}]'")
    if dtype not in ENGINE_PRECISIONS[engine]:
        raise BertlabError(f"--engine {engine} runs --dtype {' or '.join(ENGINE_PRECISIONS[engine])}, not {dtype}")


# Inference precisions: the training ones, int8 (fp32 model, linear layers quantized; CPU only), and auto (the
# fastest exact-enough one here: `resolve_dtype`)
INFERENCE_DTYPES = (*DTYPES, "int8", "auto")


def resolve_dtype(dtype: str, device: str, engine: str = "bertlab") -> str:
    """The precision a model runs in for `--dtype dtype`. `auto`: bf16 on a GPU that has it and on a CPU with
    native bf16 (AVX-512 BF16 / AMX), fp32 elsewhere. bf16 on a CPU without native bf16 runs fp32, said in one
    line: bf16 math is emulated there, at a fifth to a third of fp32's speed (all-MiniLM-L6-v2 on an Intel Xeon
    with AVX-512 and VNNI but no BF16: 16.9 against 78.2 sequences/s), while fp32 is exact and faster."""
    kind = torch.device(device).type
    if dtype == "auto":
        if kind == "cuda":
            return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
        return "bf16" if engine == "bertlab" and cpu_has_native_bf16() else "fp32"
    if dtype == "bf16" and kind == "cpu" and engine == "bertlab" and not cpu_has_native_bf16():
        log.warning("--dtype bf16: this CPU has no native bf16 (AVX-512 BF16 or AMX), where bf16 is slower than "
                    "fp32; running fp32 (exact, and faster here)")
        return "fp32"
    return dtype


@dataclass
class InferenceOptions:
    """How to run: where, in which precision, how long a text may be, how big a batch."""

    device: str = "cpu"
    dtype: str = "fp32"
    max_seq_length: int | None = None  # tokens incl. [CLS]/[SEP]; None: the model's limit
    on_long: str = "truncate"  # or "reject"
    max_tokens: int | None = None  # padded tokens per forward pass (length bucketing); None: 1024 CPU, 16384 GPU
    max_batch: int = 256  # rows per forward pass
    threads: int | None = None
    packed_linear: bool = True  # CPU: linear layers from packed weights, C GEMM or oneDNN (see nn/packed_linear.py)
    # CPU: the attention kernel chosen by precision (`cpu_attention_kernel`); export keeps the model's own (a
    # traced graph must hold plain torch operators: `bmm` writes into buffers and calls C loops)
    cpu_attention: bool = True
    engine: str = "bertlab"  # or a peer engine running the forward pass (see infer/engines.py)
    # CPU: keep freed tensor memory in the process instead of paging it in anew for every batch (`host_memory`);
    # a command's peak memory is its biggest batch either way. all-MiniLM-L6-v2, one thread: a first bulk call
    # in int8 129 -> 198 seq/s, later ones +3-11%. The service leaves it off: it trims its heap instead.
    retain_freed_memory: bool = True

    def __post_init__(self) -> None:
        if self.dtype not in INFERENCE_DTYPES:
            raise BertlabError(f"unknown dtype {self.dtype!r}; expected one of {', '.join(INFERENCE_DTYPES)}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise BertlabError(f"device {self.device!r} requested but no CUDA device is available")
        self.dtype = resolve_dtype(self.dtype, self.device, self.engine)
        if self.engine != "bertlab":
            require_engine(self.engine, self.dtype)
            if self.device != "cpu":
                raise BertlabError(f"--engine {self.engine} runs on the CPU here; "
                                   f"use --engine bertlab on {self.device}")
        if self.dtype == "int8" and torch.device(self.device).type != "cpu":
            raise BertlabError(f"--dtype int8 runs on the CPU only; use --dtype bf16 or fp16 on {self.device}")
        if self.on_long not in ON_LONG:
            raise BertlabError(f"--on-long must be one of {', '.join(ON_LONG)}, got {self.on_long!r}")
        if self.max_seq_length is not None and self.max_seq_length < 3:
            raise BertlabError("--max-seq-length must be at least 3 (room for [CLS] x [SEP]), "
                               f"got {self.max_seq_length}")
        if self.max_tokens is None:
            self.max_tokens = DEFAULT_MAX_TOKENS if self.device == "cpu" else DEFAULT_MAX_TOKENS_GPU
        if self.max_tokens < 1 or self.max_batch < 1:
            raise BertlabError("--max-tokens and --max-batch must be positive")
        set_threads(self.threads)

    @property
    def max_waste(self) -> float:
        """The padding a length bucket may hold (`length_buckets.plan_batches`): bounded on a CPU, where padded
        positions are computed; unbounded on a GPU, where the encoder skips them."""
        return MAX_WASTE if torch.device(self.device).type == "cpu" else MAX_WASTE_GPU

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype the model's parameters are cast to (int8: fp32, its linear layers quantized after)."""
        return torch.float32 if self.dtype == "int8" else DTYPES[self.dtype]

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "InferenceOptions":
        return cls(**{k: getattr(args, k) for k in ("device", "dtype", "max_seq_length", "on_long", "max_tokens",
                                                    "max_batch", "threads", "packed_linear", "engine")
                      if getattr(args, k, None) is not None})


def add_inference_arguments(p: argparse.ArgumentParser, model_required: bool = True) -> None:
    """The options every inference command takes."""
    from ..core.model_names import model_path

    p.add_argument("--model", type=model_path, required=model_required, metavar="DIR|NAME",
                   help="a Hugging Face-layout model folder (config.json, weights, vocab.txt or tokenizer.json), or "
                        "the name of a model in the local Hugging Face cache (bert-base-uncased, ORG/NAME)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument("--dtype", default="fp32", choices=list(INFERENCE_DTYPES),
                   help="precision of the model (default fp32); bf16 on a CPU without native bf16 runs fp32, "
                        "said in one line; int8: CPU, linear layers as int8 GEMMs; auto: bf16 where the device has "
                        "it natively, else fp32")
    p.add_argument("--max-seq-length", type=int, metavar="N",
                   help="tokens per text including [CLS]/[SEP] (default: the model's limit)")
    p.add_argument("--on-long", default="truncate", choices=ON_LONG,
                   help="a text over --max-seq-length: cut it and warn (default), or stop with an error")
    p.add_argument("--max-tokens", type=int, metavar="N",
                   help="padded tokens per forward pass; inputs are sorted by length and bucketed under it "
                        "(default 1024 on CPU, 16384 on GPU)")
    p.add_argument("--max-batch", type=int, default=256, metavar="N", help="texts per forward pass at most")
    add_threads_argument(p, "torch's choice")
    p.add_argument("--no-packed-linear", dest="packed_linear", action="store_false", default=None,
                   help="on CPU: plain nn.Linear instead of linear layers from packed weights (bertlab's GEMMs on "
                        "AVX-512 / AVX-512 BF16, oneDNN's elsewhere): neither runs")


def add_engine_argument(p: argparse.ArgumentParser) -> None:
    """`--engine`, for the commands a peer engine can run (embed, predict, serve)."""
    p.add_argument("--engine", default="bertlab", choices=ENGINES,
                   help="what runs the model: bertlab (default, the fastest here), or onnxruntime, openvino, "
                        "ctranslate2 where installed (the folder's `bertlab export` file, else converted on load)")


# ---------------------------------------------------------------------------------------------- checkpoints
def checkpoint_keys(model_dir: Path) -> set[str] | None:
    """The weight names in a checkpoint folder, read from the safetensors header only (no tensor data);
    None when the folder's format needs a full load to tell (a pytorch_model.bin)."""
    from safetensors import safe_open

    from ..checkpoint.hf_layout import WEIGHTS_INDEX_NAME, WEIGHTS_NAME

    if (model_dir / WEIGHTS_NAME).is_file():
        try:
            with safe_open(str(model_dir / WEIGHTS_NAME), "pt") as f:
                return set(f.keys())
        except Exception:  # corrupt: the real load reports it properly
            return None
    if (model_dir / WEIGHTS_INDEX_NAME).is_file():
        try:
            return set(json.loads((model_dir / WEIGHTS_INDEX_NAME).read_text())["weight_map"])
        except (OSError, ValueError, KeyError):
            return None
    return None


def has_weights(keys: set[str], prefix: str) -> bool:
    """Whether a checkpoint has weights under `prefix` (with or without a model prefix such as `bert.`)."""
    return any(k.startswith(prefix) or k.partition(".")[2].startswith(prefix) for k in keys)


def architectures(model_dir: Path) -> list[str]:
    """`config.json["architectures"]`: the class the model was saved from (Hugging Face's convention)."""
    config = Path(model_dir) / "config.json"
    arch = read_json_object(config).get("architectures") if config.is_file() else None
    return [a for a in arch if isinstance(a, str)] if isinstance(arch, list) else []


def model_family(model_dir: Path):
    """The family of a model folder (`models/registry.py`: config.json's model_type)."""
    from ..models.registry import family_of

    return family_of(check_model_dir(model_dir))


def check_model_dir(model_dir: Path) -> Path:
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise BertlabError(f"{model_dir}: no such model folder")
    if not (model_dir / "config.json").is_file() and not (model_dir / "bert_config.json").is_file():
        raise BertlabError(f"{model_dir}: not a model folder (no config.json)")
    return model_dir


def load_encoder(model_dir: Path, options: InferenceOptions) -> Any:
    """The bare encoder of the folder's family (a task model's encoder too), ready for inference."""
    family = model_family(model_dir)
    if family.base_model is None:
        raise BertlabError(f"{model_dir}: {family.name} models have no bare encoder; this command needs one")
    return load_model(family.base_model, model_dir, options)


def load_head(kind: str, model_dir: Path, options: InferenceOptions, purpose: str = "this command") -> Any:
    """The folder's family's head of `kind` (`models/heads.py`), refused when the checkpoint lacks its weights."""
    head = model_family(model_dir).head(kind, purpose)
    return load_model(head.model_class, model_dir, options, head_prefix=head.prefix, purpose=purpose)


def load_model(cls: type, model_dir: Path, options: InferenceOptions, head_prefix: str | None = None,
               purpose: str = "this command") -> Any:
    """`cls.from_pretrained(model_dir)` on the chosen device and dtype, in eval mode. With `head_prefix`
    (e.g. `cls.predictions.`), refuse a checkpoint without those weights instead of initialising them."""
    model_dir = check_model_dir(model_dir)
    if options.engine != "bertlab":
        return ENGINE_LOADERS[options.engine](cls, model_dir, options, head=head_prefix is not None)
    if head_prefix is not None:
        keys = checkpoint_keys(model_dir)
        if keys is not None and not has_weights(keys, head_prefix):
            arch = ", ".join(architectures(model_dir)) or "unknown"
            raise BertlabError(f"{model_dir}: the checkpoint has no {head_prefix}* weights (architectures: {arch}); "
                               f"{purpose} needs a model trained with that head")
    model, report = cls.from_pretrained(model_dir, return_report=True)
    if head_prefix is not None and any(k.startswith(head_prefix) for k in report.initialized):
        raise BertlabError(f"{model_dir}: the checkpoint has no {head_prefix}* weights; {purpose} needs them")
    return prepare(model, options)


def prepare(model: torch.nn.Module, options: InferenceOptions) -> torch.nn.Module:
    """Unmerged LoRA merged; eval mode, device, dtype; parameters frozen (inference never needs their
    gradients); int8: linear layers quantized; on a CPU, the remaining fp32/bf16 linear layers packed for oneDNN
    (last: the packed copies are made from the final weights)."""
    if lora_layers(model):  # an unmerged LoRA adapter: folded into its weights once, not recomputed per call
        merge_lora(model)
    model = model.to(device=options.device, dtype=options.torch_dtype).eval()
    if options.retain_freed_memory and torch.device(options.device).type == "cpu":
        retain_freed_memory()  # process-wide, once
    for p in model.parameters():
        p.requires_grad_(False)
    if options.dtype == "int8":  # before packing: the quantized layers replace the plain ones
        from ..nn.int8_linear import available, quantize_linear_layers

        if not available():
            raise BertlabError("--dtype int8: no int8 matrix multiply here (neither bertlab's C int8 kernels nor an "
                               "exact torch._int_mm)")
        log.debug("%d linear layers quantized to int8", quantize_linear_layers(model))
    if options.packed_linear and torch.device(options.device).type == "cpu":
        from ..nn.packed_linear import pack_linear_layers

        # an encoder-decoder keeps its plain weights: a decoding step's 1-4 rows take the GEMV over them
        # (`packed_linear.GEMV_ROWS`), which the panel GEMM was not measured to match at those rows
        decoder = getattr(getattr(model, "config", None), "is_encoder_decoder", False)
        packed = pack_linear_layers(model, release_plain=not decoder)
        log.debug("%d linear layers packed", packed)
    if torch.device(options.device).type == "cpu":
        # what quantizing and packing freed (the weights they replaced, their temporaries) sits in a heap whose
        # thresholds `retain_freed_memory` raised, which would keep it resident for good: handed back once here
        trim_heap()
    kernel = cpu_attention_kernel(model, options)
    if kernel is not None:
        log.debug("attention kernel %s in %d layers", kernel, use_attention_kernel(model, kernel))
    return model


def cpu_attention_kernel(model: torch.nn.Module, options: InferenceOptions) -> str | None:
    """The attention kernel a CPU runs fastest at the model's precision (`nn/attention.py` measures them), where
    the model runs the default (sdpa); None: keep it. int8 on a CPU with native bf16: `bmm_bf16`; otherwise
    `bmm` (bf16: oneDNN's bf16 GEMMs; fp32: the C loops, 1.2-1.9x SDPA, where built -- else its matmuls, level
    with SDPA). fp16 keeps SDPA."""
    if (not options.cpu_attention or torch.device(options.device).type != "cpu"
            or getattr(model.config, "attn_implementation", None) != "sdpa"):
        return None
    if options.dtype == "int8":
        return "bmm_bf16" if cpu_has_native_bf16() else "bmm"
    return "bmm" if options.dtype in ("fp32", "bf16") else None


def load_tokenizer(model_dir: Path, placed_tokens: tuple[str, ...] = ()):
    """The folder's tokenizer, as its family reads it (vocab.txt, vocab.json + merges.txt, a SentencePiece model);
    `placed_tokens`: tokens the caller inserts by id (`Family.load_tokenizer`)."""
    return model_family(model_dir).load_tokenizer(model_dir, placed_tokens)


def length_limit(model_dir: Path | None, config, tokenizer, requested: int | None) -> int:
    """Tokens per text: the requested limit, else a sentence-transformers `max_seq_length` saved beside the
    model (so `embed` truncates where that library does), else the tokenizer's; never beyond the
    model's position table."""
    limit = requested
    if limit is None and model_dir is not None and (Path(model_dir) / "sentence_bert_config.json").is_file():
        try:
            limit = int(json.loads((Path(model_dir) / "sentence_bert_config.json").read_text())["max_seq_length"])
        except (OSError, ValueError, KeyError, TypeError):
            limit = None
    if limit is None:
        limit = tokenizer.model_max_length
    cap = config.max_sequence_length  # the position table less what the family reserves (RoBERTa: 514 -> 512)
    if limit > cap:
        if requested is not None:
            raise BertlabError(f"--max-seq-length {requested} is over the model's limit of {cap} tokens "
                               f"(max_position_embeddings = {config.max_position_embeddings})")
        limit = cap
    return limit
