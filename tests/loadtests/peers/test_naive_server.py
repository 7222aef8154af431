"""The naive peer's helpers: plain checkpoints used as they are, composite folders converted once and cached."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from loadtests.peers.naive_server import _plain, hf_checkpoint, main


def test_numpy_scalars_become_json_numbers() -> None:
    value = _plain([{"score": np.float32(0.5), "start": np.int64(3), "word": "x"}])
    assert json.dumps(value) == '[{"score": 0.5, "start": 3, "word": "x"}]'


def test_plain_checkpoint_is_used_as_it_is(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    checkpoint, _ = tiny
    assert hf_checkpoint(str(checkpoint), "classify", tmp_path) == checkpoint.resolve()
    assert not any(tmp_path.iterdir())


def test_composite_folder_is_converted_and_cached(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    checkpoint, _ = tiny
    composite = tmp_path / "composite"
    shutil.copytree(checkpoint, composite)
    config = json.loads((composite / "config.json").read_text())
    (composite / "config.json").write_text(json.dumps({**config, "bertserve": {"note": "not a plain checkpoint"}}))
    cache = tmp_path / "cache"
    converted = hf_checkpoint(str(composite), "classify", cache)
    assert converted == cache / "composite"
    assert {"config.json", "model.safetensors", "vocab.txt", "source.json"} <= {p.name for p in converted.iterdir()}
    mtime = (converted / "model.safetensors").stat().st_mtime_ns
    assert hf_checkpoint(str(composite), "classify", cache) == converted
    assert (converted / "model.safetensors").stat().st_mtime_ns == mtime  # reused
    (composite / "vocab.txt").write_text((composite / "vocab.txt").read_text() + "\n")  # the source changed
    hf_checkpoint(str(composite), "classify", cache)
    assert (
        json.loads((converted / "source.json").read_text())["files"]["vocab.txt"][0]
        == (composite / "vocab.txt").stat().st_size
    )


def test_arguments_are_checked() -> None:
    with pytest.raises(SystemExit):
        main(["--model", "summarize=x"])
    with pytest.raises(SystemExit):
        main([])


def test_naive_qa_answers_from_the_context_over_rest(tmp_path: Path) -> None:
    """transformers 5 has no question-answering pipeline: the hand-written /qa returns a span of the context,
    for a short context (one window) and a long one (several 384-token windows)."""
    pytest.importorskip("torch", reason="the naive peer runs PyTorch")
    from fastapi.testclient import TestClient

    from loadtests.peers.naive_server import NaiveQA, create_app
    from tests.loadtests.tiny_models import build_tiny_qa_checkpoint

    checkpoint = build_tiny_qa_checkpoint(tmp_path)
    short = "Ada Lovelace published her notes in 1843 in Taylor's Scientific Memoirs."
    long = " ".join(f"Sentence {i} says that the bridge was painted red in {1800 + i}." for i in range(120))
    qa = NaiveQA(str(checkpoint))
    assert len(qa.tokenizer(long)["input_ids"]) > 2 * qa.max_length  # several windows
    client = TestClient(create_app({"qa": str(checkpoint)}, tmp_path / "cache"))
    for context in (short, long):
        response = client.post("/qa", json={"question": "When was the bridge painted?", "context": context})
        assert response.status_code == 200
        body = response.json()
        assert set(body) == {"answer", "score", "start", "end"}
        assert 0 <= body["start"] < body["end"] <= len(context) and 0 < body["score"] <= 1
        assert context[body["start"] : body["end"]] == body["answer"] and body["answer"].strip()
        assert float(response.headers["x-inference-time-ms"]) > 0
    assert client.post("/classify", json={"inputs": "x"}).status_code == 404


def test_naive_embed_equals_sentence_transformers_over_rest(tmp_path: Path) -> None:
    """The peer's /embed and /v1/embeddings: MiniLM's sentence-transformers vectors (mean pooling, unit length)."""
    pytest.importorskip("torch", reason="the naive peer runs PyTorch")
    sentence_transformers = pytest.importorskip("sentence_transformers")
    import numpy as np
    from fastapi.testclient import TestClient

    from bert_model.registry import resolve_model_path
    from loadtests.peers.naive_server import create_app

    folder = resolve_model_path("minilm")
    texts = ["A man is playing a guitar.", "The new movie is awesome, really."]
    expected = sentence_transformers.SentenceTransformer(str(folder), device="cpu").encode(texts)
    client = TestClient(create_app({"embed": str(folder)}, tmp_path / "cache"))
    tei = client.post("/embed", json={"inputs": texts})
    assert tei.status_code == 200 and float(tei.headers["x-inference-time-ms"]) > 0
    np.testing.assert_allclose(tei.json(), expected, atol=1e-5)
    openai = client.post("/v1/embeddings", json={"input": texts[0]}).json()
    assert [item["index"] for item in openai["data"]] == [0]
    np.testing.assert_allclose(openai["data"][0]["embedding"], expected[0], atol=1e-5)
