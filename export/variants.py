"""The precision variants a bundle can hold: how each is built from the exported graphs, and how it runs.

Every variant starts from one of two graphs of the same model: `raw` (the traced opset-17 graph after
canonicalize.py) or `fused` (after ONNX Runtime's BERT fusions: Attention, SkipLayerNormalization,
EmbedLayerNormalization, BiasGelu).

| variant | built from | how | runs on |
|---|---|---|---|
| cpu-fp32 | fused | as is | ONNX Runtime CPU |
| cpu-int8 | fused | dynamic int8, per-channel weights (QAttention + DynamicQuantizeMatMul) | ONNX Runtime CPU |
| cpu-int8-static | fused | cpu-int8 with activation scales fixed on guard inputs (calibrated) | ONNX Runtime CPU |
| gpu-fp16 | fused | fp16 weights and compute, fp32 inputs/outputs (keep_io_types) | ONNX Runtime CUDA / TensorRT |
| openvino-int8 | raw | int8 weights per channel; activations int8 per group at run time; rest bf16 | OpenVINO CPU |
| openvino-bf16 | raw | fp32 graph, OpenVINO inference precision bf16 (AVX512-BF16) | OpenVINO CPU |
| openvino-int8-static | raw | int8 weights + activations, calibrated on guard inputs (NNCF); rest bf16 | OpenVINO CPU |

cpu-int8 quantizes each activation tensor with one scale over the whole batch, so a row's answer depends on its
batchmates (export/invariance.py judges every variant by that); cpu-int8-static computes the same int8 kernels with
scales calibrated in advance (export/quantize.py), row by row.

openvino-int8 stores int8 weights behind DequantizeLinear; OpenVINO's CPU plugin runs those MatMuls with int8
(VNNI) kernels and quantizes their activations dynamically per group of 32 channels. OpenVINO is the optional
`openvino` extra. openvino-int8-static is a QDQ graph written by NNCF (export/static_quant.py; NNCF is an
export-time dependency, in the `train` extra).

The OpenVINO variants carry their compile settings in `VariantSpec.runtime_options`; the file is still a
standard ONNX graph (ONNX Runtime runs it too, in float, if OpenVINO is missing). How a variant is opened to run is
`bundles.runtimes`' (the guard opens it as the service does).
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from bundles.runtimes import OPENVINO_PROVIDER, openvino_available
from bundles.spec import VariantSpec
from export.quantize import quantize_dynamic_int8, quantize_static_int8, weight_only_int8


@dataclass
class Sources:
    """The graphs and data a variant is built from."""

    raw: Path
    fused: Path
    calibration: list[dict[str, np.ndarray]] = field(default_factory=list)
    """Model batches of the task's own inputs (the accuracy guard's) for statically calibrated variants."""


@dataclass(frozen=True)
class Recipe:
    name: str
    provider: str
    """ONNX Runtime execution provider, or OPENVINO_PROVIDER."""
    precision: str
    build: Callable[[Sources, Path], None]
    runtime_options: tuple[tuple[str, str], ...] = ()
    """OpenVINO `compile_model` settings (written to the manifest); empty for ONNX Runtime variants."""
    build_requires: tuple[str, ...] = ()
    """Python packages that building (not running) the variant needs."""

    @property
    def file(self) -> str:
        return f"{self.name}.onnx"

    def spec(self) -> VariantSpec:
        """The manifest entry of the variant, before its guard's figures and fused-op counts are added."""
        return VariantSpec(self.file, self.provider, self.precision, runtime_options=dict(self.runtime_options))

    def unavailable(self) -> str | None:
        """Why this variant cannot be built and checked here (its runtime is missing), or None."""
        if self.provider == OPENVINO_PROVIDER and not openvino_available():
            return "needs the OpenVINO runtime: pip install 'bertserve[openvino]'"
        for package in self.build_requires:
            if importlib.util.find_spec(package) is None:
                return f"needs {package} to build: pip install 'bertserve[train]'"
        return None


def _copy_fused(sources: Sources, target: Path) -> None:
    shutil.copyfile(sources.fused, target)


def _copy_raw(sources: Sources, target: Path) -> None:
    shutil.copyfile(sources.raw, target)


def _dynamic_int8(sources: Sources, target: Path) -> None:
    quantize_dynamic_int8(sources.fused, target)


def _weight_only_int8(sources: Sources, target: Path) -> None:
    weight_only_int8(sources.raw, target)


class CannotBuild(Exception):
    """A variant that cannot be built from this export's inputs: skipped with the reason, like a missing runtime."""


def _static_int8(sources: Sources, target: Path) -> None:
    from export.static_quant import TooFewCalibrationExamples, static_int8

    try:
        static_int8(sources.raw, target, sources.calibration)
    except TooFewCalibrationExamples as error:
        raise CannotBuild(str(error)) from error


def _fixed_scale_int8(sources: Sources, target: Path) -> None:
    from export.static_quant import TooFewCalibrationExamples, calibration_samples

    try:
        samples = calibration_samples(sources.calibration)
    except TooFewCalibrationExamples as error:
        raise CannotBuild(str(error)) from error
    quantize_static_int8(sources.fused, target, samples)


def _fp16(sources: Sources, target: Path) -> None:
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = OnnxModel(onnx.load(str(sources.fused)))
    model.convert_float_to_float16(keep_io_types=True)
    onnx.save(model.model, str(target))
    onnx.checker.check_model(str(target))


OPENVINO_INT8: tuple[tuple[str, str], ...] = (
    ("INFERENCE_PRECISION_HINT", "bf16"),
    ("DYNAMIC_QUANTIZATION_GROUP_SIZE", "32"),
)
RECIPES: dict[str, Recipe] = {
    recipe.name: recipe
    for recipe in (
        Recipe("cpu-fp32", "CPUExecutionProvider", "fp32", _copy_fused),
        Recipe("cpu-int8", "CPUExecutionProvider", "int8", _dynamic_int8),
        Recipe("cpu-int8-static", "CPUExecutionProvider", "int8", _fixed_scale_int8),
        Recipe("gpu-fp16", "CUDAExecutionProvider", "fp16", _fp16),
        Recipe("openvino-int8", OPENVINO_PROVIDER, "int8", _weight_only_int8, OPENVINO_INT8),
        Recipe("openvino-bf16", OPENVINO_PROVIDER, "bf16", _copy_raw, (("INFERENCE_PRECISION_HINT", "bf16"),)),
        Recipe(
            "openvino-int8-static",
            OPENVINO_PROVIDER,
            "int8",
            _static_int8,
            (("INFERENCE_PRECISION_HINT", "bf16"),),
            build_requires=("nncf",),
        ),
    )
}


def parse_variants(names: str | list[str] | tuple[str, ...]) -> list[str]:
    """Validate a comma-separated string or list of variant names (raises ValueError naming the unknown one)."""
    items = [n.strip() for n in names.split(",")] if isinstance(names, str) else [str(n).strip() for n in names]
    items = [n for n in items if n]
    if not items:
        raise ValueError(f"no variant given; choose from {', '.join(RECIPES)}")
    for name in items:
        if name not in RECIPES:
            raise ValueError(f"unknown variant {name!r}; choose from {', '.join(RECIPES)}")
    return list(dict.fromkeys(items))
