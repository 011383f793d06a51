"""Embedding and prediction over Ray Data, for a corpus bigger than one process: the engine wired, not rebuilt.

Two ways in (`bertlab.ray` is this module's public name):

- `embed(dataset, model=...)` / `predict(dataset, model=...)`, for a program already in Ray: a Ray Dataset with
  an id column and a text column in, a Ray Dataset out (lazy, as every Ray Data transform) with `id` and
  `embedding` (or the prediction's fields).
- `run_embed` / `run_predict`, behind `bertlab embed --ray` and `bertlab predict --ray`: tables on disk in (a
  file, a folder or a glob of Parquet / JSON Lines / CSV / TSV, each read by `input_files` exactly as the
  one-process command reads it), Parquet shards out under a folder, with a manifest, so a re-run after an
  interruption computes only the shards that are not done.

The pipeline is Ray Data's own:

    read      CPU tasks: each input file read by bertlab's table reader, cut into shards of `shard_rows` rows,
              the shards the manifest already holds skipped
    tokenize  CPU tasks (embed; a prediction's features carry the task's bookkeeping, so its actors featurize)
    model     an actor pool (`ActorPoolStrategy` through `concurrency=`): one bertlab runtime per actor, with
              the threads, dtype, engine and length limit of the one-process command (`InferenceOptions`),
              a GPU each where the device is one
    write     CPU tasks: each shard a Parquet file renamed into place, then its manifest entry

One Ray Data row is one shard (its ids, texts, token ids and results as lists), so no transform splits a shard
and the file written for it holds all of its rows, in input order. A shard is named by its input file's place
in the sorted input list and its own place in that file (`part-00003-000017.parquet`), so the output read in
name order is the input order, run after run. Ray restarts an actor that dies and re-runs its task (Ray Data's
defaults for actor pools: `max_restarts=-1`, `max_task_retries=-1`); a shard's file is written whole by one task and renamed into place, so a retried
shard replaces a file, never adds rows, and a shard whose task never finished has no file and no manifest entry.

Nothing here schedules or shards beyond naming the rows of each file: Ray places the tasks and actors, moves
the blocks, retries and applies back-pressure.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import BertlabError
from .runtime import InferenceOptions

SHARD_ROWS = 4096  # rows per output shard: the unit written, recorded and skipped on a re-run
MANIFEST_DIR = "_manifest"  # OUTPUT/_manifest/SHARD.json, one per finished shard
JOB = "_job.json"  # what the shards were computed with: a re-run must match it
# The light stages (read, tokenize, write) reserve no CPU: the model actors hold the cores (`--threads` each), and
# a stage waiting for a free core while every core is an actor's would stall the pipeline; Ray's back-pressure
# and this cap on concurrent tasks keep them from crowding the actors.
LIGHT_TASKS = {"num_cpus": 0}


def light(actors: int) -> dict[str, Any]:
    return {**LIGHT_TASKS, "concurrency": max(2, actors)}


def require_ray():
    """The `ray` module, or a one-line error saying how to install it."""
    try:
        import ray
        import ray.data  # noqa: F401  (Ray Data comes with the `ray[data]` extra)
    except ImportError:
        raise BertlabError("--ray needs Ray Data: pip install 'bertlab-paper[ray]' (or 'ray[data]')") from None
    return ray


def connect(address: str) -> bool:
    """Join Ray for `--ray ADDRESS`: `local` starts a Ray on this machine, `auto` joins the cluster this machine
    is in (RAY_ADDRESS, or a `ray start` here), anything else is a cluster address (ray://HOST:10001,
    HOST:6379). True when this call started the connection (so the command shuts it down after)."""
    ray = require_ray()
    if ray.is_initialized():
        return False
    try:
        if address == "local":
            ray.init(include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
    except ConnectionError as e:
        raise BertlabError(f"--ray {address}: no Ray cluster to join ({str(e).splitlines()[0]}); "
                           "--ray local starts one on this machine") from None
    return True


def actor_resources(options: InferenceOptions) -> dict[str, Any]:
    """What one model actor asks Ray for: its threads as CPUs, one GPU on a CUDA device. A dead actor is
    restarted and its task re-run by Ray Data's own defaults for actor pools (max_restarts=-1,
    max_task_retries=-1), which are left as they are."""
    gpu = options.device.startswith("cuda")
    return {"num_cpus": 1 if gpu else max(1, options.threads or 1), "num_gpus": 1 if gpu else 0}


def options_fields(options: InferenceOptions) -> dict[str, Any]:
    """The options as plain fields, rebuilt in each actor (`InferenceOptions(**fields)` sets its threads there)."""
    fields = dataclasses.asdict(options)
    if fields["device"].startswith("cuda"):
        fields["device"] = "cuda"  # the GPU Ray gave the actor is its cuda:0
    return fields


# ---------------------------------------------------------------------------------------------- the stages
@functools.lru_cache(maxsize=4)
def _tokenizer(model: str):
    """A worker process's tokenizer of `model`, loaded once however many tasks it runs."""
    from .runtime import load_tokenizer

    return load_tokenizer(Path(model))


