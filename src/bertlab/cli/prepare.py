"""`bertlab prepare CORPUS... --vocab VOCAB --out DATA_DIR`: pre-training data, from raw text to instances.

    bertlab prepare wiki/ books.txt --vocab vocab.txt --out data/          # BERT: segment pairs, static masks
    bertlab prepare --out data/ --max-seq-length 512                       # phase 2 from the same shards
    bertlab prepare corpus.jsonl --vocab vocab.txt --out d/ --mode full-sentences --dynamic --masking span
    bertlab prepare corpus.txt --vocab roberta-vocab/ --out r/ --mode full-sentences --dynamic   # RoBERTa (BPE)
    bertlab prepare corpus.txt --vocab modernbert/ --out m/ --mode full-sentences --dynamic --masked-lm-prob 0.3
    bertlab prepare --out data/ --show 3                                   # print instances, Google-style
    bertlab prepare zh.txt --vocab vocab.txt --out d/ --masking whole-word --segmenter jieba   # Chinese WWM
    bertlab prepare corpus.txt --vocab spiece.model --out t5/ --objective span-corruption --show 2   # T5
    bertlab prepare --out data/ --objective prefix-lm --max-seq-length 128  # T5 objective, BERT's shards

Without CORPUS, the shards already in DATA_DIR are used, and settings not given are those of its current
instance set. Re-running with the same inputs and settings reuses everything.

--objective picks what the instances are for: BERT's (mlm+nsp: segment pairs; mlm: packed full sentences;
mlm+sop: sentence-order pairs, ALBERT's objective, for BERT and ALBERT models; mlm+sbo: SpanBERT's, packed
full sentences with span masking) or
one of T5's (span-corruption, iid-denoising, bert-style, mass-style, drop-tokens, deshuffle, prefix-lm:
documents packed into examples whose inputs fit --max-seq-length, default 512; the objective is applied anew
to every example each epoch when batches are made, from the seed and the position). --vocab may then also be
a SentencePiece model (spiece.model, or its folder).
"""

from __future__ import annotations

import argparse
import sys

from ..data.instances import MODES, NSP_MODES, ORDER_MODES, InstanceConfig
from ..data.masking import GRANULARITIES, MaskingConfig
from ..data.readers import CORPUS_FORMATS, CleaningConfig, DataError, ReaderConfig
from ..models.registry import corruptions, family

# Instance flags and their defaults. Defaults are applied after parsing, so that "not given" can be told from
# "given with the default value" (without CORPUS, flags not given keep the current instance set's values).
INSTANCE_DEFAULTS = {"mode": "segment-pair", "max_seq_length": 128, "short_seq_prob": 0.1, "nsp_balance": True,
                     "masking": "token", "masked_lm_prob": 0.15, "max_predictions_per_seq": None,
                     "replace_probs": "0.8,0.1,0.1", "dupe_factor": 10, "dynamic": False, "seed": 12345}
