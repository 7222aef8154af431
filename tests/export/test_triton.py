"""Triton model repository: config.pbtxt parsed against Triton's model-config schema (protobuf text format)."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from export.triton import TritonOptions, read_model_config, write_triton_repository


def test_cpu_model_repository(tiny_bundle: Path, tmp_path: Path) -> None:
    folder = write_triton_repository(tiny_bundle, tmp_path / "repo", TritonOptions(cpu_threads=2))
    assert folder == tmp_path / "repo" / "tiny-sst2"
    assert (folder / "1" / "model.onnx").read_bytes() == (tiny_bundle / "cpu-int8.onnx").read_bytes()
    config = text_format.Parse((folder / "config.pbtxt").read_text(), pb.ModelConfig())
    assert config.backend == "onnxruntime" and config.max_batch_size == 32
    assert [i.name for i in config.input] == ["input_ids", "attention_mask", "token_type_ids"]
    assert all(i.data_type == pb.TYPE_INT64 and list(i.dims) == [-1] for i in config.input)
    assert [(o.name, list(o.dims)) for o in config.output] == [("logits", [2])]
    policy = config.dynamic_batching.default_queue_policy
    assert config.dynamic_batching.max_queue_delay_microseconds == 2000
    assert policy.max_queue_size == 256 and policy.default_timeout_microseconds == 1_000_000
    assert policy.timeout_action == pb.ModelQueuePolicy.REJECT
    assert config.instance_group[0].kind == pb.ModelInstanceGroup.KIND_CPU
    assert config.parameters["intra_op_thread_count"].string_value == "2"
    assert not leftovers_hidden(tmp_path / "repo")


def test_gpu_model_uses_fp16_graph_and_tensorrt_fp16(tiny_bundle: Path, tmp_path: Path) -> None:
    options = TritonOptions(gpu=True, model_name="sst2-gpu", instances=2, max_batch_size=64)
    folder = write_triton_repository(tiny_bundle, tmp_path / "repo", options)
    assert (folder / "1" / "model.onnx").read_bytes() == (tiny_bundle / "gpu-fp16.onnx").read_bytes()
    config = read_model_config(folder / "config.pbtxt")
    assert config.name == "sst2-gpu" and config.max_batch_size == 64
    assert config.instance_group[0].kind == pb.ModelInstanceGroup.KIND_GPU and config.instance_group[0].count == 2
    (accelerator,) = config.optimization.execution_accelerators.gpu_execution_accelerator
    assert accelerator.name == "tensorrt" and accelerator.parameters["precision_mode"] == "FP16"


def test_schema_rejects_unknown_fields(tmp_path: Path) -> None:
    bad = tmp_path / "config.pbtxt"
    bad.write_text('name: "m"\nbackend: "onnxruntime"\nmax_batch_sise: 8\n')
    with pytest.raises(text_format.ParseError, match="max_batch_sise"):
        read_model_config(bad)


def test_bad_options_and_variants(tiny_bundle: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_queue_size must be >= 1"):
        write_triton_repository(tiny_bundle, tmp_path / "r", TritonOptions(max_queue_size=0))
    with pytest.raises(ValueError, match="no variant 'openvino-int8': its variants are cpu-fp32, cpu-int8"):
        write_triton_repository(tiny_bundle, tmp_path / "r", TritonOptions(variant="openvino-int8"))
    with pytest.raises(FileNotFoundError, match="not a serving bundle"):
        write_triton_repository(tmp_path, tmp_path / "r")


def leftovers_hidden(repo: Path) -> list[str]:
    return [p.name for p in repo.iterdir() if p.name.startswith(".")]
