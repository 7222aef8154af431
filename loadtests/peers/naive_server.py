"""The naive peer: what a user might write in an afternoon instead of bertserve, served for comparison only.

FastAPI + Hugging Face `transformers` on PyTorch (eager, fp32, default threads), one request at a time (a lock
around the model), no batching, no queue limit, no timeouts. Same REST paths and answer shapes as the service
(`POST /classify`, `/qa`, `/ner`, `/embed`, `/v1/embeddings`), so the same locust users drive both. /classify
and /ner are the `text-classification` and `token-classification` pipelines. transformers 5 removed the
`question-answering` pipeline, so /qa is what its users now write by hand (`NaiveQA`): the tokenizer's
overflowing windows of 384 tokens with stride 128 (the old pipeline's defaults), one forward pass over the
windows of a request, and the best span of the top-20 start x end logits, as the Hugging Face course's
question-answering chapter decodes it. /embed and /v1/embeddings are what the sentence-transformers model card
shows for use with plain `transformers` (`NaiveEmbed`): AutoModel, mean pooling of the token states under the
attention mask, L2 normalization; TEI's and OpenAI's answer shapes. It adds `x-queue-time-ms` (waiting for the
lock) and `x-inference-time-ms` (the model call) headers so the report can show where its time goes. `GET
/health` answers once the models are loaded.

Model folders: a full Hugging Face checkpoint is used as it is; a project model name or composite folder
(base + adapter + head, see bert_model/adapters.py) is first saved as a plain checkpoint under
`--cache-dir` with our `save_pretrained` (which writes Hugging Face's layout), and rebuilt when the source
changes. This peer may use torch: it is not part of the product.
References: https://huggingface.co/docs/transformers/main_classes/pipelines,
https://huggingface.co/learn/llm-course/chapter7/7 (question answering: windows and span decoding).
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

import bert_model.tasks.defaults as defaults

PIPELINE_TASKS = {"classify": "text-classification", "ner": "token-classification"}
TASKS = ("classify", "qa", "ner", "embed")
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
FULL_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
DEFAULT_CACHE = Path(__file__).resolve().parents[2] / "artifacts" / "peer"
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
    from bert_model.modeling import BertModel

    model_class = {
        "classify": BertForSequenceClassification,
        "qa": BertForQuestionAnswering,
        "ner": BertForTokenClassification,
        "embed": BertModel,
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


class NaiveQA:
    """Question + context -> the best answer span, written by hand over `transformers` (no QA pipeline in v5)."""

    def __init__(
        self,
        folder: str,
        max_length: int = defaults.QA_MAX_SEQ_LENGTH,
        stride: int = defaults.QA_DOC_STRIDE,
        n_best: int = 20,
        max_answer_len: int = defaults.QA_MAX_ANSWER_LENGTH,
    ) -> None:
        from transformers import AutoModelForQuestionAnswering, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForQuestionAnswering.from_pretrained(folder).eval()
        self.max_length, self.stride, self.n_best, self.max_answer_len = max_length, stride, n_best, max_answer_len

    def __call__(self, question: str, context: str) -> dict[str, Any]:
        import torch

        encoded = self.tokenizer(
            question,
            context,
            truncation="only_second",
            max_length=self.max_length,
            stride=self.stride,
            return_overflowing_tokens=True,
            return_offsets_mapping=True,
            padding=True,
            return_tensors="pt",
        )
        offsets = encoded.pop("offset_mapping").tolist()
        encoded.pop("overflow_to_sample_mapping", None)
        with torch.no_grad():
            output = self.model(**encoded)
        starts = torch.softmax(output.start_logits, dim=-1).numpy()
        ends = torch.softmax(output.end_logits, dim=-1).numpy()
        best_score, start, end = 0.0, 0, 0
        for window in range(len(offsets)):
            in_context = [sid == 1 for sid in encoded.sequence_ids(window)]
            span = self._best_span(starts[window], ends[window], in_context)
            if span is not None and span[0] > best_score:
                best_score, start, end = span[0], offsets[window][span[1]][0], offsets[window][span[2]][1]
        return {"answer": context[start:end], "score": best_score, "start": start, "end": end}

    def _best_span(self, starts: Any, ends: Any, in_context: list[bool]) -> tuple[float, int, int] | None:
        """(probability, first token, last token) of the best valid span among the top start x end tokens."""
        best = None
        for s in starts.argsort()[::-1][: self.n_best]:
            for e in ends.argsort()[::-1][: self.n_best]:
                if not (in_context[s] and in_context[e]) or e < s or e - s + 1 > self.max_answer_len:
                    continue
                score = float(starts[s] * ends[e])
                if best is None or score > best[0]:
                    best = (score, int(s), int(e))
        return best


class NaiveEmbed:
    """Texts -> unit-length sentence vectors: `transformers` + mean pooling, as sentence-transformers computes."""

    def __init__(self, folder: str) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModel.from_pretrained(folder).eval()

    def __call__(self, texts: list[str]) -> list[list[float]]:
        import torch

        encoded = self.tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
        with torch.no_grad():
            states = self.model(**encoded).last_hidden_state  # (B, S, H)
        mask = encoded["attention_mask"].unsqueeze(-1).float()
        pooled = (states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2, dim=1).tolist()


def _load(task: str, folder: str) -> Any:
    """The callable that answers `task` with the model in `folder`."""
    if task == "qa":
        return NaiveQA(folder)
    if task == "embed":
        return NaiveEmbed(folder)
    from transformers import pipeline

    return pipeline(PIPELINE_TASKS[task], model=folder, device="cpu")  # type: ignore[call-overload]


def _plain(value: Any) -> Any:
    """numpy scalars in pipeline outputs -> JSON numbers."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value.item() if hasattr(value, "item") else value


