"""The `triton` peer's model side: our bundles and task code behind a real Triton server's dynamic batcher.

What an experienced engineer would build instead of bertserve: the same exported graph served by Triton, with
Triton's dynamic batcher gathering requests, and tokenization plus post-processing in Triton's Python binding.
Runs in the Triton venv (`make triton-venv`: nvidia-pytriton bundles Triton 2.51 and needs numpy<2), with the
repository on PYTHONPATH; `loadtests/peers/triton_peer.py` starts it and puts the REST paths in front of it:

    .venv-triton/bin/python -m loadtests.peers.triton_models --model classify=BUNDLE [--model qa=BUNDLE ...] \
        --grpc-port P --http-port P --metrics-port P [--max-batch-size 8] [--max-queue-delay-us 0] [--instances 2]

Each task is one Triton model (named after the task), bound through pytriton: inputs `request` (BYTES: the
JSON body the REST route received) and `route` (BYTES: the REST path), outputs `status` (INT32: the HTTP
status), `body` (BYTES: the JSON answer) and `inference_ms` (FP32: the model calls of the batch it was in).
Triton's dynamic batcher hands the bound function up to `--max-batch-size` requests; it turns each into
features with the project's task code (`bert_model.tasks`: the `tokenizers` windows and the post-processing the
service runs, with the windows and defaults the service takes from the manifest; the load tests talk to the
service only over the wire, so nothing of `service` is imported, and tests/loadtests/peers/test_triton_peer.py checks
that the answers equal a running service's), sorts the features of the whole batch by length and runs them in
calls of at most `--max-batch-size` rows padded to the longest, on the variant the service would choose on this
CPU (`bundles.variant_choice`), compiled with the service's settings. `--instances N` binds N functions
per model (Triton's instance_group count: N batches at once) over one OpenVINO graph compiled with N streams, as
the service computes N batches at once on N streams by default.
Prints READY once every model is bound and Triton serves.
Reference: https://triton-inference-server.github.io/pytriton/ (binding, @batch, DynamicBatcher).
"""

from __future__ import annotations

import argparse
import json
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bert_model.tasks.classification import (
    build_classification_features,
    classification_postprocess,
    default_score_function,
)
from bert_model.tasks.embeddings import embedding_postprocess
from bert_model.tasks.features import Feature, collate
from bert_model.tasks.ner import build_ner_features, ner_postprocess
from bert_model.tasks.qa import build_qa_features, qa_postprocess
from bert_model.tasks.windows import ner_windows, qa_windows
from bert_model.tokenization import BertTokenizer
from bundles.runtimes import RuntimeSettings, open_variant
from bundles.spec import TOKENIZER_DIR, BundleManifest
from bundles.variant_choice import choose_variant

TASKS = ("classify", "qa", "ner", "embed")
NO_ANSWER = {"answer": "", "score": 0.0, "start": 0, "end": 0}
SEQUENCE_OUTPUTS = {"qa": ("start_logits", "end_logits"), "ner": ("logits",)}
"""Outputs with a row per token: cut to each feature's own length."""


class Runner:
    """The CPU variant the service would serve, opened as the service opens it (`bundles.runtimes`);
    numpy in, numpy out. OpenVINO: `streams` > 1 compiles for that many batches at once (THROUGHPUT, as the service's
    --openvino-streams), and each calling thread (a Triton model instance) gets its own infer request."""

    def __init__(self, folder: Path, manifest: BundleManifest, streams: int = 1) -> None:
        self.variant = choose_variant(manifest, "cpu")
        spec = manifest.variants[self.variant]
        # no latency copy: a Triton model instance never knows that its batch runs alone
        settings = RuntimeSettings(openvino_streams=streams, openvino_lone_latency=False)
        self.opened = open_variant(folder / spec.file, spec, manifest.output_names, settings)
        self.run = self.opened.run


# ---- requests in, answers out (the service's defaults and the shapes of its REST routes) ------------------
def _texts(value: Any) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(text, str) and text.strip() for text in texts):
        raise ValueError("inputs must be a non-blank string or a non-empty list of them")
    return texts