@dataclasses.dataclass(frozen=True)
class EmbedSpec:
    """What the embedding stages share: the model, how it pools and normalises, and its length limit."""

    model: str
    pooling: str
    normalize: bool
    max_seq_length: int
    dim: int
    options: dict[str, Any]
    window_overlap: int | None = None
    prompt: str = ""  # put before each text (sentence-transformers' prompt)
    dimensions: int | None = None  # each vector's first N (Matryoshka); `dim` is then N

    @classmethod
    def resolve(cls, model: str | Path, pooling: str | None, normalize: bool | None, options: InferenceOptions,
                window_overlap: int | None, prompt: str = "", dimensions: int | None = None) -> "EmbedSpec":
        """Checked here, before any task starts: the folder, its tokenizer, the pooling it declares, the length
        limit, the window overlap (no weights are loaded). `normalize=None`: as the folder's pipeline does."""
        from .embeddings import DEFAULT_POOLING, POOLINGS, model_pooling, resolve_normalize, windows
        from .runtime import check_model_dir, length_limit, load_tokenizer, model_family

        folder = check_model_dir(Path(model))
        config = model_family(folder).config_class.from_json_file(folder)
        tokenizer = load_tokenizer(folder)
        pooling = pooling or model_pooling(folder) or DEFAULT_POOLING
        if pooling not in POOLINGS:
            raise BertlabError(f"unknown pooling {pooling!r}; expected one of {', '.join(POOLINGS)}")
        limit = length_limit(folder, config, tokenizer, options.max_seq_length)
        if window_overlap is not None:
            windows([], limit, window_overlap, 0, 0)
        if dimensions is not None and not 1 <= dimensions <= config.hidden_size:
            raise BertlabError(f"--dimensions keeps the first N of the model's {config.hidden_size} dimensions; got "
                               f"{dimensions}")
        return cls(str(folder.resolve()), pooling, resolve_normalize(folder, normalize), limit,
                   dimensions or config.hidden_size, options_fields(options), window_overlap, prompt, dimensions)

    def tokenize(self, texts: Sequence[str], where=None) -> list[list[int]]:
        """Token ids as `Embedder.embed` makes them: rows under the limit (with_window_overlap: without special
        tokens, for the actor to cut into windows)."""
        from .inputs import encode

        tokenizer = _tokenizer(self.model)
        if self.prompt:
            texts = [self.prompt + t for t in texts]
        if self.window_overlap is not None:
            return [tokenizer.encode(t, add_special_tokens=False) for t in texts]
        return encode(tokenizer, list(texts), self.max_seq_length, self.options["on_long"], where=where).input_ids


class _Embedder:
    """A model actor: one `Embedder` (one bertlab runtime, its threads and dtype), loaded once per actor."""

    def __init__(self, spec: EmbedSpec):
        from .embeddings import Embedder

        self.spec = spec
        self.embedder = Embedder.from_pretrained(spec.model, spec.pooling, spec.normalize,
                                                 InferenceOptions(**spec.options), spec.window_overlap, spec.dimensions)

    def vectors(self, input_ids: Sequence[Sequence[int]]) -> np.ndarray:
        if self.spec.window_overlap is not None:
            return self.embedder.embed_documents(input_ids)
        return self.embedder.embed_ids(input_ids)


def _decode_ids(values: Sequence[str]) -> list[Any]:
    return [json.loads(v) for v in values]


