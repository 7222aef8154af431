"""The manifest carries the model's own task settings (`task_settings`): what `bertserve evaluate` reads, fitted.

The service uses them as its windows and decoding defaults (tests/service/test_task_settings.py), so a model
fine-tuned on 256-token QA windows is served on 256-token windows even from a 512-position graph.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bert_model.config import BertConfig
from bert_model.heads import BertForQuestionAnswering
from bert_model.registry import resolve_model_path
from bundles.spec import BundleManifest
from export.bundle import build_bundle
from export.task_guard import served_task_settings
from tests.export.conftest import tiny_config, write_vocab

NO_DATA = Path("/nonexistent")
TRAINED_QA = {
    "name": "qa",
    "max_seq_length": 48,
    "doc_stride": 16,
    "max_query_length": 12,
    "max_answer_length": 10,
    "version_2": True,
    "null_threshold": -1.5,
}


def save_trained_qa(folder: Path, settings: dict) -> Path:
    """A tiny QA model saved as `bertserve finetune` saves one: its task settings under `bertserve.task`."""
    torch.manual_seed(0)
    config = tiny_config()
    model = BertForQuestionAnswering(config.replace(extra={"bertserve": {"task": settings}}))
    model.save_pretrained(folder)  # type: ignore[operator]
    write_vocab(folder)
    return folder


def test_export_writes_the_models_task_settings_into_the_manifest(tmp_path: Path) -> None:
    model = save_trained_qa(tmp_path / "trained-qa", TRAINED_QA)
    result = build_bundle(model, tmp_path / "bundle", variants="cpu-fp32", max_seq_len=64, data_dir=NO_DATA)
    expected = {k: v for k, v in TRAINED_QA.items() if k != "name"}
    assert result.manifest.max_seq_length == 64  # the graph's capacity stays what export was asked for
    assert result.manifest.task_settings == expected
    assert json.loads((tmp_path / "bundle" / "manifest.json").read_text())["task_settings"] == expected
    assert BundleManifest.read(tmp_path / "bundle").task_settings == expected
    # the guard judged the variants on those same windows
    assert result.manifest.source["guard_inputs"]["settings"]["max_seq_length"] == 48


def test_models_without_stored_settings_get_none(tiny_models: dict[str, Path]) -> None:
    for task in ("classify", "ner", "qa"):
        assert served_task_settings(task, BertConfig.load(tiny_models[task]), 64) == {}


def test_stored_settings_are_fitted_to_the_graph_as_the_guard_fits_them() -> None:
    config = tiny_config().replace(extra={"bertserve": {"task": {**TRAINED_QA, "max_seq_length": 256}}})
    settings = served_task_settings("qa", config, 64)
    assert (settings["max_seq_length"], settings["max_query_length"], settings["doc_stride"]) == (64, 12, 16)
    ner = tiny_config().replace(extra={"bertserve": {"task": {"name": "ner", "max_seq_length": 128, "stride": 32}}})
    assert served_task_settings("ner", ner, 512) == {"max_seq_length": 128, "stride": 32}
    assert served_task_settings("ner", ner, 64) == {"max_seq_length": 64, "stride": 15}
    classify = tiny_config().replace(extra={"bertserve": {"task": {"name": "classify", "max_seq_length": 128}}})
    assert served_task_settings("classify", classify, 512) == {}  # a classifier's window settings are not served
    multi_label = classify.replace(problem_type="multi_label_classification")
    assert served_task_settings("classify", multi_label, 512) == {"problem_type": "multi_label_classification"}


def test_default_qa_model_settings_are_evaluate_s() -> None:
    try:
        folder = resolve_model_path("minilm-squad")
    except FileNotFoundError:
        pytest.skip("no default model minilm-squad: run `make default-models`")
    settings = served_task_settings("qa", BertConfig.load(folder), 512)
    assert settings == {
        "max_seq_length": 256,
        "doc_stride": 128,
        "max_query_length": 64,
        "max_answer_length": 15,
        "version_2": False,
        "null_threshold": None,
    }
