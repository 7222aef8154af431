"""`bertserve retrieval-eval`: question -> paragraph retrieval on SQuAD through the running service's `/embed`
and through sentence-transformers, scored with `bert_model.tasks.retrieval` (recall@k over a cosine ranking); with
`--rerank MODEL`, also the two-stage pipeline through the service: the embeddings' top-k paragraphs of each
question reranked by the cross-encoder `MODEL` over `POST /rerank`, with its latency per query; with
`--reference-rerank MODEL`, the same pipeline in-process: sentence-transformers' embeddings, reranked by `MODEL` in
PyTorch (`bert_model`, the model the bundle is exported from), so the served pipeline has a reference too.

The service side talks only over the wire (HTTP, to this machine only: `loadtests.loopback`); the reference side
loads sentence-transformers (a test-only dependency, imported inside the function) on the same checkpoint folder
the bundle was exported from. Both embed the same texts with the same truncation (the model's own length, 256
tokens for all-MiniLM-L6-v2), so the difference between their recall@k is what the bundle's variant costs. The
command is a thin wrapper in `bertserve.commands.finetune`, beside `bertserve evaluate`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bert_model.tasks.retrieval import RetrievalSet, ranking_metrics, recall_at_k, squad_retrieval_set, top_candidates
from bertserve.cli_errors import exit_on_user_error
from loadtests.loopback import check_http_url

Embed = Callable[[list[str]], np.ndarray]
DEFAULT_KS = (1, 5)


def embed_over_http(
    url: str, *, model: str | None = None, batch_size: int = 32, api_key: str | None = None, timeout_s: float = 300.0
) -> Embed:
    """A function embedding texts through `POST {url}/embed` (TEI's body), `batch_size` texts per request,
    cut to the model's length (`truncate: true`), unit length (`normalize: true`)."""
    import httpx

    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}

    def embed(texts: list[str]) -> np.ndarray:
        rows: list[list[float]] = []
        with httpx.Client(base_url=url, headers=headers, timeout=timeout_s) as client:
            for start in range(0, len(texts), batch_size):
                body: dict[str, Any] = {"inputs": texts[start : start + batch_size], "truncate": True}
                body.update(normalize=True, **({"model": model} if model else {}))
                answer = client.post("/embed", json=body)
                if answer.status_code != 200:
                    raise RuntimeError(f"POST {url}/embed answered {answer.status_code}: {answer.text[:300]}")
                rows.extend(answer.json())
        return np.asarray(rows, dtype=np.float32)

    return embed


def served_model(url: str, model: str | None, api_key: str | None = None) -> dict[str, Any]:
    """The `GET /models` entry of `model` (None: the default embed model): its name, variant, length."""
    import httpx

    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    models = httpx.get(f"{url}/models", headers=headers, timeout=30).json()["models"]
    for entry in models:
        if entry["task"] == "embed" and (entry["name"] == model or (model is None and entry["is_default"])):
            return {key: entry[key] for key in ("name", "variant", "max_seq_length", "backend")}
    raise ValueError(f"{url} serves no embed model {model or '(default)'}: {[m['name'] for m in models]}")


def embed_with_sentence_transformers(model: str | Path, *, batch_size: int = 32) -> Embed:
    """A function embedding texts with sentence-transformers on the CPU (its own truncation and pooling,
    `normalize_embeddings=True`); `model` is a folder or a built-in name such as `minilm`."""
    from sentence_transformers import SentenceTransformer

    from bert_model.registry import resolve_model_path

    encoder = SentenceTransformer(str(resolve_model_path(model)), device="cpu")

    def embed(texts: list[str]) -> np.ndarray:
        return np.asarray(encoder.encode(texts, batch_size=batch_size, normalize_embeddings=True), dtype=np.float32)

    return embed


