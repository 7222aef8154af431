"""The export's accuracy guard opens every variant exactly as the service serves it: what ONNX Runtime's
InferenceSession and OpenVINO's compile_model receive is recorded for both paths on a tiny bundle and compared."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from export.bundle import build_bundle

NO_DATA = Path("/nonexistent")
VARIANTS = ("cpu-fp32", "cpu-int8", "gpu-fp16", "openvino-int8", "openvino-bf16")
SPIN_KEYS = ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning")

Record = dict[str, list[Any]]


def record_runtimes(monkeypatch: pytest.MonkeyPatch) -> Record:
    """Variant file name -> what each session / compiled model over it received, in order."""
    import onnxruntime
    import openvino

    calls: Record = {}
    session_class, core_class = onnxruntime.InferenceSession, openvino.Core

    def note(path: object, call: object) -> None:
        name = Path(str(path)).name
        if name.removesuffix(".onnx") in VARIANTS:
            calls.setdefault(name, []).append(call)

    def session(path: object, sess_options: Any = None, providers: Any = None, **kwargs: Any) -> Any:
        note(path, ("InferenceSession", providers, described(sess_options)))
        return session_class(path, sess_options, providers, **kwargs)

    class Core(core_class):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.paths: dict[int, Any] = {}  # id of a read model -> its file

        def read_model(self, path: Any, *args: Any) -> Any:
            model = super().read_model(path, *args)
            self.paths[id(model)] = path
            return model

        def compile_model(self, model: Any, device: Any = None, config: Any = None) -> Any:
            note(self.paths.get(id(model), model), ("compile_model", device, dict(config or {})))
            return super().compile_model(model, device, config)

    monkeypatch.setattr(onnxruntime, "InferenceSession", session)
    monkeypatch.setattr(openvino, "Core", Core)
    return calls


def described(options: Any) -> dict[str, Any]:
    return {
        "intra_op_num_threads": options.intra_op_num_threads,
        "inter_op_num_threads": options.inter_op_num_threads,
        "graph_optimization_level": str(options.graph_optimization_level),
        "execution_mode": str(options.execution_mode),
        "log_severity_level": options.log_severity_level,
        **{key: options.get_session_config_entry(key) for key in SPIN_KEYS},
    }


def served(bundle: Path, variant: str) -> None:
    """Load `bundle` in the service with its default settings, `variant` forced; close."""
    from service.engine.engine import Engine
    from service.settings import ServiceSettings

    async def run() -> None:
        service = Engine(
            ServiceSettings(models=[str(bundle)], variant=variant, device="cpu", warmup_rounds=0, grpc_port=-1)
        )
        try:
            await service.load()
            service.set_ready()
        finally:
            await service.close()

    asyncio.run(run())


def test_the_guard_opens_each_variant_as_the_service_serves_it(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("openvino", reason="the optional openvino extra is not installed")
    calls = record_runtimes(monkeypatch)
    result = build_bundle(tiny_models["classify"], tmp_path / "b", variants=",".join(VARIANTS), data_dir=NO_DATA)
    assert set(result.manifest.variants) == set(VARIANTS), result.refused
    guard = {name: list(opened) for name, opened in calls.items()}
    calls.clear()
    served_here = [variant for variant in VARIANTS if variant != "gpu-fp16"]  # the GPU graph serves on CUDA only
    for variant in served_here:
        served(tmp_path / "b", variant)
    for variant in served_here:
        assert calls[f"{variant}.onnx"] == guard[f"{variant}.onnx"], variant
    streams, lone = guard["openvino-bf16.onnx"]  # the service's defaults: two streams and a latency copy
    hint = {"INFERENCE_PRECISION_HINT": "bf16"}
    assert streams == ("compile_model", "CPU", {"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": "2", **hint})
    assert lone == ("compile_model", "CPU", {"PERFORMANCE_HINT": "LATENCY", **hint})
    (session,) = guard["cpu-int8.onnx"]
    assert session[1] == ["CPUExecutionProvider"] and session[2]["session.intra_op.allow_spinning"] == "0"