# T5 objectives: their parameters, and the instance flags that mean something to them.
T5_PARAMS = ("noise_density", "mean_span_length")
T5_INSTANCE_FLAGS = ("max_seq_length", "seed")
T5_MAX_SEQ_LENGTH = 512  # T5's inputs length
BERT_OBJECTIVE_MODES = {"mlm+nsp": "segment-pair", "mlm": "full-sentences",  # the default --mode of each
                        "mlm+sop": "segment-order", "mlm+sbo": "full-sentences"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.description = __doc__.split("\n\n", 1)[1]
    p.add_argument("corpus", nargs="*", metavar="CORPUS", help="text files or directories of them")
    p.add_argument("--vocab", metavar="VOCAB",
                   help="vocab.txt or a tokenizer folder; RoBERTa: a byte-level BPE folder (vocab.json + "
                        "merges.txt) or its tokenizer.json; a model folder (or tokenizer.json) whose family reads "
                        "its own tokenizer.json ([CLS] A [SEP] byte-level BPE: ModernBERT's); for T5 objectives a "
                        "SentencePiece model (spiece.model or its folder); needed with CORPUS")
    p.add_argument("--out", required=True, metavar="DATA_DIR", help="the data directory to write or update")
    g = p.add_argument_group("reading")
    g.add_argument("--format", choices=CORPUS_FORMATS, default="auto",
                   help="google: sentence per line, blank line between documents; plain: prose, a document per "
                        "file; jsonl: a document per line's 'text'; wikitext: ' = Title = ' starts documents "
                        "(default: auto, by name and content)")
    g.add_argument("--text-field", default="text", help="JSON Lines field holding the text (default: text)")
    g.add_argument("--clean", choices=["none", "c4"], default="none",
                   help="c4: terminal punctuation, no javascript / lorem ipsum / curly braces, de-duplicated "
                        "three-sentence spans, >= 5 words per line, >= 3 sentences per document")
    g.add_argument("--min-words", type=int, default=None, help="drop lines with fewer words (overrides --clean)")
    g.add_argument("--strict", action="store_true", help="stop at the first bad line instead of counting it")
    g.add_argument("--cased", action="store_true", help="keep case (for cased vocabularies; default lower-cases)")
    g.add_argument("--heldout-fraction", type=float, default=0.01,
                   help="fraction of documents held out for evaluation (default: 0.01)")
    g.add_argument("--segmenter", default=None, metavar="NAME",
                   help="word segmenter whose words group CJK characters for whole-word and span masking: "
                        "none (default; words are ## pieces only) or jieba (pip install 'bertlab-paper[zh]')")
    g = p.add_argument_group("instances")
    g.add_argument("--mode", choices=MODES, default=None, help="default: segment-pair (BERT)")
    g.add_argument("--max-seq-length", type=int, default=None, help="default: 128")
    g.add_argument("--short-seq-prob", type=float, default=None, help="segment-pair (default: 0.1)")
    g.add_argument("--no-nsp-balance", dest="nsp_balance", action="store_false", default=None,
                   help="segment-pair labels exactly as Google's script (IsNext slightly under 50%%)")
    g = p.add_argument_group("objective")
    g.add_argument("--objective", default=None, metavar="NAME",
                   help="mlm+nsp, mlm, mlm+sop or mlm+sbo (BERT's, ALBERT's and SpanBERT's: masks below), or a "
                        "T5 objective: "
                        f"{', '.join(corruptions())}")
    g.add_argument("--noise-density", type=float, default=None,
                   help="T5 objectives: share of the tokens corrupted (default 0.15)")
    g.add_argument("--mean-span-length", type=float, default=None,
                   help="span-corruption: mean length of a corrupted span in tokens (default 3)")
    g = p.add_argument_group("masking")
    g.add_argument("--masking", choices=GRANULARITIES, default=None, help="default: token")
    g.add_argument("--masked-lm-prob", type=float, default=None, help="default: 0.15")
    g.add_argument("--max-predictions-per-seq", type=int, default=None,
                   help="default: ceil(max_seq_length * masked_lm_prob), 20 for 128")
    g.add_argument("--replace-probs", default=None, metavar="MASK,RANDOM,KEEP",
                   help="what happens to a chosen token (default: 0.8,0.1,0.1)")
    x = g.add_mutually_exclusive_group()
    x.add_argument("--dupe-factor", type=int, default=None,
                   help="static masking: this many differently masked copies (default: 10)")
    x.add_argument("--dynamic", action="store_true", default=None, help="mask in the collator, anew every epoch")
    g.add_argument("--seed", type=int, default=None, help="random seed for instances and masks (default: 12345)")
    g = p.add_argument_group("running")
    g.add_argument("--workers", type=int, default=0, help="processes (default: every core)")
    g.add_argument("--show", type=int, default=0, metavar="N", help="print N instances, as Google's script does")
    g.add_argument("--quiet", action="store_true", help="no progress bars or summary")


def _instance_settings(args: argparse.Namespace, base: dict | None):
    """InstanceSettings from the flags given, on top of `base` (an existing set's settings) or the defaults."""
    from ..data.pipeline import InstanceSettings

    v = dict(INSTANCE_DEFAULTS)
    if base is not None:
        i, m = base["instances"], base["masking"]
        v.update(mode=i["mode"], max_seq_length=i["max_seq_length"], short_seq_prob=i["short_seq_prob"],
                 nsp_balance=i.get("nsp_balance", True), masking=m["granularity"], masked_lm_prob=m["masked_lm_prob"],
                 replace_probs=f"{m['mask_token_prob']},{m['random_token_prob']},"
                               f"{1 - m['mask_token_prob'] - m['random_token_prob']:.6g}",
                 dupe_factor=base["dupe_factor"], dynamic=base["dynamic"], seed=base["seed"])
        if args.max_seq_length in (None, i["max_seq_length"]) and args.masked_lm_prob is None:
            v["max_predictions_per_seq"] = m["max_predictions_per_seq"]
    for key in INSTANCE_DEFAULTS:
        given = getattr(args, key, None)
        if given is not None:
            v[key] = given
    if args.dupe_factor is not None:
        v["dynamic"] = False
    try:
        mask_p, random_p, keep_p = (float(x) for x in v["replace_probs"].split(","))
    except ValueError:
        raise DataError(f"--replace-probs: expected three numbers MASK,RANDOM,KEEP, got {v['replace_probs']!r}") \
            from None
    if abs(mask_p + random_p + keep_p - 1.0) > 1e-6:
        raise DataError(f"--replace-probs: {v['replace_probs']} does not sum to 1")
    instances = InstanceConfig(v["mode"], v["max_seq_length"], v["short_seq_prob"], v["nsp_balance"])
    masking = MaskingConfig.for_length(v["max_seq_length"], granularity=v["masking"],
                                       masked_lm_prob=v["masked_lm_prob"],
                                       max_predictions_per_seq=v["max_predictions_per_seq"],
                                       mask_token_prob=mask_p, random_token_prob=random_p)
    return InstanceSettings(instances, masking, dynamic=bool(v["dynamic"]), dupe_factor=v["dupe_factor"],
                            seed=v["seed"])


def _check_objective(args: argparse.Namespace) -> None:
    """An unknown --objective, or flags that do not go with it: one line. A BERT objective sets --mode's
    default (segment pairs for mlm+nsp, packed full sentences for mlm)."""
    name = args.objective
    if name is not None and name not in corruptions() and name not in BERT_OBJECTIVE_MODES:
        names = [*BERT_OBJECTIVE_MODES, *corruptions()]
        raise DataError(f"--objective: unknown {name!r}; expected one of {', '.join(names)}")
    given = [k for k in T5_PARAMS if getattr(args, k) is not None]
    if name in BERT_OBJECTIVE_MODES or (name is None and given and not args.out_is_text_to_text):
        if given:
            raise DataError(f"--{given[0].replace('_', '-')} is a T5 objective's parameter "
                            f"(--objective {', '.join(corruptions())})")
        if name == "mlm+nsp" and args.mode is not None and args.mode not in NSP_MODES:
            raise DataError(f"--objective mlm+nsp needs next-sentence pairs: --mode {' or '.join(NSP_MODES)}, "
                            f"not {args.mode}")
        if name == "mlm+sop" and args.mode is not None and args.mode not in ORDER_MODES:
            raise DataError(f"--objective mlm+sop needs sentence-order pairs: --mode {' or '.join(ORDER_MODES)}, "
                            f"not {args.mode}")
        if name == "mlm+sbo" and args.mode is not None and args.mode in (*NSP_MODES, *ORDER_MODES):
            raise DataError(f"--objective mlm+sbo trains on single segments, not {args.mode} pairs")
        if name == "mlm+sbo" and args.masking not in (None, "span"):
            raise DataError(f"--objective mlm+sbo needs --masking span, not {args.masking}")
        if name == "mlm+sbo":
            args.masking = "span"
        if name is not None and args.mode is None:
            args.mode = BERT_OBJECTIVE_MODES[name]


def _text_to_text_settings(args: argparse.Namespace, base: dict | None):
    """T5 objective settings from the flags given, on top of `base` (an existing text-to-text set's) or the
    defaults; BERT-only flags are refused."""
    from ..data.t5_data import TextToTextSettings, is_text_to_text

    bert_only = [k for k in INSTANCE_DEFAULTS if k not in T5_INSTANCE_FLAGS and getattr(args, k, None) is not None]
    if bert_only:
        raise DataError(f"--{bert_only[0].replace('_', '-')} is a masked-LM instance setting; it does not apply to "
                        f"--objective {args.objective}")
    params: dict = {}
    max_seq_length, seed = T5_MAX_SEQ_LENGTH, INSTANCE_DEFAULTS["seed"]
    if base is not None and is_text_to_text(base):
        max_seq_length, seed = base["instances"]["max_seq_length"], base["seed"]
        if args.objective in (None, base["objective"]["name"]):
            params = {k: v for k, v in base["objective"].items() if k != "name"}
    name = args.objective or base["objective"]["name"]
    params.update({k: getattr(args, k) for k in T5_PARAMS if getattr(args, k) is not None})
    return TextToTextSettings(corruptions()[name].make(name, **params),
                              args.max_seq_length if args.max_seq_length is not None else max_seq_length,
                              args.seed if args.seed is not None else seed)


def run(args: argparse.Namespace) -> int:
    from ..data.pipeline import CorpusSettings, prepare
    from ..data.shards import MANIFEST, load_manifest, select_instance_set
    from ..data.t5_data import is_text_to_text

    say = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr))
    instance_flags = any(getattr(args, k, None) is not None for k in (*INSTANCE_DEFAULTS, *T5_PARAMS, "objective"))
    base = None
    if not args.corpus:
        if not (args.out and (__import__("pathlib").Path(args.out) / MANIFEST).exists()):
            raise DataError(f"{args.out}: no prepared data here; give CORPUS files and --vocab to make some")
        manifest = load_manifest(args.out)
        base = select_instance_set(manifest, args.out)
        if args.show and not instance_flags:
            return show(args.out, args.show, base["name"])
        have = manifest["corpus"]["settings"].get("segmenter", {}).get("name", "none")
        if args.segmenter is not None and args.segmenter != have:
            raise DataError(f"{args.out}: the token shards were made with --segmenter {have}; give CORPUS "
                            f"again to tokenize it with --segmenter {args.segmenter}")
    args.out_is_text_to_text = base is not None and is_text_to_text(base)
    _check_objective(args)
    text_to_text = args.objective in corruptions() or (args.objective is None and args.out_is_text_to_text)
    if text_to_text:
        settings = _text_to_text_settings(args, base)
    if not args.corpus:
        if not text_to_text:
            settings = _instance_settings(args, None if args.out_is_text_to_text else base)
        corpus_settings = None
    else:
        if not args.vocab:
            raise DataError("--vocab is required with CORPUS (the vocab.txt to tokenize with)")
        if not text_to_text:
            settings = _instance_settings(args, None)
        cleaning = CleaningConfig.c4() if args.clean == "c4" else CleaningConfig()
        if args.min_words is not None:
            cleaning = CleaningConfig(**{**cleaning.__dict__, "min_words_per_line": args.min_words})
        reader = ReaderConfig(format=args.format, text_field=args.text_field, cleaning=cleaning, strict=args.strict)
        corpus_settings = CorpusSettings(reader=reader, heldout_fraction=args.heldout_fraction,
                                         do_lower_case=False if args.cased else None,
                                         segmenter=args.segmenter or "none")
    result = prepare(args.corpus, args.vocab, args.out, corpus_settings, settings, workers=args.workers or None,
                     progress=False if args.quiet else None, echo=say)
    iset = next(s for s in result.manifest["instance_sets"] if s["name"] == result.instance_set)
    say(f"{result.data_dir}: {result.tokens:,} tokens; instance set {iset['name']}: "
        f"{iset['splits']['train']['instances']:,} train, {iset['splits']['heldout']['instances']:,} held-out")
    if text_to_text:
        i = iset["instances"]
        say(f"objective {iset['objective']['name']}: {i['source_length']} tokens per example -> inputs of at most "
            f"{i['max_seq_length']}, targets of at most {i['targets_length']} tokens (eos included)")
    if args.show:
        show(args.out, args.show, iset["name"])
    return 0