class TaskCode:
    """Features and results of one task through `bert_model.tasks`, with the windows the service derives from
    the manifest (`task_settings`, fitted to the graph) and its defaults for the fields the load tests omit."""

    def __init__(self, task: str, manifest: BundleManifest, tokenizer: BertTokenizer) -> None:
        self.task, self.manifest, self.tokenizer = task, manifest, tokenizer
        settings, capacity = manifest.task_settings, manifest.max_seq_length
        self.qa = qa_windows(settings, capacity) if task == "qa" else None
        self.ner = ner_windows(settings, capacity) if task == "ner" else None
        self.score_function = default_score_function(settings.get("problem_type"), len(manifest.labels) or 1)

    def features(self, body: dict[str, Any], route: str) -> tuple[int, list[Feature]]:
        """(inputs in the body, their features)."""
        if self.task == "qa":
            questions, contexts = [body["question"]], [body["context"]]
            window = self.qa
            assert window is not None
            return 1, list(
                build_qa_features(
                    self.tokenizer, questions, contexts, max_seq_length=window.max_seq_length,
                    doc_stride=window.doc_stride, max_query_length=window.max_query_length,
                )
            )  # fmt: skip
        if self.task == "ner":
            texts = _texts(body["inputs"])
            assert self.ner is not None
            length, stride = self.ner
            return len(texts), list(build_ner_features(self.tokenizer, texts, max_seq_length=length, stride=stride))
        texts = _texts(body["input"] if route == "/v1/embeddings" else body["inputs"])
        length = self.manifest.max_seq_length
        return len(texts), list(build_classification_features(self.tokenizer, texts, max_seq_length=length))

    def results(self, count: int, features: list[Feature], rows: list[dict[str, np.ndarray]]) -> list[Any]:
        """One result per input, in order."""
        if self.task == "classify":
            found: dict[int, Any] = classification_postprocess(
                features, [row["logits"] for row in rows], self.manifest.labels, function=self.score_function
            )
        elif self.task == "qa":
            starts, ends = [row["start_logits"] for row in rows], [row["end_logits"] for row in rows]
            assert self.qa is not None
            found = qa_postprocess(features, starts, ends, max_answer_length=self.qa.max_answer_length)  # type: ignore[arg-type]
        elif self.task == "ner":
            found = ner_postprocess(features, [row["logits"] for row in rows], self.manifest.labels)  # type: ignore[arg-type]
        else:
            settings = self.manifest.task_settings
            vectors = embedding_postprocess(
                features, [row["pooled_embedding"] for row in rows], [row["normalized_embedding"] for row in rows],
                normalize=settings.get("normalize", True),
            )  # fmt: skip
            tokens = {feature.request_index: len(feature) for feature in features}
            found = {index: {"embedding": vector, "tokens": tokens[index]} for index, vector in vectors.items()}
        return [found.get(index, []) for index in range(count)]


def shape_answer(task: str, route: str, body: dict[str, Any], results: list[Any]) -> Any:
    """The JSON answer of the service's route for these results."""
    if task == "qa":
        return (results[0] or [NO_ANSWER])[0]
    if task == "embed":
        if route != "/v1/embeddings":
            return [result["embedding"] for result in results]
        tokens = sum(result["tokens"] for result in results)
        data = [{"object": "embedding", "embedding": r["embedding"], "index": i} for i, r in enumerate(results)]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return {"object": "list", "data": data, "model": "triton", "usage": usage}
    single = isinstance(body.get("inputs"), str)
    return results[0] if single else results


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


class TaskModel:
    """One task: a batch of REST bodies -> features -> runner calls -> one (status, JSON) per body."""

    def __init__(self, task: str, folder: Path, max_rows: int, streams: int = 1) -> None:
        manifest = BundleManifest.read(folder)
        tokenizer = BertTokenizer.from_pretrained(folder / TOKENIZER_DIR)
        tokenizer.model_max_length = max(tokenizer.model_max_length, manifest.max_seq_length)
        self.task = task
        self.code = TaskCode(task, manifest, tokenizer)
        self.runner = Runner(folder, manifest, streams)
        self.max_rows = max_rows
        self.pad_id = tokenizer.pad_id
        self.sequence_outputs = set(SEQUENCE_OUTPUTS.get(task, ()))

    def answer(self, bodies: Sequence[bytes], routes: Sequence[str]) -> tuple[list[tuple[int, bytes]], float]:
        """(status, JSON answer) per body, and the milliseconds the batch's model calls took."""
        parsed: list[tuple[dict[str, Any], int, list[Feature]] | Exception] = []
        for raw, route in zip(bodies, routes, strict=True):
            try:
                body = json.loads(raw)
                parsed.append((body, *self.code.features(body, route)))
            except Exception as error:  # one bad body answers its own error; the batch goes on
                parsed.append(error)
        features = [(i, f) for i, item in enumerate(parsed) if not isinstance(item, Exception) for f in item[2]]
        started = time.perf_counter()
        rows = self._run([feature for _, feature in features])
        inference_ms = (time.perf_counter() - started) * 1000
        outputs: dict[int, list[dict[str, np.ndarray]]] = {}
        for (index, _), row in zip(features, rows, strict=True):
            outputs.setdefault(index, []).append(row)
        answers = []
        for index, (item, route) in enumerate(zip(parsed, routes, strict=True)):
            if isinstance(item, Exception):
                message = f"{type(item).__name__}: {item}"
                answers.append((422, json.dumps({"error": message}).encode()))
                continue
            body, count, request_features = item
            results = self.code.results(count, request_features, outputs.get(index, []))
            answer = shape_answer(self.task, route, body, results)
            answers.append((200, json.dumps(answer, default=_plain).encode()))
        return answers, inference_ms

    def _run(self, features: list[Feature]) -> list[dict[str, np.ndarray]]:
        """Output rows in feature order: calls of at most max_rows features of similar length, padded to the
        longest of each call; sequence outputs cut to the feature's own length."""
        rows: list[dict[str, np.ndarray]] = [{} for _ in features]
        order = sorted(range(len(features)), key=lambda i: len(features[i]))
        sequence = self.sequence_outputs
        for start in range(0, len(order), self.max_rows):
            chunk = order[start : start + self.max_rows]
            outputs = self.runner.run(collate([features[i] for i in chunk], self.pad_id))
            for row, i in enumerate(chunk):
                length = len(features[i])
                rows[i] = {
                    name: value[row, :length] if name in sequence else value[row] for name, value in outputs.items()
                }
        return rows