def _ids_column(values: Sequence[Any]):
    """Row ids as one Arrow type: integers stay integers, anything else (or a mix) is text."""
    import pyarrow as pa

    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return pa.array(values, pa.int64())
    return pa.array([str(v) for v in values], pa.string())


def _vectors_column(vectors: np.ndarray):
    """An (N, H) float32 array as Arrow's fixed-size lists (what pandas, polars and DuckDB read as vectors)."""
    import pyarrow as pa

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), vectors.shape[1])


# ---------------------------------------------------------------------------------------------- the Python API
def embed(dataset, model: str | Path, *, id_column: str = "id", text_column: str = "text",
          pooling: str | None = None, normalize: bool | None = None, options: InferenceOptions | None = None,
          window_overlap: int | None = None, actors: int = 1, batch_size: int = 1024, prompt: str = "",
          dimensions: int | None = None):
    """Sentence embeddings of a Ray Dataset's `text_column`: a Ray Dataset of `id` (the `id_column`'s values)
    and `embedding` (float32 vectors), computed as `bertlab embed` computes them -- tokenized in CPU tasks, the
    model in a pool of `actors` actors, each one bertlab runtime with `options` (threads, dtype, engine, device:
    a GPU per actor on CUDA), `prompt` put before each text, each vector's first `dimensions` kept. Lazy: nothing
    runs until the result is consumed or written."""
    from ..core.model_names import resolve_model

    require_ray()
    options = options or InferenceOptions(threads=1)
    spec = EmbedSpec.resolve(resolve_model(model), pooling, normalize, options, window_overlap, prompt, dimensions)

    def tokenize(batch: dict[str, Any]) -> dict[str, Any]:
        return {"id": batch[id_column], "input_ids": spec.tokenize([str(t) for t in batch[text_column]])}

    class EmbedRows(_Embedder):
        def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
            return {"id": batch["id"], "embedding": self.vectors([np.asarray(r).tolist() for r in batch["input_ids"]])}

    return (dataset.map_batches(tokenize, batch_size=batch_size, batch_format="numpy", **light(actors))
            .map_batches(EmbedRows, fn_constructor_args=(spec,), batch_size=batch_size, batch_format="numpy",
                         concurrency=actors, **actor_resources(options)))


def predict(dataset, model: str | Path, *, id_column: str = "id", text_column: str = "text",
            text_pair_column: str | None = None, options: InferenceOptions | None = None, actors: int = 1,
            batch_size: int = 1024):
    """A fine-tuned classifier's predictions over a Ray Dataset's texts (`text_column`, and `text_pair_column`
    for pairs): a Ray Dataset of `id` and the prediction's fields as `bertlab predict` writes them (`label`,
    `score`, `scores`; a regression's `score`; a multi-label model's `labels`, `scores`), from a pool of
    `actors` model actors."""
    from ..core.model_names import resolve_model

    require_ray()
    options = options or InferenceOptions(threads=1)
    model = resolve_model(model)
    check_predictable(model)
    fields = options_fields(options)

    class PredictRows:
        def __init__(self):
            from .predict import Predictor

            self.predictor = Predictor.from_pretrained(model, InferenceOptions(**fields))

        def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
            items = [{"text": str(t)} for t in batch[text_column]]
            if text_pair_column is not None:
                for item, pair in zip(items, batch[text_pair_column]):
                    item["text_pair"] = str(pair)
            answers = self.predictor.predict(items)
            return {"id": batch[id_column], **{k: [a.get(k) for a in answers] for k in answers[0]}}

    return dataset.map_batches(PredictRows, batch_size=batch_size, batch_format="numpy", concurrency=actors,
                               **actor_resources(options))


def check_predictable(model: str | Path, classify_only: bool = True) -> str:
    """The kind of prediction a folder's head serves (`text-classification`, ...), checked before any actor loads it:
    a folder of a family that generates text (T5) or without a predictable head is refused in one line."""
    from .predict import find_head, predictable_heads
    from .runtime import architectures, check_model_dir, model_family

    folder = check_model_dir(Path(model))
    family = model_family(folder)
    if family.generates_text:
        raise BertlabError(f"{folder}: {family.name} generation runs in one process (bertlab predict without --ray)")
    head = find_head(folder)
    if head is None:
        wanted = ", ".join(h.architecture for h in predictable_heads(family))
        raise BertlabError(f"{folder}: not a fine-tuned task model (config.json architectures: "
                           f"{', '.join(architectures(folder)) or 'none'}); predict needs one of {wanted}")
    if classify_only and head.task != "text-classification":
        raise BertlabError(f"{folder}: a {head.task} model; the Ray Data path predicts with classifiers "
                           "(text, text pair); run other tasks with bertlab predict without --ray")
    return head.task