def show(data_dir: str, n: int, instance_set: str | None = None) -> int:
    """Print the first n training instances as the loader serves them: BERT's in the layout of Google's
    `TrainingInstance.__str__`, text-to-text ones as `inputs: ...` / `targets: ...` token lines."""
    from ..data.shards import load_manifest, select_instance_set
    from ..data.t5_data import is_text_to_text

    if is_text_to_text(select_instance_set(load_manifest(data_dir), data_dir, name=instance_set)):
        return show_text_to_text(data_dir, n, instance_set)
    return show_bert(data_dir, n, instance_set)


def show_text_to_text(data_dir: str, n: int, instance_set: str | None = None) -> int:
    """Print the first n training examples of a text-to-text set, corrupted as the first epoch sees them: two
    lines of space-separated tokens each, sentinels written `<extra_id_N>`."""
    from ..data.t5_loader import TextToTextDataset

    ds = TextToTextDataset(data_dir, "train", instance_set=instance_set, shuffle=False, epochs=1, batch_size=1)
    _, load_tokenizer = family(corruptions()[ds.info.objective.name].model_type).text_to_text("prepare --show")
    tok = load_tokenizer(ds.info.vocab_file)
    collate = ds.collator()
    params = ", ".join(f"{k} {v:g}" for k, v in ds.info.objective.params().items())
    print(f"# {ds.info.instance_set}: {ds.num_instances:,} training examples; objective "
          f"{ds.info.objective.name}{' (' + params + ')' if params else ''}")
    for position in range(min(n, ds.num_instances)):
        pair = collate.pair(ds.example_at(position))
        print(f"inputs: {' '.join(tok.convert_ids_to_tokens(pair.inputs))}")
        print(f"targets: {' '.join(tok.convert_ids_to_tokens(pair.targets))}")
        print()
    return 0