def evaluate(embed: Embed, retrieval_set: RetrievalSet, ks: Sequence[int] = DEFAULT_KS) -> dict[str, float]:
    """recall@k (percent), MRR and counts of `retrieval_set` with vectors from `embed`, and the seconds spent."""
    started = time.perf_counter()
    questions = embed(retrieval_set.questions)
    paragraphs = embed(retrieval_set.paragraphs)
    metrics = recall_at_k(questions, paragraphs, retrieval_set.gold, ks=ks)
    metrics["seconds"] = round(time.perf_counter() - started, 1)
    return metrics


def rerank_over_http(url: str, model: str, api_key: str | None = None, timeout_s: float = 300.0) -> Rerank:
    """A function ranking passages for a query through `POST {url}/rerank` (TEI's body) with the cross-encoder
    `model`, passages cut to the model's length."""
    import httpx

    client = httpx.Client(base_url=url, headers={"authorization": f"Bearer {api_key}"} if api_key else {},
                          timeout=timeout_s)  # fmt: skip

    def rerank(query: str, passages: list[str]) -> list[int]:
        answer = client.post("/rerank", json={"query": query, "texts": passages, "model": model, "truncate": True})
        if answer.status_code != 200:
            raise RuntimeError(f"POST {url}/rerank answered {answer.status_code}: {answer.text[:300]}")
        return [rank["index"] for rank in answer.json()]

    return rerank


Rerank = Callable[[str, list[str]], list[int]]


def rerank_in_process(model: str | Path, *, batch_size: int = 32) -> Rerank:
    """A function ranking passages for a query with the cross-encoder `model` (a folder or built-in name) in
    PyTorch fp32: pairs built and cut as the service builds them (`bert_model.tasks.rerank`), to the length the
    model was fine-tuned with (its stored `max_seq_length`; else 512 or the model's limit)."""
    from bert_model.config import BertConfig
    from bert_model.finetuning.inference import predict_rows
    from bert_model.finetuning.recipes import stored_settings
    from bert_model.heads import BertForSequenceClassification
    from bert_model.registry import resolve_model_path
    from bert_model.tasks.rerank import build_rerank_features, rerank_postprocess
    from bert_model.tokenization import BertTokenizer

    folder = resolve_model_path(model)
    config = BertConfig.load(folder)
    length = min(int(stored_settings(config).get("max_seq_length", 512)), config.max_sequence_length)
    tokenizer = BertTokenizer.from_pretrained(folder)
    network = BertForSequenceClassification.from_pretrained(folder).eval()

    def rerank(query: str, passages: list[str]) -> list[int]:
        features = build_rerank_features(tokenizer, query, passages, max_seq_length=length)
        rows = predict_rows(network, features, ("logits",), pad_id=tokenizer.pad_id, batch_size=batch_size)
        return [rank["index"] for rank in rerank_postprocess(features, rows["logits"])]

    return rerank


def evaluate_two_stage(
    embed: Embed, rerank: Rerank, retrieval_set: RetrievalSet, top_k: int, ks: Sequence[int] = DEFAULT_KS
) -> dict[str, Any]:
    """Embeddings alone vs the embeddings' top `top_k` reranked: recall@k and MRR@10 of both (percent), and the
    rerank stage's latency per query (ms, p50 / p99 / mean)."""
    questions = embed(retrieval_set.questions)
    paragraphs = embed(retrieval_set.paragraphs)
    candidates = top_candidates(questions, paragraphs, top_k)
    reranked, latencies = [], []
    for question, row in zip(retrieval_set.questions, candidates, strict=True):
        started = time.perf_counter()
        order = rerank(question, [retrieval_set.paragraphs[i] for i in row])
        latencies.append((time.perf_counter() - started) * 1000)
        reranked.append([int(row[i]) for i in order])
    return {
        "top_k": top_k,
        "embeddings": ranking_metrics(candidates.tolist(), retrieval_set.gold, ks),
        "reranked": ranking_metrics(reranked, retrieval_set.gold, ks),
        "rerank_ms_per_query": {
            "p50": round(float(np.percentile(latencies, 50)), 2),
            "p99": round(float(np.percentile(latencies, 99)), 2),
            "mean": round(float(np.mean(latencies)), 2),
        },
    }


