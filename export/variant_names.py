"""The names of the precision variants a bundle can hold, importable without onnx.

`bertserve` composes every stage's subcommands, so the export command's defaults are read in the torch-free,
onnx-free serving image too; how each variant is built lives in variants.py.
"""

from __future__ import annotations

DEFAULT_VARIANTS: tuple[str, ...] = (
    "cpu-fp32",
    "cpu-int8",
    "gpu-fp16",
    "openvino-int8",
    "openvino-bf16",
    "openvino-int8-static",
)
"""What `bertserve export` writes when no `--variants` is given (a variant whose runtime or build package is
missing is skipped with the reason; one outside its accuracy guard is refused)."""

CPU_PREFERENCE: tuple[str, ...] = ("openvino-int8-static", "openvino-int8", "openvino-bf16", "cpu-int8", "cpu-fp32")
"""Which written variant the manifest names as the CPU default: the first present (fastest measured first).
openvino-int8-static served more answers per second than openvino-int8 in alternated load tests on an AMX CPU
(/classify and QA.Extract, batches of at most 8), and ran well ahead of it in a probe on an AMD Zen 4 CPU; at batch 16
x 128 on AMX the three OpenVINO variants are within this host's noise of each other (docs/export.md, "Statically
calibrated int8")."""