def show_bert(data_dir: str, n: int, instance_set: str | None = None) -> int:
    """Print the first n training instances as the loader serves them (masks applied), in the layout of
    Google's `TrainingInstance.__str__`."""
    from ..data.loader import PretrainingDataset
    from ..data.masking import vocabulary_tokens

    ds = PretrainingDataset(data_dir, "train", seed=0, instance_set=instance_set, shuffle=False, epochs=1,
                            batch_size=1)
    vocab = vocabulary_tokens(ds.info.vocab_file)  # vocab.txt, or a BPE vocab.json
    collate = ds.collator(pad_to_multiple_of=1)
    print(f"# {ds.info.instance_set}: {ds.num_instances:,} training instances")
    for position in range(min(n, ds.num_instances)):
        batch = collate([ds.example_at(position)])
        ids, types, labels = (batch[k][0].tolist() for k in ("input_ids", "token_type_ids", "labels"))
        masked = [i for i, label in enumerate(labels) if label != -100]
        nsp = batch.get("next_sentence_label")
        print(f"tokens: {' '.join(vocab[i] for i in ids)}")
        print(f"segment_ids: {' '.join(str(t) for t in types)}")
        print(f"is_random_next: {bool(nsp[0]) if nsp is not None else 'None (no next-sentence prediction)'}")
        print(f"masked_lm_positions: {' '.join(str(i) for i in masked)}")
        print(f"masked_lm_labels: {' '.join(vocab[labels[i]] for i in masked)}")
        print()
    return 0