def make_infer(model: TaskModel) -> Callable[..., dict[str, np.ndarray]]:
    from pytriton.decorators import batch

    @batch
    def infer(request: np.ndarray, route: np.ndarray) -> dict[str, np.ndarray]:
        answers, inference_ms = model.answer([row[0] for row in request], [row[0].decode() for row in route])
        status = np.array([[code] for code, _ in answers], dtype=np.int32)
        body = np.empty((len(answers), 1), dtype=object)
        body[:, 0] = [payload for _, payload in answers]
        return {"status": status, "body": body, "inference_ms": np.full((len(answers), 1), inference_ms, np.float32)}

    return infer


def bind(triton: Any, model: TaskModel, max_batch_size: int, delay_us: int, instances: int = 1) -> None:
    """One Triton model per task; `instances` bound functions = Triton's instance_group count (batches at once)."""
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor

    triton.bind(
        model_name=model.task,
        infer_func=[make_infer(model) for _ in range(instances)],
        inputs=[Tensor(name="request", dtype=np.bytes_, shape=(1,)), Tensor(name="route", dtype=np.bytes_, shape=(1,))],
        outputs=[
            Tensor(name="status", dtype=np.int32, shape=(1,)),
            Tensor(name="body", dtype=np.bytes_, shape=(1,)),
            Tensor(name="inference_ms", dtype=np.float32, shape=(1,)),
        ],
        config=ModelConfig(
            max_batch_size=max_batch_size, batcher=DynamicBatcher(max_queue_delay_microseconds=delay_us)
        ),
        strict=False,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", default=[], help="TASK=BUNDLE_FOLDER (classify, qa, ner, embed)")
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    parser.add_argument("--max-batch-size", type=int, default=8, help="requests per call of the bound function")
    parser.add_argument("--max-queue-delay-us", type=int, default=0, help="Triton's dynamic batcher delay")
    parser.add_argument(
        "--instances", type=int, default=2, help="model instances (batches at once; the service's --openvino-streams)"
    )
    args = parser.parse_args(argv)
    models = dict(item.split("=", 1) for item in args.model if "=" in item)
    if not models or len(models) != len(args.model) or set(models) - set(TASKS):
        parser.error(f"give --model TASK=BUNDLE with TASK in {list(TASKS)} (got {args.model})")
    if args.max_batch_size < 1 or args.max_queue_delay_us < 0 or args.instances < 1:
        parser.error("--max-batch-size and --instances must be >= 1 and --max-queue-delay-us >= 0")
    args.models = models
    return args


def main(argv: list[str] | None = None) -> None:
    from pytriton.server import triton_server
    from pytriton.triton import Triton, TritonConfig

    args = parse_args(argv)
    models = [
        TaskModel(task, Path(folder), args.max_batch_size, args.instances) for task, folder in args.models.items()
    ]
    for model in models:  # the first calls compile kernels: not part of what the load test measures
        model.answer([json.dumps(_warmup_body(model.task)).encode()], ["/warmup"])
    # tritonserver's Python-backend stubs do not exit on SIGINT here; pytriton would wait 30 s before killing it
    triton_server.SERVER_OUTPUT_TIMEOUT_SECS = 3
    config = TritonConfig(
        grpc_port=args.grpc_port,
        http_port=args.http_port,
        metrics_port=args.metrics_port,
        exit_timeout_secs=2,
        grpc_address="127.0.0.1",
        http_address="127.0.0.1",
    )
    with Triton(config=config) as triton:
        for model in models:
            bind(triton, model, args.max_batch_size, args.max_queue_delay_us, args.instances)
        triton.run()
        variants = ", ".join(f"{model.task}: {model.runner.variant}" for model in models)
        print(f"READY ({variants})", flush=True)
        signal.sigwait({signal.SIGTERM, signal.SIGINT})


def _warmup_body(task: str) -> dict[str, Any]:
    if task == "qa":
        return {"question": "What warms up?", "context": "The peer warms up every model before it serves. " * 20}
    return {"inputs": ["warm up the model", "a second, somewhat longer warm-up sentence " * 4]}


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    main()
