"""A variant's target as one folder the engine can load: the variant's files (a GGUF) and the target repo's
config and tokenizer files, which live in two snapshots of the models folder, linked side by side under
<models>/dflash-variants/. Links, not copies: a GGUF is gigabytes. Disk only, no network."""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from . import paths
from .catalog import CONFIG_FILES, Pair, Variant
from .downloads import find_cached


def folder_name(pair: Pair, variant: Variant) -> str:
    """Pair ids come from a catalog that may come from the network: only safe characters name the folder."""
    return "pair-" + re.sub(r"[^a-z0-9._-]", "_", pair.id.lower())[:80] + "-" + variant.id


def _link(src: Path, dst: Path) -> None:
    try:
        os.symlink(src.resolve(), dst)
    except OSError:              # Windows without the symlink right
        try:
            os.link(src.resolve(), dst)
        except OSError:          # another volume: only small files are ever copied
            if src.stat().st_size > 64 << 20:
                raise
            shutil.copy2(src, dst)


def assemble(pair: Pair, variant: Variant, cache_dir: Path | None = None) -> Path | None:
    """The folder for this pair's variant when its files and the target's config are downloaded, else None."""
    gguf = find_cached(variant.repo_id, variant.revision, cache_dir, files=variant.files)
    config = find_cached(pair.target.repo_id, pair.target.revision, cache_dir, files=CONFIG_FILES)
    if gguf is None or config is None:
        return None
    folder = (cache_dir or paths.models_dir()) / "dflash-variants" / folder_name(pair, variant)
    folder.mkdir(parents=True, exist_ok=True)
    wanted = {Path(f).name: gguf / f for f in variant.files}
    wanted.update({p.name: p for p in config.iterdir() if p.is_file() and p.suffix in (".json", ".txt", ".jinja")})
    for name, src in wanted.items():
        dst = folder / name
        if dst.is_symlink() or dst.exists():
            if dst.resolve() == src.resolve():
                continue
            dst.unlink()
        _link(src, dst)
    return folder
