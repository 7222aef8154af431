"""The service windows and decodes with the model's own task settings (manifest `task_settings`), capped by the
graph's `max_seq_length`; per-request fields still override; a bundle written before them serves as before.

The tiny QA bundle's graph takes 128 positions; its manifest is rewritten here to say so (capacity 128) and to
carry fine-tuning settings of 48-token windows, so one context needs several windows at the model's length and
one at the graph's.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

import bert_model.tasks.defaults as defaults
from bert_model.tasks.qa import qa_predictions
from bundles.serving import open_bundle
from bundles.spec import MANIFEST_FILE, BundleManifest
from service.engine.inputs import NERInput, QAInput
from service.engine.pipelines import ClassifyPipeline, NERPipeline, QAPipeline, make_pipeline
from tests.service.server import ServerProcess, serving

CAPACITY = 128  # the tiny graphs' max_position_embeddings
TRAINED = {"max_seq_length": 48, "doc_stride": 16, "max_query_length": 12, "max_answer_length": 10}
QUESTION = "which river flows through the old city and past the cathedral on its way to the sea?"
CONTEXT = (
    "The river rises in the hills to the north and flows south through farmland for many miles. "
    "It passes the old city, where seven bridges cross it, and then the cathedral on the east bank. "
    "Below the city it widens into a tidal estuary before it reaches the sea."
)


def rewrite(source: Path, target: Path, capacity: int, settings: dict | None) -> Path:
    """A copy of bundle `source` whose manifest says `capacity` and carries `settings` (None: no key at all,
    as manifests were written before task settings existed)."""
    shutil.copytree(source, target)
    data = json.loads((target / MANIFEST_FILE).read_text())
    data["max_seq_length"] = capacity
    data.pop("task_settings", None)
    if settings is not None:
        data["task_settings"] = settings
    (target / MANIFEST_FILE).write_text(json.dumps(data))
    return target


@pytest.fixture
def qa_bundles(tiny_bundles: dict[str, Path], tmp_path: Path) -> dict[str, Path]:
    source = tiny_bundles["qa"]
    return {
        "trained": rewrite(source, tmp_path / "tiny-qa-trained", CAPACITY, TRAINED),
        "old": rewrite(source, tmp_path / "tiny-qa-old", CAPACITY, None),
    }


def qa_pipeline(path: Path) -> QAPipeline:
    pipeline = make_pipeline(open_bundle(path))
    assert isinstance(pipeline, QAPipeline)
    return pipeline


def test_qa_windows_follow_the_manifest_task_settings(qa_bundles: dict[str, Path]) -> None:
    trained, old = qa_pipeline(qa_bundles["trained"]), qa_pipeline(qa_bundles["old"])
    request = QAInput(questions=[QUESTION], contexts=[CONTEXT])
    features = trained.features(request)
    assert trained.max_seq_length == 48 and trained.windows.doc_stride == 16 and trained.windows.max_query_length == 12
    assert len(features) >= 2 and max(len(f) for f in features) == 48
    assert all(f.context_start == 12 + 2 for f in features)  # [CLS] + 12 question tokens + [SEP]
    assert len(old.features(request)) == 1 and old.max_seq_length == CAPACITY  # the graph's length, as before
    # a per-request stride still overrides, and is checked against the model's windows
    assert len(trained.features(QAInput(questions=[QUESTION], contexts=[CONTEXT], doc_stride=0))) < len(features)
    with pytest.raises(Exception, match="context tokens of one window"):
        trained.features(QAInput(questions=[QUESTION], contexts=[CONTEXT], doc_stride=48 - 12 - 3))


def test_settings_longer_than_the_graph_are_shrunk_to_it(tiny_bundles: dict[str, Path], tmp_path: Path) -> None:
    settings = {**TRAINED, "max_seq_length": 256, "doc_stride": 128, "max_query_length": 64}
    pipeline = qa_pipeline(rewrite(tiny_bundles["qa"], tmp_path / "long", 64, settings))
    assert (pipeline.max_seq_length, pipeline.windows.max_query_length, pipeline.windows.doc_stride) == (64, 30, 15)
    with pytest.raises(ValueError, match="doc_stride 40"):
        make_pipeline(open_bundle(rewrite(tiny_bundles["qa"], tmp_path / "bad", 64, {**TRAINED, "doc_stride": 40})))


def test_an_old_manifest_without_task_settings_loads_and_serves_as_before(
    tiny_bundles: dict[str, Path], tmp_path: Path
) -> None:
    old_qa = rewrite(tiny_bundles["qa"], tmp_path / "qa", 64, None)
    old_ner = rewrite(tiny_bundles["ner"], tmp_path / "ner", 64, None)
    assert "task_settings" not in json.loads((old_qa / MANIFEST_FILE).read_text())
    assert BundleManifest.read(old_qa).task_settings == {}
    qa = qa_pipeline(old_qa)  # the windows the service has always derived from the graph's length
    assert (qa.max_seq_length, qa.windows.max_query_length, qa.windows.doc_stride) == (64, 30, 15)
    assert qa.windows.max_answer_length == defaults.QA_MAX_ANSWER_LENGTH and qa.windows.null_threshold == 0.0
    ner = make_pipeline(open_bundle(old_ner))
    assert isinstance(ner, NERPipeline) and (ner.max_seq_length, ner.stride) == (64, 15)
    trained_ner = rewrite(tiny_bundles["ner"], tmp_path / "ner-trained", CAPACITY, {"max_seq_length": 32, "stride": 8})
    ner = make_pipeline(open_bundle(trained_ner))
    assert isinstance(ner, NERPipeline) and (ner.max_seq_length, ner.stride) == (32, 8)
    assert max(len(f) for f in ner.features(NERInput(texts=[CONTEXT]))) == 32


def test_a_classifiers_score_function_follows_its_problem_type(tiny_bundles: dict[str, Path], tmp_path: Path) -> None:
    source = tiny_bundles["classify"]  # two labels
    functions = {}
    for name, settings in (("old", None), ("multi", {"problem_type": "multi_label_classification"})):
        pipeline = make_pipeline(open_bundle(rewrite(source, tmp_path / name, CAPACITY, settings)))
        assert isinstance(pipeline, ClassifyPipeline)
        functions[name] = pipeline.score_function
    assert functions == {"old": "softmax", "multi": "sigmoid"}
    with pytest.raises(ValueError, match="manifest task_settings: problem_type must be one of"):
        make_pipeline(open_bundle(rewrite(source, tmp_path / "bad", CAPACITY, {"problem_type": "ordinal"})))


def peaked_rows(features: list, answer_tokens: int) -> list[dict[str, np.ndarray]]:
    """Outputs whose best span is the first `answer_tokens` context tokens of the first window, with the empty
    answer ([CLS], high in every window) ahead of it by a log-probability margin of 2."""
    outputs = []
    for index, feature in enumerate(features):
        start, end = np.zeros(len(feature), np.float32), np.zeros(len(feature), np.float32)
        start[0], end[0] = 9.0, 9.0
        if index == 0:
            start[feature.context_start], end[feature.context_start + answer_tokens - 1] = 8.0, 8.0
        outputs.append({"start_logits": start, "end_logits": end})
    return outputs


def test_answer_length_and_no_answer_threshold_come_from_the_settings(
    tiny_bundles: dict[str, Path], tmp_path: Path
) -> None:
    settings = {**TRAINED, "max_answer_length": 1, "version_2": True, "null_threshold": 5.0}
    pipeline = qa_pipeline(rewrite(tiny_bundles["qa"], tmp_path / "v2", CAPACITY, settings))
    request = QAInput(questions=[QUESTION], contexts=[CONTEXT])
    features = pipeline.features(request)
    outputs = peaked_rows(features, answer_tokens=4)
    short = pipeline.postprocess(request, features, outputs)[0][0]["answer"]
    assert short and " " not in short  # the model's max_answer_length: one token
    longer = QAInput(questions=[QUESTION], contexts=[CONTEXT], max_answer_len=5)
    assert pipeline.postprocess(longer, features, outputs)[0][0]["answer"] == "The river rises in"
    rows = [o["start_logits"] for o in outputs], [o["end_logits"] for o in outputs]
    null_diff = qa_predictions(features, *rows, max_answer_length=5)[0].null_score_diff
    assert null_diff == pytest.approx(2.0, abs=1e-3)  # beats the service's default threshold 0, not the model's 5
    impossible = QAInput(questions=[QUESTION], contexts=[CONTEXT], max_answer_len=5, handle_impossible_answer=True)
    assert pipeline.postprocess(impossible, features, outputs)[0][0]["answer"] == "The river rises in"
    old = qa_pipeline(rewrite(tiny_bundles["qa"], tmp_path / "old", CAPACITY, None))
    old_features = old.features(impossible)
    assert old.postprocess(impossible, old_features, peaked_rows(old_features, 4))[0][0]["answer"] == ""
    assert old.postprocess(request, old_features, peaked_rows(old_features, 4))[0][0]["answer"] == "The river rises in"


@pytest.fixture
def trained_server(qa_bundles: dict[str, Path], tmp_path: Path) -> Iterator[ServerProcess]:
    with serving([qa_bundles["trained"]], tmp_path / "server.log") as process:
        yield process


@pytest.mark.integration
def test_the_server_reports_and_uses_the_models_window_length(trained_server: ServerProcess) -> None:
    from service.grpc_api.stubs import bert_pb2 as pb
    from service.grpc_api.stubs import bert_pb2_grpc as pb_grpc

    with httpx.Client(base_url=trained_server.url, timeout=30) as client:
        listed = client.get("/models").json()["models"]
        assert [m["max_seq_length"] for m in listed] == [48]
        body = {"question": QUESTION, "context": CONTEXT}
        assert client.post("/qa", json=body).status_code == 200
        rejected = client.post("/qa", json={**body, "truncate": False})  # fits 128 tokens, not one 48-token window
        assert rejected.status_code == 422 and "window of 48 tokens" in rejected.text
    with grpc.insecure_channel(trained_server.grpc_target) as channel:
        models = pb_grpc.ModelsStub(channel).List(pb.ListModelsRequest(), timeout=10).models
        assert [m.max_seq_length for m in models] == [48]
        request = pb.ExtractRequest(inputs=[pb.QAInput(question=QUESTION, context=CONTEXT)], truncate=False)
        with pytest.raises(grpc.RpcError) as error:
            pb_grpc.QAStub(channel).Extract(request, timeout=10)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
