"""Finding and opening serving bundles (the contract is `bundles.spec`): manifest + tokenizer.

`--models` entries may be a bundle folder (has manifest.json), a folder of bundles (every child with a
manifest), or a bundle name looked up under `bundles_dir` (default `artifacts/bundles/`, written by
`make bundles`). An entry ending in `?` is optional: served when it exists, skipped (with a log line) when it
does not. Errors name the entry and what would fix it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from bert_model.tokenization import BertTokenizer
from bundles.spec import MANIFEST_FILE, TOKENIZER_DIR, BundleManifest

log = logging.getLogger(__name__)

OPTIONAL = "?"
SERVED_TASKS = ("classify", "qa", "ner", "embed", "fill-mask", "rerank")


@dataclass
class ServingBundle:
    """An opened bundle: where it is, its manifest, its tokenizer."""

    path: Path
    manifest: BundleManifest
    tokenizer: BertTokenizer

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def task(self) -> str:
        return self.manifest.task


def find_bundles(entries: list[str], bundles_dir: Path) -> list[Path]:
    """Bundle folders for `--models` entries, in order, without duplicates."""
    found: list[Path] = []
    for entry in entries:
        optional = entry.endswith(OPTIONAL)
        try:
            paths = _expand(entry.removesuffix(OPTIONAL), bundles_dir)
        except FileNotFoundError as error:
            if not optional:
                raise
            log.info("optional model not served: %s", error)
            continue
        for path in paths:
            if path not in found:
                found.append(path)
    if not found:
        raise FileNotFoundError(f"none of the optional models {', '.join(entries)} exists under {bundles_dir}")
    return found


def _expand(entry: str, bundles_dir: Path) -> list[Path]:
    candidate = Path(entry).expanduser()
    if (candidate / MANIFEST_FILE).is_file():
        return [candidate.resolve()]
    if candidate.is_dir():
        children = sorted(child.resolve() for child in candidate.iterdir() if (child / MANIFEST_FILE).is_file())
        if children:
            return children
        raise FileNotFoundError(f"{candidate} is neither a serving bundle (no {MANIFEST_FILE}) nor a folder of bundles")
    named = bundles_dir / entry
    if (named / MANIFEST_FILE).is_file():
        return [named.resolve()]
    raise FileNotFoundError(
        f"no serving bundle {entry!r}: not a folder, and not found under {bundles_dir} "
        "(build the default bundles with `make bundles`, or pass bundle folders with --models)"
    )


def open_bundle(path: Path) -> ServingBundle:
    """Read and validate the manifest and load the tokenizer; raise ValueError for a task we do not serve."""
    manifest = BundleManifest.read(path)
    if manifest.task not in SERVED_TASKS:
        raise ValueError(f"bundle {path} is a {manifest.task!r} model; this service serves {SERVED_TASKS}")
    tokenizer_dir = path / TOKENIZER_DIR
    if not tokenizer_dir.is_dir():
        raise FileNotFoundError(f"bundle {path} has no {TOKENIZER_DIR}/ folder")
    tokenizer = BertTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.model_max_length = max(tokenizer.model_max_length, manifest.max_seq_length)
    return ServingBundle(path=path, manifest=manifest, tokenizer=tokenizer)