# ---------------------------------------------------------------------------------------------- files to shards
@dataclasses.dataclass(frozen=True)
class TableRead:
    """How the input tables are read: their columns and format, as the one-process command's flags say."""

    text_column: str | None = None
    text_pair_column: str | None = None
    id_column: str | None = None
    format: str | None = None
    with_pair: bool = False

    def shards(self, index: int, path: str, shard_rows: int, done: frozenset[str]) -> Iterator[dict[str, Any]]:
        """The shards of input file `index` not in `done`: {shard, ids, texts, pairs, places}, `shard_rows` rows
        each (the last fewer), read by `input_files` as `bertlab embed` / `predict` read the file."""
        from .input_files import open_table_texts

        opened = open_table_texts(path, self.text_column, self.format, self.text_pair_column, self.id_column,
                                  self.with_pair, need_id=True)
        rows: list[tuple] = []
        number = 0
        for row in opened.rows(self.with_pair, need_id=True):
            rows.append(row)
            if len(rows) == shard_rows:
                yield from self._shard(index, number, rows, done)
                rows, number = [], number + 1
        if rows or number == 0:
            yield from self._shard(index, number, rows, done)

    def _shard(self, index: int, number: int, rows: list[tuple], done: frozenset[str]) -> Iterator[dict[str, Any]]:
        name = shard_name(index, number)
        if name in done:
            return
        # ids travel as JSON text: one Arrow type whatever a file holds (42, "a7", a mix), decoded exactly
        yield {"shard": name, "ids": [json.dumps(r[0]) for r in rows], "texts": [r[1] for r in rows],
               "pairs": [r[2] for r in rows] if self.with_pair else None, "places": [r[3] for r in rows]}


def shard_name(file_index: int, shard: int) -> str:
    return f"part-{file_index:05d}-{shard:06d}"


def _rows_of(batch) -> list[dict[str, Any]]:
    """The shards in a Ray Data batch (pyarrow format) as dicts of Python lists."""
    return batch.to_pylist()


def _as_batch(shards: list[dict[str, Any]]):
    import pyarrow as pa

    return pa.Table.from_pylist(shards)


