"""`bertlab serve --model DIR [--host 127.0.0.1] [--port 8000]`: the HTTP JSON service (see `bertlab.infer.serve`).

/embed always; /classify, /qa and /fill-mask when the model has that head or a folder is given for it;
/health; the OpenAPI description at /openapi.json. Needs the `serve` extra: `pip install 'bertlab[serve]'`.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..infer.embeddings import POOLINGS
    from ..infer.runtime import add_inference_arguments
    from ..infer.batcher import Limits

    add_inference_arguments(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    p.add_argument("--classify-model", metavar="DIR", help="a sequence-classification model for /classify")
    p.add_argument("--qa-model", metavar="DIR", help="a question-answering model for /qa")
    p.add_argument("--fill-mask-model", metavar="DIR", help="a masked-LM model for /fill-mask")
    p.add_argument("--generate-model", metavar="DIR", help="a T5 model for /generate")
    p.add_argument("--pooling", default="mean", choices=list(POOLINGS), help="/embed pooling (default mean)")
    p.add_argument("--no-normalize", action="store_true", help="/embed: do not L2-normalise the embeddings")
    d = Limits()
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes, help="largest request body (413 above)")
    p.add_argument("--max-items", type=int, default=d.max_items, help="texts or questions per request (413 above)")
    p.add_argument("--max-text-chars", type=int, default=d.max_text_chars, help="characters per text (413 above)")
    p.add_argument("--max-batch-items", type=int, default=d.max_batch_items,
                   help="items of concurrent requests merged into one model call")
    p.add_argument("--max-wait-ms", type=float, default=d.max_wait_ms,
                   help="how long a lone request waits for others to batch with (default 2 ms)")


def run(args: argparse.Namespace) -> int:
    import importlib.util

    from ..errors import BertlabError

    missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise BertlabError(f"`bertlab serve` needs {' and '.join(missing)}: pip install 'bertlab[serve]'")
    from ..infer.runtime import InferenceOptions
    from ..infer.serve import Limits, create_app, load_models, serve

    limits = Limits(args.max_body_bytes, args.max_items, args.max_text_chars, args.max_batch_items, args.max_wait_ms)
    models = load_models(args.model, InferenceOptions.from_args(args), args.pooling, not args.no_normalize,
                         args.classify_model, args.qa_model, args.fill_mask_model, args.generate_model)
    print(f"bertlab serve: {', '.join('/' + e for e in models.endpoints)} on http://{args.host}:{args.port} "
          f"(OpenAPI: /openapi.json)", flush=True)
    serve(create_app(models, limits), args.host, args.port, log_level="warning")
    return 0
