"""build_bundle: the manifest contract, the three task heads, refusals, and bad input leaving nothing behind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from bert_model.tokenization import BertTokenizer
from bundles.runtimes import CPU_RUNTIMES
from bundles.spec import OUTPUT_NAMES, BundleManifest
from bundles.variant_choice import CPU_ORDERS, GPU_ORDER
from export import variants as variant_table
from export.bundle import build_bundle
from export.parity import AccuracyGuardError

NO_DATA = Path("/nonexistent")


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_every_variant_the_export_builds_has_its_place_in_every_order() -> None:
    cpu = {name for name, recipe in variant_table.RECIPES.items() if recipe.provider in CPU_RUNTIMES}
    assert all(set(order) == cpu for order in CPU_ORDERS.values())
    assert set(GPU_ORDER) == set(variant_table.RECIPES) - cpu


def test_bundle_holds_manifest_tokenizer_and_variants(tiny_bundle: Path) -> None:
    manifest = BundleManifest.read(tiny_bundle)
    assert manifest.task == "classify" and manifest.labels == ["negative", "positive"]
    assert manifest.max_seq_length == 512
    assert set(manifest.variants) == {"cpu-fp32", "cpu-int8", "gpu-fp16"}
    assert manifest.variants["gpu-fp16"].provider == "CUDAExecutionProvider"
    assert manifest.variants["cpu-fp32"].fused_ops["Attention"] == 2
    assert manifest.variants["cpu-int8"].fused_ops["QAttention"] == 2
    assert manifest.source["guard_inputs"]["source"] == "built-in sentences"
    assert sorted(p.name for p in tiny_bundle.iterdir()) == [
        "cpu-fp32.onnx",
        "cpu-int8.onnx",
        "gpu-fp16.onnx",
        "manifest.json",
        "tokenizer",
    ]
    tokenizer = BertTokenizer.from_pretrained(tiny_bundle / "tokenizer")
    assert tokenizer.model_max_length == 512
    assert not leftovers(tiny_bundle.parent) or all(not n.startswith(".") for n in leftovers(tiny_bundle.parent))


def test_bundle_is_readable_by_other_users(tiny_bundle: Path) -> None:
    """The serving container runs as another uid than the one that exported: folders 0755, files 0644."""
    paths = [tiny_bundle, *tiny_bundle.rglob("*")]
    assert any(p.is_file() for p in paths) and any(p.is_dir() for p in paths[1:])
    for path in paths:
        expected = 0o755 if path.is_dir() else 0o644
        assert path.stat().st_mode & 0o777 == expected, f"{path}: {oct(path.stat().st_mode & 0o777)}"


def test_gpu_fp16_graph_is_checked_and_runs_on_cpu(tiny_bundle: Path) -> None:
    import onnx

    path = tiny_bundle / "gpu-fp16.onnx"
    onnx.checker.check_model(str(path))
    graph = onnx.load(str(path))
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in graph.graph.initializer)
    assert all(i.type.tensor_type.elem_type == onnx.TensorProto.INT64 for i in graph.graph.input)
    assert graph.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT  # keep_io_types
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids = np.array([[2, 10, 11, 3]])
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    assert session.run(None, feed)[0].shape == (1, 2)


@pytest.mark.parametrize("task", ["ner", "qa"])
def test_token_and_span_tasks(task: str, tiny_models: dict[str, Path], tmp_path: Path) -> None:
    result = build_bundle(
        tiny_models[task], tmp_path / task, variants="cpu-fp32,cpu-int8", max_seq_len=64, data_dir=NO_DATA
    )
    manifest = result.manifest
    assert manifest.task == task and manifest.max_seq_length == 64
    assert manifest.variants["cpu-fp32"].parity["max_abs_diff"] <= 1e-4
    session = ort.InferenceSession(str(tmp_path / task / "cpu-fp32.onnx"), providers=["CPUExecutionProvider"])
    assert tuple(o.name for o in session.get_outputs()) == OUTPUT_NAMES[task]
    ids = np.array([[2, 10, 11, 12, 3]] * 3)
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    outputs = session.run(None, feed)
    assert outputs[0].shape[:2] == (3, 5)
    if task == "ner":
        assert manifest.labels[0] == "O" and outputs[0].shape == (3, 5, 5)
    int8 = manifest.variants["cpu-int8"].parity  # built-in sentences: judged against fp32's decoded predictions
    assert int8["judgment"] == "agreement-with-fp32" == manifest.source["guard_inputs"]["judgment"]
    assert int8["answer_f1_vs_fp32" if task == "qa" else "entity_f1_vs_fp32"] >= 99.0


def test_not_a_model_folder_is_refused_and_nothing_written(tmp_path: Path) -> None:
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    out = tmp_path / "out" / "bundle"
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        build_bundle(empty, out, data_dir=NO_DATA)
    assert leftovers(tmp_path / "out") == []
    with pytest.raises(FileNotFoundError, match="neither a model folder nor a built-in"):
        build_bundle("no-such-model", out, data_dir=NO_DATA)


def test_unknown_variant_and_bad_length_fail_before_work(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown variant 'cpu-int4'"):
        build_bundle(tiny_models["classify"], tmp_path / "b", variants="cpu-fp32,cpu-int4")
    with pytest.raises(ValueError, match=r"max_seq_len must be an integer in \[8, 512\]"):
        build_bundle(tiny_models["classify"], tmp_path / "b", max_seq_len=4096)
    assert leftovers(tmp_path) == []


def test_unwritable_output_is_a_clear_error(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises((PermissionError, NotADirectoryError), match="a-file"):
        build_bundle(tiny_models["classify"], blocker / "bundle", data_dir=NO_DATA)
    with pytest.raises(NotADirectoryError, match="is not a folder"):
        build_bundle(tiny_models["classify"], blocker, data_dir=NO_DATA)


def test_failure_midway_leaves_no_half_written_bundle(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "bundle"
    build_bundle(tiny_models["classify"], out, variants="cpu-fp32", data_dir=NO_DATA)
    before = (out / "manifest.json").read_text()

    def broken(sources: object, target: Path) -> None:
        target.write_bytes(b"partial")
        raise RuntimeError("disk full")

    recipe = variant_table.RECIPES["cpu-int8"]
    monkeypatch.setitem(variant_table.RECIPES, "cpu-int8", variant_table.Recipe(**{**recipe.__dict__, "build": broken}))
    with pytest.raises(RuntimeError, match="disk full"):
        build_bundle(tiny_models["classify"], out, variants="cpu-fp32,cpu-int8", data_dir=NO_DATA)
    assert leftovers(tmp_path) == ["bundle"]  # no scratch folder left; the old bundle is untouched
    assert (out / "manifest.json").read_text() == before


def test_variant_outside_its_guard_is_refused(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import export.parity

    monkeypatch.setattr(export.parity, "TASK_AGREEMENT", 1.01)  # no int8 graph can agree on 101% of inputs
    result = build_bundle(tiny_models["classify"], tmp_path / "b", variants="cpu-fp32,cpu-int8", data_dir=NO_DATA)
    assert "cpu-int8" in result.refused and "label_agreement" in result.refused["cpu-int8"]
    assert sorted(p.name for p in (tmp_path / "b").glob("*.onnx")) == ["cpu-fp32.onnx"]
    assert result.manifest.source["refused_variants"] == result.refused
    with pytest.raises(AccuracyGuardError, match="variant cpu-int8 refused: label_agreement"):
        build_bundle(
            tiny_models["classify"], tmp_path / "c", variants="cpu-fp32,cpu-int8", data_dir=NO_DATA, strict=True
        )
    assert not (tmp_path / "c").exists()