# ---------------------------------------------------------------------------------------------- the job folder
@dataclasses.dataclass
class JobFolder:
    """`--output` of a Ray Data job: its Parquet shards, `_manifest/SHARD.json` per finished shard, and `_job.json`
    (the model, settings and input files the shards were computed with; a re-run with others is refused, so a
    folder never mixes two jobs' rows)."""

    root: Path

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST_DIR

    def start(self, job: dict[str, Any]) -> frozenset[str]:
        """Create the folder (or check that it holds this same job) and return the shards already finished."""
        from ..core.fsio import atomic_write_text

        if self.root.exists() and not self.root.is_dir():
            raise BertlabError(f"{self.root}: --output with --ray is a folder (Parquet shards), and this is a file")
        recorded = self.root / JOB
        if recorded.is_file():
            try:
                before = json.loads(recorded.read_text(encoding="utf-8"))
            except ValueError:
                raise BertlabError(f"{recorded}: not valid JSON; remove the folder to start over") from None
            if "max_length" in before:  # written before the sequence length had one name
                before["max_seq_length"] = before.pop("max_length")
            changed = [k for k in sorted(set(before) | set(job)) if before.get(k) != job.get(k)]
            if changed:
                raise BertlabError(f"{self.root}: holds shards of another job (it differs in: {', '.join(changed)}); "
                                   "write to a new --output, or remove this one to start over")
        elif self.root.is_dir() and any(p.suffix == ".parquet" for p in self.root.iterdir()):
            raise BertlabError(f"{self.root}: holds Parquet files but no {JOB}; not a folder this command wrote")
        self.manifest.mkdir(parents=True, exist_ok=True)
        if not recorded.is_file():
            atomic_write_text(recorded, json.dumps(job, indent=1) + "\n")
        return frozenset(self.finished())

    def finished(self) -> dict[str, dict[str, Any]]:
        """Shard name -> its manifest entry, for the shards whose file is in place."""
        out = {}
        for entry in sorted(self.manifest.glob("*.json")):
            try:
                record = json.loads(entry.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # not written whole: the shard is computed again
            if (self.root / record.get("file", "")).is_file():
                out[entry.stem] = record
        return out

    def write_shard(self, name: str, table, source: str) -> dict[str, Any]:
        """The shard's Parquet file, written under a temporary name and renamed into place, then its manifest
        entry (written the same way): a shard is finished exactly when its entry exists."""
        import pyarrow.parquet as pq

        from ..core.fsio import atomic_write_text

        target = self.root / f"{name}.parquet"
        tmp = self.root / f".{name}.parquet.tmp-{os.getpid()}"
        try:
            pq.write_table(table, tmp)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                tmp.unlink()
        record = {"file": target.name, "rows": table.num_rows, "input": source}
        atomic_write_text(self.manifest / f"{name}.json", json.dumps(record) + "\n")
        return record


def fingerprint(files: Sequence[Path]) -> str:
    """The input files as a short digest of their paths, sizes and modification times: a re-run over changed
    files is a different job."""
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def _input_files(spec: str | Path | None, format: str | None) -> list[Path]:
    from .input_files import TEXT_FORMAT, input_format, table_files

    if spec is None or str(spec) == "-":
        raise BertlabError("--ray reads tables from files (--input FILE, FOLDER or 'GLOB'), not stdin")
    files = table_files(spec, format)
    for f in files:
        if not f.is_file():
            raise BertlabError(f"{f}: no such file")
        if input_format(f, format) == TEXT_FORMAT:
            raise BertlabError(f"{f}: --ray reads tables (.csv, .tsv, .jsonl, .json, .parquet, or --input-format) "
                               "with an id and a text column")
    return files


def _run(files: list[Path], output: Path, job: dict[str, Any], read: TableRead, shard_rows: int, actors: int,
         stages) -> dict:
    """The Ray Data job over `files`: read -> `stages(dataset)` -> write, driven to its end with progress; the
    totals of the shards written now and before."""
    from ..core.progress import progress

    ray = require_ray()
    folder = JobFolder(output)
    done = folder.start(job)
    sources = [str(f) for f in files]

    def read_file(batch):
        for row in _rows_of(batch):
            for shard in read.shards(row["index"], row["path"], shard_rows, done):
                yield _as_batch([shard])

    def write(batch):
        import pyarrow as pa

        written = []
        for shard in _rows_of(batch):
            table = pa.ipc.open_stream(shard["table"]).read_all()
            record = folder.write_shard(shard["shard"], table, shard["source"])
            written.append({"shard": shard["shard"], "rows": record["rows"]})
        return _as_batch(written) if written else pa.table({"shard": pa.array([], pa.string()),
                                                           "rows": pa.array([], pa.int64())})

    files_ds = ray.data.from_items([{"index": i, "path": p} for i, p in enumerate(sources)],
                                   override_num_blocks=len(sources))
    shards = files_ds.map_batches(read_file, batch_size=1, batch_format="pyarrow", **light(actors))
    out = stages(shards).map_batches(write, batch_size=1, batch_format="pyarrow", **light(actors))
    rows = shards_now = 0
    with progress(total=None, desc="ray", unit="shard") as bar:
        for batch in out.iter_batches(batch_size=None, batch_format="pyarrow"):
            shards_now += batch.num_rows
            rows += sum(batch.column("rows").to_pylist())
            bar.update(batch.num_rows)
    finished = folder.finished()
    return {"shards": len(finished), "rows": sum(r["rows"] for r in finished.values()), "shards_now": shards_now,
            "rows_now": rows, "skipped": len(done)}


def run_embed(input: str | Path, output: str | Path, model: str | Path, *, options: InferenceOptions,
              pooling: str | None = None, normalize: bool | None = None, window_overlap: int | None = None,
              read: TableRead = TableRead(), actors: int = 1, shard_rows: int = SHARD_ROWS, prompt: str = "",
              dimensions: int | None = None) -> dict:
    """`bertlab embed --ray`: the tables of `input` embedded into Parquet shards (`id`, `embedding`) under
    `output`; the shards a previous run finished are kept, not computed again."""
    files = _input_files(input, read.format)
    spec = EmbedSpec.resolve(model, pooling, normalize, options, window_overlap, prompt, dimensions)
    job = {"command": "embed", "model": spec.model, "pooling": spec.pooling, "normalize": spec.normalize,
           # a folder written without these resumes as before
           **({"prompt": prompt} if prompt else {}), **({"dimensions": dimensions} if dimensions else {}),
           "max_seq_length": spec.max_seq_length, "window_overlap": window_overlap, "dtype": options.dtype,
           "engine": options.engine, "read": dataclasses.asdict(read), "shard_rows": shard_rows,
           "inputs": [str(f) for f in files], "fingerprint": fingerprint(files)}

    def tokenize(batch):
        shards = _rows_of(batch)
        for shard in shards:
            shard["input_ids"] = spec.tokenize(shard["texts"], where=lambda i, p=shard["places"]: p[i])
            del shard["texts"], shard["pairs"]
        return _as_batch(shards)

    class EmbedShards(_Embedder):
        def __call__(self, batch):
            import pyarrow as pa

            out = []
            for shard in _rows_of(batch):
                vectors = self.vectors(shard["input_ids"]) if shard["ids"] else np.zeros((0, self.spec.dim),
                                                                                        np.float32)
                table = pa.table({"id": _ids_column(_decode_ids(shard["ids"])),
                                  "embedding": _vectors_column(vectors)})
                out.append({"shard": shard["shard"], "source": shard["places"][0].rsplit(":", 1)[0]
                            if shard["places"] else "", "table": _table_bytes(table)})
            return _as_batch(out)

    def stages(shards):
        return (shards.map_batches(tokenize, batch_size=1, batch_format="pyarrow", **light(actors))
                .map_batches(EmbedShards, fn_constructor_args=(spec,), batch_size=1, batch_format="pyarrow",
                             concurrency=actors, **actor_resources(options)))

    return _run(files, Path(output), job, read, shard_rows, actors, stages)


def run_predict(input: str | Path, output: str | Path, model: str | Path, *, options: InferenceOptions,
                read: TableRead = TableRead(), actors: int = 1, shard_rows: int = SHARD_ROWS) -> dict:
    """`bertlab predict --ray`: a classifier's predictions over the tables of `input`, as Parquet shards (`id`,
    then the prediction's fields) under `output`; finished shards are kept."""
    from .input_files import TextColumns
    from .runtime import model_family

    files = _input_files(input, read.format)
    check_predictable(model)
    folder = Path(model).resolve()
    config = model_family(folder).config_class.from_json_file(folder)
    # the columns the model was fine-tuned on, as the one-process predict reads them
    columns = TextColumns.for_model(read.text_column, read.text_pair_column, config.extra)
    trained_pair = columns.text_pair is not None and read.text_pair_column is None
    read = dataclasses.replace(read, text_column=columns.text, text_pair_column=columns.text_pair,
                               with_pair=read.with_pair or read.text_pair_column is not None or trained_pair)
    fields = options_fields(options)
    job = {"command": "predict", "model": str(folder), "dtype": options.dtype, "engine": options.engine,
           "max_seq_length": options.max_seq_length, "read": dataclasses.asdict(read), "shard_rows": shard_rows,
           "inputs": [str(f) for f in files], "fingerprint": fingerprint(files)}

    class PredictShards:
        def __init__(self):
            from .predict import Predictor

            self.predictor = Predictor.from_pretrained(folder, InferenceOptions(**fields))

        def __call__(self, batch):
            import pyarrow as pa

            out = []
            for shard in _rows_of(batch):
                items = [{"text": t} if not shard["pairs"] else {"text": t, "text_pair": p}
                         for t, p in zip(shard["texts"], shard["pairs"] or shard["texts"])]
                answers = self.predictor.predict(items, where=lambda i, p=shard["places"]: p[i])
                ids = _ids_column(_decode_ids(shard["ids"]))
                table = pa.Table.from_pylist([{"id": None, **a} for a in answers]) if answers \
                    else pa.table({"id": ids})
                table = table.set_column(0, "id", ids)
                out.append({"shard": shard["shard"], "source": shard["places"][0].rsplit(":", 1)[0]
                            if shard["places"] else "", "table": _table_bytes(table)})
            return _as_batch(out)

    def stages(shards):
        return shards.map_batches(PredictShards, batch_size=1, batch_format="pyarrow", concurrency=actors,
                                  **actor_resources(options))

    return _run(files, Path(output), job, read, shard_rows, actors, stages)


def _table_bytes(table) -> bytes:
    """A shard's result table as Arrow IPC bytes: one value of one Ray Data row, whatever its columns."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def read_output(output: str | Path):
    """A Ray Data job's output folder as one Arrow table, shards in name order (the input order)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted(Path(output).glob("part-*.parquet"))
    if not files:
        raise BertlabError(f"{output}: no Parquet shards")
    return pa.concat_tables([pq.read_table(f) for f in files])


# ---------------------------------------------------------------------------------------------- the commands
def add_ray_arguments(p) -> None:
    """`--ray`, `--ray-actors` and `--shard-rows`, as `embed` and `predict` spell them."""
    p.add_argument("--ray", nargs="?", const="auto", metavar="auto|local|ADDRESS",
                   help="run over Ray Data: --input a table, a folder or a 'GLOB' of them (each row an id and a "
                        "text), --output a folder of Parquet shards, resumed where a previous run stopped. auto "
                        "(the default when the flag is bare): the cluster this machine is in; local: start Ray on "
                        "this machine; or a cluster address (ray://HOST:10001)")
    p.add_argument("--ray-actors", type=int, default=1, metavar="N",
                   help="with --ray: model actors, each one model with --threads threads (default 1 with --ray), "
                        "or one GPU each on --device cuda (default 1 actor)")
    p.add_argument("--shard-rows", type=int, default=SHARD_ROWS, metavar="N",
                   help=f"with --ray: rows per output shard, the unit written and skipped on a re-run "
                        f"(default {SHARD_ROWS})")


def check_ray_arguments(args) -> None:
    """The flags that mean nothing (or something else) without --ray, and --ray's own needs."""
    if args.ray is None:
        if args.ray_actors != 1 or args.shard_rows != SHARD_ROWS:
            raise BertlabError("--ray-actors and --shard-rows apply with --ray")
        return
    if args.output is None or Path(args.output).suffix in (".jsonl", ".json", ".npy", ".safetensors"):
        raise BertlabError("--ray writes Parquet shards into a folder: --output FOLDER")
    if args.ray_actors < 1 or args.shard_rows < 1:
        raise BertlabError("--ray-actors and --shard-rows must be positive")


def bertlab_cause(error: BaseException) -> BaseException | None:
    """The `BertlabError` (bad input, in a task's own words) behind an error Ray raised for a failed task."""
    seen = 0
    while error is not None and seen < 16:
        if isinstance(error, BertlabError) and type(error).__module__.startswith("bertlab"):
            return error
        error = getattr(error, "cause", None) or error.__cause__ or error.__context__
        seen += 1
    return None


def report(summary: dict, output) -> str:
    return (f"{summary['rows']:,} rows in {summary['shards']:,} Parquet shards under {output} "
            f"({summary['shards_now']:,} shards written now, {summary['skipped']:,} finished before)")


def run_command(args, runner, **kwargs) -> int:
    """Join Ray as --ray says, run `runner` (`run_embed` / `run_predict`), leave Ray as it was."""
    from ..core.progress import write

    check_ray_arguments(args)
    options = InferenceOptions.from_args(args)
    if options.threads is None:
        options = dataclasses.replace(options, threads=1)  # one per actor unless told: actors are the parallelism
    read = TableRead(args.text_column, getattr(args, "text_pair_column", None), args.id_column,
                     getattr(args, "input_format", None) or getattr(args, "format", None))
    started = connect(args.ray)
    try:
        summary = runner(args.input, args.output, args.model, options=options, read=read, actors=args.ray_actors,
                         shard_rows=args.shard_rows, **kwargs)
    except Exception as e:
        cause = bertlab_cause(e)
        if cause is None or cause is e:
            raise
        raise BertlabError(str(cause).strip().splitlines()[-1]) from None  # a task's bad row, without Ray's trace
    finally:
        if started:
            require_ray().shutdown()
    write(report(summary, args.output))
    return 0