def create_app(models: dict[str, str], cache_dir: Path = DEFAULT_CACHE) -> FastAPI:
    """The naive FastAPI app serving one pipeline per task in `models` (task -> model name or folder)."""
    pipes = {task: _load(task, str(hf_checkpoint(model, task, cache_dir))) for task, model in models.items()}
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
        """The best answer span (answer, score, start, end), as the old question-answering pipeline gave it."""
        return run("qa", response, question=body["question"], context=body["context"])

    @app.post("/ner")
    def ner(body: dict, response: Response) -> Any:
        """Entities grouped the simple way, like the token-classification pipeline."""
        return run("ner", response, inputs=body["inputs"], aggregation_strategy="simple")

    @app.post("/embed")
    def embed(body: dict, response: Response) -> Any:
        """One unit-length mean-pooled vector per input, as text-embeddings-inference answers."""
        inputs = body["inputs"]
        return run("embed", response, texts=[inputs] if isinstance(inputs, str) else inputs)

    @app.post("/v1/embeddings")
    def openai_embeddings(body: dict, response: Response) -> Any:
        """The same vectors in OpenAI's embeddings answer (floats; usage not counted)."""
        inputs = body["input"]
        vectors = run("embed", response, texts=[inputs] if isinstance(inputs, str) else inputs)
        data = [{"object": "embedding", "embedding": vector, "index": i} for i, vector in enumerate(vectors)]
        return {"object": "list", "data": data, "model": "naive", "usage": {"prompt_tokens": 0, "total_tokens": 0}}

    @app.get("/health")
    def health() -> dict[str, str]:
        """The models are loaded."""
        return {"status": "ready"}

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--model", action="append", default=[], help="TASK=NAME_OR_FOLDER (classify, qa, ner, embed)")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    models = dict(item.split("=", 1) for item in args.model)
    unknown = sorted(set(models) - set(TASKS))
    if not models or unknown:
        parser.error(f"give --model TASK=NAME with TASK in {list(TASKS)} (got {args.model})")
    import uvicorn

    uvicorn.run(create_app(models, args.cache_dir), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
