"""The names of the precision variants a bundle can hold, importable without onnx.

`bertserve` composes every stage's subcommands, so the export command's defaults are read in the torch-free,
onnx-free serving image too; how each variant is built lives in variants.py.
"""

from __future__ import annotations

DEFAULT_VARIANTS: tuple[str, ...] = ("cpu-fp32", "cpu-int8", "gpu-fp16", "openvino-int8", "openvino-bf16")
"""What `bertserve export` writes when no `--variants` is given."""

CPU_PREFERENCE: tuple[str, ...] = ("openvino-int8", "openvino-bf16", "openvino-int8-static", "cpu-int8", "cpu-fp32")
"""Which written variant the manifest names as the CPU default: the first present (fastest measured first).
openvino-int8-static (opt-in) measured no faster than openvino-int8 on an AMX CPU, and faster than openvino-bf16 at
batch 1 but slower at batch 16; it ranks after both and before the ONNX Runtime variants."""
