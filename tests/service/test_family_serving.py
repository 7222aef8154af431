"""Every family served end to end: a saved `transformers` folder, `bertserve export`, the real server, and its
answers against transformers' own.

For BERT, DistilBERT, ELECTRA, RoBERTa, XLM-RoBERTa and ALBERT, a random tiny model per task (classify, qa, ner)
with a tokenizer of its family (tests/export/test_family_export.py, tests/bert_model/test_tokenization_family.py)
is exported to a cpu-fp32 bundle with the command and all eighteen are served by one `bertserve serve` (torch made
unimportable). Then, over texts with emoji, CJK, a combining mark and CRLF:
- /classify: labels and scores equal transformers' (its tokenizer, its model, softmax) within 1e-4, texts and pairs;
- /qa: the answers equal the same n-best decoding (`bert_model.tasks.qa`) of transformers' start / end logits on the
  bundle tokenizer's windows (several per context), scores within 1e-4 relatively, and `context[start:end] == answer`;
- /ner: the entities equal `bert_model.tasks.ner`'s grouping of transformers' token logits on the same windows,
  and `text[start:end] == word` without surrounding whitespace;
- GET /models lists every bundle with its family (the manifest's `source.model_type`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import transformers
from typer.testing import CliRunner

from bert_model.tasks.features import Feature, collate
from bert_model.tasks.ner import build_ner_features, ner_postprocess
from bert_model.tasks.qa import build_qa_features, qa_postprocess
from bert_model.tasks.windows import ner_windows, qa_windows
from bert_model.tokenization import BertTokenizer
from bertserve.commands.export import register
from tests.bert_model.test_family_parity import hf_class
from tests.bert_model.test_tokenization_family import FAMILIES, save_family_tokenizer
from tests.export.test_family_export import TASK_HEADS, save_family_model, write_guard_texts
from tests.service.server import ServerProcess, serving

pytestmark = pytest.mark.integration

TASKS = ("classify", "qa", "ner")
TOLERANCE = 1e-4
TEXTS = [
    "Ada Lovelace worked with Charles Babbage in London.",
    "Emoji 😀 and 👩‍🔬 in 東京 with café, José and Zoë.",
    "A combining e\u0301 mark, and a CRLF line\r\nbreak in Paris.",
    "  Marie Curie won the prize in Stockholm in 1903.  ",
]
PAIRS = [(TEXTS[0], TEXTS[1]), (TEXTS[2], TEXTS[3])]
QUESTIONS = ["Who worked with Babbage?", "Where did Marie Curie win?"]
CONTEXT = " ".join(TEXTS * 3)  # several windows of 64 tokens
NER_STRATEGIES = ("simple", "first")


def _name(family: str, task: str) -> str:
    return f"{family}-{task}"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Model name -> (its transformers folder, its bundle), exported through `bertserve export`."""
    import typer

    app = typer.Typer()

    @app.callback()
    def root() -> None:
        """Test app."""

    register(app)
    runner, base = CliRunner(), tmp_path_factory.mktemp("family-serving")
    folders: dict[str, tuple[Path, Path]] = {}
    for family in FAMILIES:
        tokenizer = save_family_tokenizer(family, base / f"tokenizer-{family}")
        for task in TASKS:
            name = _name(family, task)
            model = save_family_model(family, task, base / f"model-{name}", tokenizer, seed=len(folders))
            bundle, guard = base / "bundles" / name, write_guard_texts(task, base / f"guard-{name}.txt")
            arguments = [str(model), "--out", str(bundle), "--variants", "cpu-fp32", "--calibration", str(guard)]
            result = runner.invoke(app, ["export", *arguments, "--name", name, "--strict"])
            assert result.exit_code == 0, result.output
            folders[name] = (model, bundle)
    return folders


