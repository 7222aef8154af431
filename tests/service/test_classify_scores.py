"""Classification scores follow the model's problem_type, as Hugging Face's text-classification pipeline does.

A multi-label and a regression checkpoint written by `transformers` (the oracle) are exported by `build_bundle`
(cpu-fp32) and served by a real server: REST and gRPC answers equal the pipeline's on the same checkpoint
(sigmoids per label; the raw value), a request's `function_to_apply` overrides as the pipeline's argument does,
`GET /models` and `Models.List` report each model's own function, and a bad value is a 422 / INVALID_ARGUMENT.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import torch
import transformers

from bert_model.registry import minilm_path
from export.bundle import build_bundle
from tests.service.server import ServerProcess, serving

pytestmark = pytest.mark.integration

TEXTS = ["a gripping, beautifully acted film", "a tedious mess from start to finish", "it was fine, i suppose"]
MULTI_LABELS = ["toxic", "insult", "threat"]
TOLERANCE = 1e-4  # the fp32 ONNX graph against PyTorch eager


def save_checkpoint(folder: Path, problem_type: str, labels: list[str], seed: int) -> Path:
    """A tiny transformers BertForSequenceClassification over MiniLM's vocabulary, with its tokenizer files."""
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
        problem_type=problem_type,
    )
    model = transformers.BertForSequenceClassification(config).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(30)  # scores spread out, so that sigmoid, softmax and none differ clearly
    model.save_pretrained(folder)
    transformers.AutoTokenizer.from_pretrained(str(minilm_path())).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("problem-types")
    return {
        "multi": save_checkpoint(root / "tiny-multi-label", "multi_label_classification", MULTI_LABELS, seed=1),
        "regression": save_checkpoint(root / "tiny-regression", "regression", ["similarity"], seed=2),
    }


@pytest.fixture(scope="module")
def server(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("problem-type-bundles")
    bundles = [
        build_bundle(folder, root / folder.name, variants="cpu-fp32", data_dir=Path("/nonexistent")).path
        for folder in checkpoints.values()
    ]
    with serving(bundles, root / "server.log") as process:
        yield process


def oracle(checkpoint: Path, **options: Any) -> list[dict[str, float]]:
    """Per text, label -> score from transformers' pipeline on the checkpoint folder."""
    pipe = transformers.pipeline("text-classification", model=str(checkpoint), device="cpu")
    answers = pipe(TEXTS, top_k=None, **options)
    return [{item["label"]: item["score"] for item in answer} for answer in answers]


def as_dicts(results: list[list[dict[str, Any]]]) -> list[dict[str, float]]:
    return [{item["label"]: item["score"] for item in result} for result in results]


def test_manifests_carry_the_problem_type(server: ServerProcess) -> None:
    models = {m["name"]: m for m in httpx.get(server.url + "/models", timeout=10).json()["models"]}
    assert models["tiny-multi-label"]["function_to_apply"] == "sigmoid"
    assert models["tiny-regression"]["function_to_apply"] == "none"


@pytest.mark.parametrize(("name", "options"), [("multi", {}), ("regression", {}), ("multi", {"function": "softmax"})])
def test_rest_scores_equal_the_hf_pipeline(
    server: ServerProcess, checkpoints: dict[str, Path], name: str, options: dict[str, str]
) -> None:
    function = options.get("function")
    body: dict[str, Any] = {"inputs": TEXTS, "top_k": None, "model": checkpoints[name].name}
    if function:
        body["function_to_apply"] = function
    response = httpx.post(server.url + "/classify", json=body, timeout=30)
    assert response.status_code == 200, response.text
    expected = oracle(checkpoints[name], **({"function_to_apply": function} if function else {}))
    served = as_dicts(response.json())
    for got, want in zip(served, expected, strict=True):
        assert got == pytest.approx(want, abs=TOLERANCE)
    if name == "multi" and not function:
        assert any(sum(scores.values()) > 1.2 for scores in served)  # independent sigmoids, not a distribution
    if name == "regression":
        assert any(not 0 <= next(iter(scores.values())) <= 1 for scores in served)  # raw values


def test_grpc_scores_equal_the_hf_pipeline(server: ServerProcess, checkpoints: dict[str, Path]) -> None:
    from service.grpc_api.stubs import bert_pb2 as pb
    from service.grpc_api.stubs import bert_pb2_grpc as pb_grpc

    inputs = [pb.TextInput(text=text) for text in TEXTS]
    model = checkpoints["multi"].name
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = pb_grpc.ClassifierStub(channel)
        listed = {m.name: m for m in pb_grpc.ModelsStub(channel).List(pb.ListModelsRequest(), timeout=10).models}
        assert listed[model].function_to_apply == pb.SCORE_FUNCTION_SIGMOID
        assert listed["tiny-regression"].function_to_apply == pb.SCORE_FUNCTION_NONE
        for function, hf_name in ((pb.SCORE_FUNCTION_UNSPECIFIED, None), (pb.SCORE_FUNCTION_NONE, "none")):
            request = pb.ClassifyRequest(inputs=inputs, top_k=0, model=model, function_to_apply=function)
            reply = stub.Classify(request, timeout=30)
            served = [{s.label: s.score for s in result.labels} for result in reply.results]
            expected = oracle(checkpoints["multi"], **({"function_to_apply": hf_name} if hf_name else {}))
            for got, want in zip(served, expected, strict=True):
                assert got == pytest.approx(want, abs=TOLERANCE)
        with pytest.raises(grpc.RpcError) as error:
            stub.Classify(pb.ClassifyRequest(inputs=inputs, model=model, function_to_apply=7), timeout=10)  # type: ignore[arg-type]
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "function_to_apply" in (error.value.details() or "")


def test_an_unknown_function_is_a_422(server: ServerProcess) -> None:
    response = httpx.post(server.url + "/classify", json={"inputs": "fine", "function_to_apply": "tanh"}, timeout=10)
    assert response.status_code == 422 and "function_to_apply" in response.text
    assert httpx.get(server.url + "/health/ready", timeout=10).status_code == 200  # still serving
