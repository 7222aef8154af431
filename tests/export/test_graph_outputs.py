"""Only what the answer needs leaves an encoder graph: the bytes a batch's outputs take (an embed graph's token states
only when asked for), the mask positions a fill-mask graph scores, the manifests that list (or lack) the new outputs,
and the Triton configuration of both."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from bert_model.heads import BertForMaskedLM
from bert_model.modeling import BertModel
from bundles.spec import ON_REQUEST_OUTPUTS, OUTPUT_NAMES, BundleManifest, VariantSpec, sequence_outputs
from export.graph import export_onnx
from export.triton import TritonOptions, model_config
from export.wrapper import GraphOptions, mask_positions
from tests.export.conftest import tiny_config

MASK_ID = 4
BATCH, LENGTH = 8, 128


def feed_with_one_mask_per_row(vocab: int) -> dict[str, np.ndarray]:
    """b8 x s128, every row full length, one mask token each (at different positions)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(5, vocab, size=(BATCH, LENGTH))
    ids[np.arange(BATCH), 1 + 7 * np.arange(BATCH)] = MASK_ID
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


@pytest.mark.parametrize("task", ["embed", "fill-mask"])
def test_only_the_answer_leaves_the_graph(task: str, tmp_path: Path) -> None:
    """b8 x s128: what every call fetches of an embed graph is 2 x B x H floats (the pooled vector and its normalized
    copy; its B x S x H token states only when a call asks for them), of a fill-mask graph with one mask per row
    B x 1 x V (not B x S x V)."""
    torch.manual_seed(0)
    config = tiny_config()
    model = (BertModel if task == "embed" else BertForMaskedLM)(config).eval()
    path = export_onnx(model, task, tmp_path / "graph.onnx", GraphOptions(mask_token_id=MASK_ID))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [output.name for output in session.get_outputs()] == list(OUTPUT_NAMES[task])
    on_request = ON_REQUEST_OUTPUTS.get(task, ())
    fetched = [name for name in OUTPUT_NAMES[task] if name not in on_request]
    feed = feed_with_one_mask_per_row(config.vocab_size)
    outputs = session.run(fetched, feed)
    floats = 2 * config.hidden_size if task == "embed" else config.vocab_size
    assert sum(output.nbytes for output in outputs) == BATCH * floats * 4
    # per-input rows, which the batcher does not cut to a length; the token states are cut to each input's tokens
    assert sequence_outputs(task) == on_request == (("token_embeddings",) if task == "embed" else ())
    for name in on_request:
        (states,) = session.run([name], feed)
        assert states.shape == (BATCH, LENGTH, config.hidden_size)


def test_mask_positions_come_in_position_order_then_filler() -> None:
    ids = torch.tensor(
        [
            [2, 9, MASK_ID, 9, MASK_ID, MASK_ID, 3],  # three masks
            [2, MASK_ID, 9, 9, 9, 9, 3],  # one
            [2, 9, 9, 9, 9, 9, 3],  # none
        ]
    )
    positions = mask_positions(ids, MASK_ID)
    assert positions.tolist() == [[2, 4, 5], [1, 0, 2], [0, 1, 2]]  # M = the most masks in one row
    assert mask_positions(ids[2:], MASK_ID).tolist() == [[0]]  # at least one row, even without any mask
    assert mask_positions(torch.full((1, 5), MASK_ID), MASK_ID).tolist() == [[0, 1, 2, 3, 4]]


def manifest_file(folder: Path, task: str, outputs: list[str] | None) -> Path:
    folder.mkdir()
    (folder / "g.onnx").write_bytes(b"")
    data = json.loads(
        BundleManifest(
            name="m",
            task=task,
            max_seq_length=64,
            labels=["a", "b"] if task == "classify" else [],
            variants={"cpu-fp32": VariantSpec("g.onnx", "CPUExecutionProvider", "fp32")},
            source={"model": "/models/enc"},
        ).to_json()
    )
    if outputs is None:
        del data["outputs"]
    else:
        data["outputs"] = outputs
    (folder / "manifest.json").write_text(json.dumps(data))
    return folder


@pytest.mark.parametrize(
    ("task", "outputs", "old"),
    [
        ("embed", ["last_hidden_state"], "last_hidden_state"),
        ("fill-mask", ["logits"], "'logits'"),
        ("embed", ["pooled"], "pooled"),
        ("embed", ["token_embeddings"], "['token_embeddings']"),  # an on-request output alone
        ("embed", ["token_embeddings", "pooled_embedding", "normalized_embedding"], "['token_embeddings', "),
        ("embed", ["pooled_embedding", "normalized_embedding", "token_embeddings", "x"], "'x'"),
    ],
)
def test_a_bundle_with_other_outputs_is_refused_with_how_to_re_export(
    task: str, outputs: list[str] | None, old: str, tmp_path: Path
) -> None:
    folder = manifest_file(tmp_path / "bundle", task, outputs)
    with pytest.raises(ValueError, match="re-export the bundle") as error:
        BundleManifest.read(folder)
    assert old in str(error.value) and f"bertserve export /models/enc --out {folder}" in str(error.value)


def test_a_bundle_of_another_format_is_refused_with_how_to_re_export(tmp_path: Path) -> None:
    folder = manifest_file(tmp_path / "bundle", "classify", ["logits"])
    data = json.loads((folder / "manifest.json").read_text())
    data.update(format_version=1, default_variants={"cpu": "cpu-fp32"})
    (folder / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="has format_version 1 and this build reads 2; re-export the bundle") as error:
        BundleManifest.read(folder)
    assert str(error.value).endswith(f"bertserve export /models/enc --out {folder}")


def test_manifests_list_their_outputs_and_other_tasks_read_without(tmp_path: Path) -> None:
    names = ["pooled_embedding", "normalized_embedding", "token_embeddings"]
    written = BundleManifest.read(manifest_file(tmp_path / "embed", "embed", names))
    assert written.outputs == names and written.output_names == tuple(names[:2])
    assert written.on_request_outputs == ("token_embeddings",)
    # exported before token states were an output: read, served without them
    earlier = BundleManifest.read(manifest_file(tmp_path / "earlier", "embed", names[:2]))
    assert earlier.output_names == tuple(names[:2]) and earlier.on_request_outputs == ()
    unlisted = BundleManifest.read(manifest_file(tmp_path / "classify", "classify", None))  # the task's outputs
    assert unlisted.outputs == ["logits"] and unlisted.on_request_outputs == ()


@pytest.mark.parametrize(
    ("task", "outputs", "expected"),
    [
        (
            "embed",
            [],
            [("pooled_embedding", [-1]), ("normalized_embedding", [-1]), ("token_embeddings", [-1, -1])],
        ),
        (
            "embed",
            ["pooled_embedding", "normalized_embedding"],
            [("pooled_embedding", [-1]), ("normalized_embedding", [-1])],
        ),
        ("fill-mask", [], [("mask_logits", [-1, -1])]),
    ],
)
def test_triton_config_declares_the_encoder_outputs(task: str, outputs: list, expected: list, tmp_path: Path) -> None:
    manifest = BundleManifest(
        name=f"tiny-{task}",
        task=task,
        max_seq_length=64,
        variants={"cpu-fp32": VariantSpec("cpu-fp32.onnx", "CPUExecutionProvider", "fp32")},
        outputs=outputs,  # [] = this build's; an embed bundle of an earlier build lacks the token states
    )
    config = model_config(manifest, TritonOptions())
    assert [(output.name, list(output.dims)) for output in config.output] == expected
