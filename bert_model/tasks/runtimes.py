"""The runtimes a bundle's graphs name (`VariantSpec.provider`), and which of them this process can run.

Torch-free and onnx-free (onnxruntime and openvino are imported only when asked about): export (which variants to
build and guard), the service (which variant to serve) and the load tests' Triton peer (which graph to put behind
Triton) ask the same question the same way.
"""

from __future__ import annotations

import functools
import importlib.util
import logging

log = logging.getLogger(__name__)

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"
OPENVINO_PROVIDER = "OpenVINO"
"""A variant whose graph runs on the OpenVINO runtime (the optional `openvino` extra), not ONNX Runtime."""
CPU_RUNTIMES = (CPU_PROVIDER, OPENVINO_PROVIDER)
"""Providers of the variants that run on the CPU."""


@functools.cache
def openvino_available() -> bool:
    """Whether `openvino` imports (installed is not enough: a broken install fails only on import)."""
    if importlib.util.find_spec("openvino") is None:
        return False
    try:
        import openvino  # noqa: F401
    except Exception as error:  # a native library that fails to load raises more than ImportError
        log.warning("openvino is installed but does not import: %s", error)
        return False
    return True


def cuda_available() -> bool:
    """Whether this process's ONNX Runtime has the CUDA execution provider."""
    if importlib.util.find_spec("onnxruntime") is None:
        return False
    import onnxruntime

    return CUDA_PROVIDER in onnxruntime.get_available_providers()


def can_run(provider: str) -> bool:
    """Whether this process can run a graph built for `provider`."""
    if provider == CUDA_PROVIDER:
        return cuda_available()
    if provider == OPENVINO_PROVIDER:
        return openvino_available()
    return provider == CPU_PROVIDER
