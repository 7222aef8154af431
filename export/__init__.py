"""PyTorch -> ONNX -> optimized / quantized ONNX serving bundles, parity guards, Triton repository.

Entry points: `export.bundle.build_bundle` (the Python API), `export.triton.write_triton_repository`, and the
`bertserve export` command (bertserve/commands/export.py). The model benchmark is `bertserve.benchmarks.model`.
"""