def _service_side(
    url: str,
    model: str | None,
    batch_size: int,
    api_key: str | None,
    retrieval_set: RetrievalSet,
    rerank: str | None,
    top_k: int,
    echo: Callable[[str], None],
) -> dict[str, Any]:
    """The service's embeddings, and with `rerank` its two-stage pipeline."""
    embed = embed_over_http(url, model=model, batch_size=batch_size, api_key=api_key)
    results: dict[str, Any] = {"service": {**served_model(url, model, api_key), **evaluate(embed, retrieval_set)}}
    echo(json.dumps({"service": results["service"]}))
    if rerank is not None:
        results["two_stage"] = {"rerank_model": rerank, **evaluate_two_stage(
            embed, rerank_over_http(url, rerank, api_key), retrieval_set, top_k)}  # fmt: skip
        echo(json.dumps({"two_stage": results["two_stage"]}))
    return results


def _reference_side(
    reference: str,
    batch_size: int,
    retrieval_set: RetrievalSet,
    reference_rerank: str | None,
    top_k: int,
    echo: Callable[[str], None],
) -> dict[str, Any]:
    """sentence-transformers' embeddings, and with `reference_rerank` the two-stage pipeline in-process."""
    embed = embed_with_sentence_transformers(reference, batch_size=batch_size)
    results: dict[str, Any] = {"sentence-transformers": {"model": reference, **evaluate(embed, retrieval_set)}}
    echo(json.dumps({"sentence-transformers": results["sentence-transformers"]}))
    if reference_rerank is not None:
        results["two_stage_in_process"] = {"rerank_model": reference_rerank, **evaluate_two_stage(
            embed, rerank_in_process(reference_rerank), retrieval_set, top_k)}  # fmt: skip
        echo(json.dumps({"two_stage_in_process": results["two_stage_in_process"]}))
    return results


def run_retrieval_eval(
    squad: Path,
    *,
    host: str | None,
    model: str | None,
    reference: str | None,
    max_paragraphs: int | None,
    batch_size: int,
    api_key: str | None,
    out: Path | None,
    echo: Callable[[str], None] = print,
    rerank: str | None = None,
    top_k: int = 20,
    reference_rerank: str | None = None,
) -> dict[str, Any]:
    """Score the service at `host` and / or sentence-transformers on `reference`; `echo` each side's JSON line.
    Input errors exit with a one-line message (`exit_on_user_error`) before any work."""
    from bert_model.tasks.readers import read_squad

    with exit_on_user_error():
        if host is None and reference is None:
            raise ValueError("give --host (the service) or --reference (sentence-transformers), or both")
        if rerank is not None and host is None:
            raise ValueError("--rerank needs --host: the reranker is the service's")
        if reference_rerank is not None and reference is None:
            raise ValueError("--reference-rerank needs --reference: the embeddings it reranks")
        if top_k < 1:
            raise ValueError(f"--top-k must be at least 1, got {top_k}")
        url = check_http_url(host) if host is not None else None
        retrieval_set = squad_retrieval_set(read_squad(squad), max_paragraphs=max_paragraphs)
    results: dict[str, Any] = {"data": str(squad), "max_paragraphs": max_paragraphs}
    if url is not None:
        results.update(_service_side(url, model, batch_size, api_key, retrieval_set, rerank, top_k, echo))
    if reference is not None:
        results.update(_reference_side(reference, batch_size, retrieval_set, reference_rerank, top_k, echo))
    if "service" in results and "sentence-transformers" in results:
        results["difference_points"] = {
            f"recall@{k}": round(results["service"][f"recall@{k}"] - results["sentence-transformers"][f"recall@{k}"], 3)
            for k in DEFAULT_KS
        }
        echo(json.dumps({"difference_points": results["difference_points"]}))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
    return results
