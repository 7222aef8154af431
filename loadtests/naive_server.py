"""The naive peer: what a user might write in an afternoon instead of bertserve, served for comparison only.

FastAPI + Hugging Face `transformers` pipelines on PyTorch (eager, fp32, default threads), one request at a
time (a lock around the model), no batching, no queue limit, no timeouts. Same REST paths and answer shapes
as the service (`POST /classify`, `/qa`, `/ner`), so the same locust users drive both. It adds
`x-queue-time-ms` (waiting for the lock) and `x-inference-time-ms` (the pipeline call) headers so the report
can show where its time goes. `GET /health` answers once the models are loaded.

Model folders: a full Hugging Face checkpoint is used as it is; a project model name or composite folder
(base + adapter + head, see bert_model/adapters.py) is first saved as a plain checkpoint under
`--cache-dir` with our `save_pretrained` (which writes Hugging Face's layout), and rebuilt when the source
changes. This peer may use torch: it is not part of the product.
Reference: https://huggingface.co/docs/transformers/main_classes/pipelines
"""

from __future__ import annotations

import argparse
import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Response

PIPELINE_TASKS = {"classify": "text-classification", "qa": "question-answering", "ner": "token-classification"}
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
FULL_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
DEFAULT_CACHE = Path(__file__).resolve().parents[1] / "artifacts" / "peer"
SOURCE_FILE = "source.json"


def _is_plain_checkpoint(folder: Path) -> bool:
    config = json.loads((folder / "config.json").read_text())
    return "bertserve" not in config and any((folder / name).is_file() for name in FULL_WEIGHTS)


def hf_checkpoint(name_or_path: str, task: str, cache_dir: Path = DEFAULT_CACHE) -> Path:
    """A folder `transformers` can load for this model: itself, or a plain copy saved under `cache_dir`."""
    from bert_model.registry import resolve_model_path

    folder = resolve_model_path(name_or_path)
    if _is_plain_checkpoint(folder):
        return folder
    target = cache_dir / folder.name
    stamp = _fingerprint(folder)
    if (target / "model.safetensors").is_file() and _read_stamp(target) == stamp:
        return target
    from bert_model.heads import BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification

    model_class = {
        "classify": BertForSequenceClassification,
        "qa": BertForQuestionAnswering,
        "ner": BertForTokenClassification,
    }[task]
    scratch = cache_dir / f".{folder.name}.tmp"
    shutil.rmtree(scratch, ignore_errors=True)
    model_class.from_pretrained(folder).save_pretrained(scratch)
    for name in TOKENIZER_FILES:
        if (folder / name).is_file():
            shutil.copy(folder / name, scratch / name)
    (scratch / SOURCE_FILE).write_text(json.dumps(stamp, indent=2))
    shutil.rmtree(target, ignore_errors=True)
    scratch.rename(target)
    return target


def _fingerprint(folder: Path) -> dict[str, Any]:
    """Where a cached plain checkpoint came from: the source folder and its files' sizes and times."""
    files = {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(folder.iterdir()) if p.is_file()}
    return {"source": str(folder), "files": files}


def _read_stamp(target: Path) -> dict[str, Any] | None:
    try:
        stamp: dict[str, Any] = json.loads((target / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return stamp


def _plain(value: Any) -> Any:
    """numpy scalars in pipeline outputs -> JSON numbers."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value.item() if hasattr(value, "item") else value


def create_app(models: dict[str, str], cache_dir: Path = DEFAULT_CACHE) -> FastAPI:
    """The naive FastAPI app serving one pipeline per task in `models` (task -> model name or folder)."""
    from transformers import pipeline

    pipes: dict[str, Any] = {}
    for task, model in models.items():
        folder = str(hf_checkpoint(model, task, cache_dir))
        pipes[task] = pipeline(PIPELINE_TASKS[task], model=folder, device="cpu")  # type: ignore[call-overload]
    lock = threading.Lock()
    app = FastAPI(title="naive BERT server (peer for load tests)")

    def run(task: str, response: Response, **kwargs: Any) -> Any:
        if task not in pipes:
            response.status_code = 404
            return {"error": f"no {task} model loaded"}
        queued = time.perf_counter()
        with lock:
            started = time.perf_counter()
            result = pipes[task](**kwargs)
            finished = time.perf_counter()
        response.headers["x-queue-time-ms"] = f"{(started - queued) * 1000:.3f}"
        response.headers["x-inference-time-ms"] = f"{(finished - started) * 1000:.3f}"
        return _plain(result)

    @app.post("/classify")
    def classify(body: dict, response: Response) -> Any:
        """Labels with scores, like the text-classification pipeline."""
        return run("classify", response, inputs=body["inputs"], truncation=True)

    @app.post("/qa")
    def qa(body: dict, response: Response) -> Any:
        """The best answer span, like the question-answering pipeline."""
        return run("qa", response, question=body["question"], context=body["context"])

    @app.post("/ner")
    def ner(body: dict, response: Response) -> Any:
        """Entities grouped the simple way, like the token-classification pipeline."""
        return run("ner", response, inputs=body["inputs"], aggregation_strategy="simple")

    @app.get("/health")
    def health() -> dict[str, str]:
        """The models are loaded."""
        return {"status": "ready"}

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--model", action="append", default=[], help="TASK=NAME_OR_FOLDER (classify, qa, ner)")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    models = dict(item.split("=", 1) for item in args.model)
    unknown = sorted(set(models) - set(PIPELINE_TASKS))
    if not models or unknown:
        parser.error(f"give --model TASK=NAME with TASK in {sorted(PIPELINE_TASKS)} (got {args.model})")
    import uvicorn

    uvicorn.run(create_app(models, args.cache_dir), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
