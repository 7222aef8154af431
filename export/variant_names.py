"""The names of the precision variants a bundle can hold, importable without onnx.

`bertserve` composes every stage's subcommands, so the export command's defaults are read in the torch-free,
onnx-free serving image too; how each variant is built lives in variants.py.
"""

from __future__ import annotations

DEFAULT_VARIANTS: tuple[str, ...] = (
    "cpu-fp32",
    "cpu-int8",
    "cpu-int8-static",
    "gpu-fp16",
    "openvino-int8",
    "openvino-bf16",
    "openvino-int8-static",
)
"""What `bertserve export` writes when no `--variants` is given (a variant whose runtime or build package is
missing is skipped with the reason; one outside its accuracy guard is refused)."""
