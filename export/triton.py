"""Triton Inference Server model repository for a serving bundle: `DIR/<model>/config.pbtxt` + `1/model.onnx`.

Reference: Triton's model configuration schema (model_config.proto, shipped as
`tritonclient.grpc.model_config_pb2`) and the onnxruntime backend's documented options: the configuration is
built as that protobuf message and written in protobuf text format, so every field name is checked by
construction. Dynamic batching with a queue delay and a bounded queue (`default_queue_policy`: requests over
`max_queue_size` are rejected, requests waiting longer than the timeout are rejected); GPU models ask the
onnxruntime backend for TensorRT in fp16 (the CUDA provider runs the fp16 graph where TensorRT does not).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from bundles.runtimes import CPU_PROVIDER, CUDA_PROVIDER, OPENVINO_PROVIDER
from bundles.spec import INPUT_NAMES, BundleManifest
from bundles.variant_choice import choose_variant

ONNXRUNTIME = "Triton's onnxruntime backend"


@dataclass
class TritonOptions:
    """Scheduling options of the generated config.pbtxt."""

    gpu: bool = False
    """Use the gpu-fp16 variant on GPU instances (TensorRT fp16 accelerator); else a CPU variant."""
    variant: str | None = None
    """Bundle variant to serve; default the GPU variant on GPU, else the CPU variant the service would serve without
    OpenVINO (`bundles.variant_choice`)."""
    model_name: str | None = None
    """Name in the repository; default the bundle's manifest name."""
    max_batch_size: int = 32
    """Largest batch Triton forms (requests are single rows or small batches)."""
    max_queue_delay_us: int = 2000
    """How long the dynamic batcher waits to fill a batch."""
    max_queue_size: int = 256
    """Requests queued beyond this are rejected at once (overload sheds load instead of growing latency)."""
    queue_timeout_us: int = 1_000_000
    """Requests waiting longer than this are rejected."""
    instances: int = 1
    """Model instances (per GPU, or on CPU)."""
    cpu_threads: int = 0
    """intra_op_thread_count for CPU instances; 0 leaves the backend's default."""

    def validate(self) -> None:
        for name in ("max_batch_size", "max_queue_size", "queue_timeout_us", "instances"):
            if getattr(self, name) < 1:
                raise ValueError(f"Triton option {name} must be >= 1, got {getattr(self, name)}")
        if self.max_queue_delay_us < 0 or self.cpu_threads < 0:
            raise ValueError("Triton options max_queue_delay_us and cpu_threads must be >= 0")


def _output_dims(manifest: BundleManifest) -> dict[str, list[int]]:
    """Per-request output shapes (batch dimension excluded; -1 = variable: sequence length, masked positions, or a
    size the manifest does not state: hidden, vocabulary)."""
    labels = len(manifest.labels)
    dims = {
        "classify": {"logits": [labels]},
        "qa": {"start_logits": [-1], "end_logits": [-1]},
        "ner": {"logits": [-1, labels]},
        "embed": {"pooled_embedding": [-1], "normalized_embedding": [-1], "token_embeddings": [-1, -1]},
        "fill-mask": {"mask_logits": [-1, -1]},
        "rerank": {"logits": [1]},
    }[manifest.task]
    return {name: dims[name] for name in manifest.outputs}  # a bundle of an earlier build lacks on-request outputs


def model_config(
    manifest: BundleManifest, options: TritonOptions, inputs: Sequence[str] = INPUT_NAMES
) -> pb.ModelConfig:
    """The Triton ModelConfig message for a bundle whose graph takes `inputs` (a DistilBERT or RoBERTa-style graph
    has no token_type_ids)."""
    options.validate()
    config = pb.ModelConfig(
        name=options.model_name or manifest.name, backend="onnxruntime", max_batch_size=options.max_batch_size
    )
    for name in inputs:
        config.input.add(name=name, data_type=pb.TYPE_INT64, dims=[-1])
    for name, dims in _output_dims(manifest).items():
        config.output.add(name=name, data_type=pb.TYPE_FP32, dims=dims)
    batching = config.dynamic_batching
    batching.max_queue_delay_microseconds = options.max_queue_delay_us
    batching.default_queue_policy.timeout_action = pb.ModelQueuePolicy.REJECT
    batching.default_queue_policy.default_timeout_microseconds = options.queue_timeout_us
    batching.default_queue_policy.allow_timeout_override = True
    batching.default_queue_policy.max_queue_size = options.max_queue_size
    kind = pb.ModelInstanceGroup.KIND_GPU if options.gpu else pb.ModelInstanceGroup.KIND_CPU
    config.instance_group.add(count=options.instances, kind=kind)
    if options.gpu:
        accelerator = config.optimization.execution_accelerators.gpu_execution_accelerator.add(name="tensorrt")
        accelerator.parameters["precision_mode"] = "FP16"
        accelerator.parameters["max_workspace_size_bytes"] = str(1 << 30)
        accelerator.parameters["trt_engine_cache_enable"] = "1"
    elif options.cpu_threads:
        config.parameters["intra_op_thread_count"].string_value = str(options.cpu_threads)
    return config


def triton_variant(manifest: BundleManifest, options: TritonOptions) -> str:
    """The variant the model serves: a forced one that is not OpenVINO's, else the one the service would choose for
    the instances' device among ONNX Runtime's CUDA (GPU instances) or CPU (CPU instances) graphs."""
    if options.variant is not None:
        return choose_variant(
            manifest, forced=options.variant, can_run=lambda wanted: wanted != OPENVINO_PROVIDER, runtime=ONNXRUNTIME
        )
    provider = CUDA_PROVIDER if options.gpu else CPU_PROVIDER
    return choose_variant(
        manifest,
        "cuda" if options.gpu else "cpu",
        can_run=lambda wanted: wanted == provider,
        runtime=f"{ONNXRUNTIME} on {'GPU' if options.gpu else 'CPU'} instances",
    )


def write_triton_repository(bundle_dir: str | Path, repo_dir: str | Path, options: TritonOptions | None = None) -> Path:
    """Add the bundle as one model to the repository `repo_dir` (created if absent); returns the model folder.

    The model folder is written in a temporary folder and renamed into place, replacing an older one.
    """
    options = options or TritonOptions()
    options.validate()
    manifest = BundleManifest.read(bundle_dir)
    variant = triton_variant(manifest, options)
    graph = Path(bundle_dir) / manifest.variants[variant].file
    config = model_config(manifest, options, graph_inputs(graph))
    repo = Path(repo_dir)
    repo.mkdir(parents=True, exist_ok=True)
    target = repo / config.name
    scratch = Path(tempfile.mkdtemp(prefix=f".{config.name}.", dir=repo))
    try:
        (scratch / "1").mkdir()
        shutil.copyfile(graph, scratch / "1" / "model.onnx")
        (scratch / "config.pbtxt").write_text(text_format.MessageToString(config))
        if target.exists():
            shutil.rmtree(target)
        scratch.rename(target)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return target


def graph_inputs(path: Path) -> list[str]:
    """The bundle inputs a graph takes, in INPUT_NAMES order (read without its weights)."""
    declared = {node.name for node in onnx.load(str(path), load_external_data=False).graph.input}
    return [name for name in INPUT_NAMES if name in declared]


def read_model_config(path: str | Path) -> pb.ModelConfig:
    """Parse a config.pbtxt against Triton's schema (raises text_format.ParseError on an unknown field)."""
    return text_format.Parse(Path(path).read_text(), pb.ModelConfig())
