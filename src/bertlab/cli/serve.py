"""`bertlab serve --model DIR [--host 127.0.0.1] [--port 8000] [--api-key KEY] [--max-batch-tokens N]
[--max-concurrent-requests N] [--workers N]`: the HTTP service (see `bertlab.infer.serve`).

OpenAI's /v1/embeddings and /v1/models; text-embeddings-inference's /embed, /embed_sparse, /predict, /rerank, /tokenize,
/info; /classify, /qa and /fill-mask when the model has that head or a folder is given for it; /health,
/metrics; the OpenAPI description at /openapi.json. Needs the `serve` extra: `pip install 'bertlab-paper[serve]'`.
The port is taken before the model loads: a busy port is one line and exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

API_KEY_ENV = "BERTLAB_API_KEY"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..infer.dynamic_batcher import Limits
    from ..infer.embeddings import POOLINGS
    from ..infer.runtime import add_engine_argument, add_inference_arguments
    from ..core.model_names import model_path
    from .embed import add_embedding_arguments

    add_inference_arguments(p)
    add_engine_argument(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0: any free port)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="server processes sharing the port, each with the model and cores/N threads (default 1)")
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV), metavar="KEY",
                   help=f"require 'Authorization: Bearer KEY' on every route but /health (default: ${API_KEY_ENV})")
    p.add_argument("--served-model-name", metavar="NAME",
                   help="the model's id in /v1/models and /info (default: the folder's name)")
    # Each a folder or a name in the local Hugging Face cache, as --model.
    p.add_argument("--classify-model", metavar="DIR|NAME", type=model_path,
                   help="a text-classification model for /classify and /predict (one output: /rerank)")
    p.add_argument("--qa-model", metavar="DIR|NAME", type=model_path, help="a question-answering model for /qa")
    p.add_argument("--fill-mask-model", metavar="DIR|NAME", type=model_path, help="a masked-LM model for /fill-mask")
    p.add_argument("--generate-model", metavar="DIR|NAME", type=model_path, help="a T5 model for /generate")
    add_embedding_arguments(p, POOLINGS)
    d = Limits()
    p.add_argument("--max-batch-tokens", type=int, default=d.max_batch_tokens, metavar="N",
                   help=f"tokens of concurrent requests merged into one model call (default {d.max_batch_tokens})")
    p.add_argument("--max-concurrent-requests", type=int, default=d.max_concurrent_requests, metavar="N",
                   help=f"requests queued or computing; more are answered 429 (default {d.max_concurrent_requests})")
    p.add_argument("--request-timeout", type=float, default=d.request_timeout_s, metavar="S",
                   help=f"seconds a request may wait and compute before a 504 (default {d.request_timeout_s:g})")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes, help="largest request body (413 above)")
    p.add_argument("--max-items", "--max-client-batch-size", type=int, default=d.max_items,
                   help=f"texts or questions per request (413 above; default {d.max_items})")
    p.add_argument("--max-text-chars", type=int, default=d.max_text_chars, help="characters per text (413 above)")
    p.add_argument("--max-batch-items", type=int, default=d.max_batch_items,
                   help="items of concurrent requests merged into one model call")
    p.add_argument("--max-wait-ms", type=float, default=d.max_wait_ms,
                   help="how long a lone request waits for others to batch with (default 2 ms)")


def run(args: argparse.Namespace) -> int:
    import importlib.util

    from ..core.errors import BertlabError

    missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise BertlabError(f"`bertlab serve` needs {' and '.join(missing)}: pip install 'bertlab-paper[serve]'")
    if args.workers < 1:
        raise BertlabError(f"--workers must be at least 1, got {args.workers}")
    if args.api_key is not None and not args.api_key.strip():  # `--api-key "$KEY"` with KEY unset: not "no key"
        raise BertlabError(f"the API key (--api-key or ${API_KEY_ENV}) is empty; give a key, or leave both out to "
                           "serve without one")
    from ..infer.runtime import InferenceOptions, check_model_dir
    from ..infer.dynamic_batcher import Limits
    from ..infer.serve.process import ServeSpec, bind, serve

    limits = Limits(max_body_bytes=args.max_body_bytes, max_items=args.max_items, max_text_chars=args.max_text_chars,
                    max_batch_items=args.max_batch_items, max_wait_ms=args.max_wait_ms,
                    max_batch_tokens=args.max_batch_tokens, max_concurrent_requests=args.max_concurrent_requests,
                    request_timeout_s=args.request_timeout)
    # the service trims its heap now and then instead of keeping freed memory (infer/serve/service.py)
    options = dataclasses.replace(InferenceOptions.from_args(args), retain_freed_memory=False)
    spec = ServeSpec(check_model_dir(args.model), options, limits, args.pooling,
                     args.normalize, args.window_overlap, args.classify_model, args.qa_model, args.fill_mask_model,
                     args.api_key, args.served_model_name, args.generate_model)
    sock = bind(args.host, args.port)  # before loading: a busy port fails in a second, in one line
    port = sock.getsockname()[1]

    def announce(models) -> None:
        routes = "/v1/embeddings /embed /tokenize /info /health /metrics"
        if models is not None and models.classifier is not None:
            routes += " /predict /rerank /classify"
        if models is not None:
            routes += "".join(f" /{e}" for e in models.endpoints if e in ("qa", "fill-mask", "generate", "embed_sparse"))
        workers = f", {args.workers} workers" if args.workers > 1 else ""
        key = ", API key required" if args.api_key else ""
        print(f"bertlab serve: listening on http://{args.host}:{port}{workers}{key} -- {routes} "
              "(OpenAPI: /openapi.json)", flush=True)

    return serve(spec, sock, args.workers, log_level="warning", announce=announce)
