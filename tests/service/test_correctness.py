"""The served default models answer like `bertserve evaluate` on real data (SST-2, SQuAD paragraphs, CoNLL).

Needs the default task models (`make default-models`) and their bundles (`make bundles`), and ../shared/data;
skips with the reason otherwise. The service runs the bundle's cpu-fp32 variant (the graph closest to PyTorch);
`bertserve evaluate` runs the PyTorch model. Agreement is measured on answers / entities, not on scores.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.service.server import REPO, ServerProcess, serving

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BUNDLES = REPO / "artifacts" / "bundles"
LIMIT = 60


def _available(name: str) -> bool:
    if not (BUNDLES / name / "manifest.json").is_file():
        return False
    try:
        from bert_model.registry import resolve_model_path

        resolve_model_path(name)
    except FileNotFoundError:
        return False
    return True


def _need(name: str) -> None:
    if not _available(name):
        pytest.skip(f"no default model + bundle {name}: run `make default-models` and `make bundles`")


@pytest.fixture(scope="module")
def defaults_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    names = [name for name in ("minilm-sst2", "minilm-squad", "minilm-conll03") if _available(name)]
    if not names:
        pytest.skip("no default model has a bundle yet: run `make default-models` and `make bundles`")
    log = tmp_path_factory.mktemp("defaults") / "server.log"
    with serving(
        [BUNDLES / name for name in names], log, {"BERTSERVE_VARIANT": "cpu-fp32"}, ready_timeout=300
    ) as server:
        yield server


def _evaluate(model: str, data: Path, out: Path) -> None:
    command = [sys.executable, "-m", "bertserve", "evaluate", model, "--data", str(data), "--predictions", str(out)]
    subprocess.run([*command, "--limit", str(LIMIT)], cwd=REPO, check=True, timeout=900, capture_output=True)


def test_sst2_labels_match_evaluate(defaults_server: ServerProcess, data_dir: Path, tmp_path: Path) -> None:
    _need("minilm-sst2")
    _evaluate("minilm-sst2", data_dir / "sst2" / "dev.half-a.tsv", tmp_path / "pred.jsonl")
    records = [json.loads(line) for line in (tmp_path / "pred.jsonl").read_text().splitlines()]
    texts = [record["text"] for record in records]
    served = httpx.post(defaults_server.url + "/classify", json={"inputs": texts, "model": "minilm-sst2"}, timeout=120)
    assert served.status_code == 200, served.text
    agree = 0
    for record, result in zip(records, served.json(), strict=True):
        agree += result[0]["label"] == record["label"]
        if result[0]["label"] == record["label"]:
            assert result[0]["score"] == pytest.approx(record["score"], abs=2e-3)
    print(f"sst2: {agree}/{len(records)} labels agree with bertserve evaluate")
    assert agree / len(records) >= 0.97, f"{agree}/{len(records)} labels agree"


def test_squad_answers_match_evaluate(defaults_server: ServerProcess, data_dir: Path, tmp_path: Path) -> None:
    _need("minilm-squad")
    from bert_model.tasks.readers import read_squad

    data = data_dir / "squad_v1.1" / "dev-v1.1.half-a.json"
    _evaluate("minilm-squad", data, tmp_path / "pred.json")
    expected: dict[str, str] = json.loads((tmp_path / "pred.json").read_text())
    examples = {e.id: e for e in read_squad(data) if e.id in expected}
    agree = 0
    with httpx.Client(base_url=defaults_server.url, timeout=60) as client:
        for qid, answer in expected.items():
            example = examples[qid]
            got = client.post("/qa", json={"question": example.question, "context": example.context}).json()
            assert example.context[got["start"] : got["end"]] == got["answer"]
            agree += got["answer"].strip() == answer.strip()
    print(f"squad: {agree}/{len(expected)} answers agree with bertserve evaluate")
    assert agree / len(expected) >= 0.9, f"{agree}/{len(expected)} answers agree"


def test_conll_entities_match_evaluate(defaults_server: ServerProcess, data_dir: Path, tmp_path: Path) -> None:
    _need("minilm-conll03")
    data = data_dir / "conll2003" / "iob2" / "valid.txt"
    _evaluate("minilm-conll03", data, tmp_path / "pred.txt")
    sentences = [block.splitlines() for block in (tmp_path / "pred.txt").read_text().strip().split("\n\n")]
    agree = total = 0
    with httpx.Client(base_url=defaults_server.url, timeout=60) as client:
        for lines in sentences:
            words = [line.split()[0] for line in lines]
            tags = [line.split()[2] for line in lines]
            text, spans = " ".join(words), []
            position = 0
            for word in words:
                spans.append((position, position + len(word)))
                position += len(word) + 1
            expected = _entities(tags, spans)
            got = client.post("/ner", json={"inputs": text, "aggregation_strategy": "first"}).json()
            served = {(e["entity_group"], e["start"], e["end"]) for e in got}
            for entity in got:
                assert text[entity["start"] : entity["end"]] == entity["word"]
            total += len(expected | served)
            agree += len(expected & served)
    print(f"conll: {agree}/{total} entities agree with bertserve evaluate")
    assert total == 0 or agree / total >= 0.9, f"{agree}/{total} entities agree"


def _entities(tags: list[str], spans: list[tuple[int, int]]) -> set[tuple[str, int, int]]:
    """(type, start, end) character spans of the IOB2 entities of a sentence."""
    found: set[tuple[str, int, int]] = set()
    current: list = []
    for tag, span in [*zip(tags, spans, strict=True), ("O", (0, 0))]:
        prefix, _, kind = tag.partition("-")
        if current and (prefix != "I" or kind != current[0]):
            found.add((current[0], current[1], current[2]))
            current = []
        if prefix == "B" or (prefix == "I" and not current):
            current = [kind, span[0], span[1]]
        elif prefix == "I":
            current[2] = span[1]
    return found