@pytest.fixture(scope="module")
def server(exported: dict[str, tuple[Path, Path]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("family-server") / "server.log"
    with serving([bundle for _, bundle in exported.values()], log, ready_timeout=180.0) as process:
        yield process


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60.0) as http:
        yield http


def _post(client: httpx.Client, path: str, body: dict[str, Any]) -> Any:
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def _theirs(family: str, task: str, folder: Path) -> Any:
    return hf_class(family, TASK_HEADS[task]).from_pretrained(folder).eval()


def _model_inputs(model: Any, arrays: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The arrays a transformers model takes (DistilBERT's forward has no token types)."""
    takes_types = model.config.model_type != "distilbert"
    return {
        key: torch.as_tensor(np.asarray(value))
        for key, value in arrays.items()
        if key in ("input_ids", "attention_mask") or (key == "token_type_ids" and takes_types)
    }


def _rows(model: Any, features: list[Feature], pad_id: int, names: tuple[str, ...]) -> list[list[np.ndarray]]:
    """transformers' outputs `names` on `features` (one padded batch), one unpadded row per feature."""
    with torch.no_grad():
        output = model(**_model_inputs(model, collate(features, pad_id)))
    return [[getattr(output, name)[row, : len(f)].numpy() for row, f in enumerate(features)] for name in names]


def _manifest(bundle: Path) -> dict[str, Any]:
    return json.loads((bundle / "manifest.json").read_text())


@pytest.mark.parametrize("family", FAMILIES)
def test_classify_equals_transformers(family: str, exported: dict, client: httpx.Client) -> None:
    name = _name(family, "classify")
    folder, bundle = exported[name]
    model, tokenizer = _theirs(family, "classify", folder), transformers.AutoTokenizer.from_pretrained(folder)
    settings = {"padding": True, "truncation": True, "max_length": _manifest(bundle)["max_seq_length"]}
    firsts, seconds = (list(texts) for texts in zip(*PAIRS, strict=True))
    cases: list[tuple[Any, Any]] = [
        (TEXTS, tokenizer(TEXTS, return_tensors="np", return_token_type_ids=True, **settings)),
        (
            [{"text": a, "text_pair": b} for a, b in PAIRS],
            tokenizer(firsts, seconds, return_tensors="np", return_token_type_ids=True, **settings),
        ),
    ]
    worst = 0.0
    for inputs, encoded in cases:
        served = _post(client, "/classify", {"inputs": inputs, "top_k": None, "model": name})
        with torch.no_grad():
            scores = torch.softmax(model(**_model_inputs(model, dict(encoded))).logits, dim=-1).numpy()
        for answer, row in zip(served, scores, strict=True):
            labels = [model.config.id2label[i] for i in np.argsort(-row, kind="stable")]
            assert [item["label"] for item in answer] == labels, family
            expected = {model.config.id2label[i]: float(score) for i, score in enumerate(row)}
            worst = max(worst, *(abs(item["score"] - expected[item["label"]]) for item in answer))
    print(f"\n{family} classify: max |served - transformers| score {worst:.1e}")
    assert worst <= TOLERANCE


@pytest.mark.parametrize("family", FAMILIES)
def test_qa_spans_equal_transformers(family: str, exported: dict, client: httpx.Client) -> None:
    name = _name(family, "qa")
    folder, bundle = exported[name]
    manifest, tokenizer = _manifest(bundle), BertTokenizer.from_pretrained(bundle / "tokenizer")
    windows = qa_windows(manifest["task_settings"], manifest["max_seq_length"])
    contexts = [CONTEXT, TEXTS[2]]
    features = build_qa_features(
        tokenizer,
        QUESTIONS,
        contexts,
        max_seq_length=windows.max_seq_length,
        doc_stride=windows.doc_stride,
        max_query_length=windows.max_query_length,
    )
    assert len(features) > len(QUESTIONS) + 1  # the long context takes several windows
    starts, ends = _rows(_theirs(family, "qa", folder), features, tokenizer.pad_id, ("start_logits", "end_logits"))
    expected = qa_postprocess(features, starts, ends, top_k=3, max_answer_length=windows.max_answer_length)
    inputs = [{"question": q, "context": c} for q, c in zip(QUESTIONS, contexts, strict=True)]
    served = _post(client, "/qa", {"inputs": inputs, "top_k": 3, "model": name})
    worst = 0.0
    for index, (answers, context) in enumerate(zip(served, contexts, strict=True)):
        reference = expected[index]
        assert [(a["answer"], a["start"], a["end"]) for a in answers] == [
            (a["answer"], a["start"], a["end"]) for a in reference
        ], family
        # answer probabilities of a random model are small: compared relatively, which is the stricter test here
        worst = max(worst, *(abs(a["score"] / b["score"] - 1) for a, b in zip(answers, reference, strict=True)))
        for answer in answers:
            assert context[answer["start"] : answer["end"]] == answer["answer"] == answer["answer"].strip()
    print(f"\n{family} qa: spans equal, max |served / transformers - 1| score {worst:.1e}")
    assert worst <= TOLERANCE


@pytest.mark.parametrize("family", FAMILIES)
def test_ner_entities_equal_transformers(family: str, exported: dict, client: httpx.Client) -> None:
    name = _name(family, "ner")
    folder, bundle = exported[name]
    manifest, tokenizer = _manifest(bundle), BertTokenizer.from_pretrained(bundle / "tokenizer")
    length, stride = ner_windows(manifest["task_settings"], manifest["max_seq_length"])
    texts = [*TEXTS, " ".join(TEXTS * 2)]  # the last one takes several windows
    features = build_ner_features(tokenizer, texts, max_seq_length=length, stride=stride)
    (logits,) = _rows(_theirs(family, "ner", folder), features, tokenizer.pad_id, ("logits",))
    worst, found = 0.0, 0
    for strategy in NER_STRATEGIES:
        expected = ner_postprocess(features, logits, manifest["labels"], aggregation_strategy=strategy)
        served = _post(client, "/ner", {"inputs": texts, "aggregation_strategy": strategy, "model": name})
        for index, (entities, text) in enumerate(zip(served, texts, strict=True)):
            reference = expected.get(index, [])
            assert [(e["entity_group"], e["word"], e["start"], e["end"]) for e in entities] == [
                (e["entity_group"], e["word"], e["start"], e["end"]) for e in reference
            ], (family, strategy, text)
            worst = max(worst, 0.0, *(abs(a["score"] - b["score"]) for a, b in zip(entities, reference, strict=True)))
            for entity in entities:
                word = entity["word"]
                assert text[entity["start"] : entity["end"]] == word and word and word == word.strip(), entity
            found += len(entities)
    print(f"\n{family} ner: {found} entities equal, max |served - transformers| score {worst:.1e}")
    assert found > 0 and worst <= TOLERANCE


def test_models_lists_every_family(exported: dict, client: httpx.Client) -> None:
    models = {model["name"]: model for model in client.get("/models").json()["models"]}
    for family in FAMILIES:
        for task in TASKS:
            name = _name(family, task)
            assert models[name]["task"] == task and models[name]["variant"] == "cpu-fp32"
            assert models[name]["family"] == family == _manifest(exported[name][1])["source"]["model_type"]
