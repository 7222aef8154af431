"""PyTorch -> ONNX -> optimized / quantized ONNX serving bundles, parity guards, Triton repository, benchmark.

Entry points: `export.bundle.build_bundle` (the Python API), `export.triton.write_triton_repository`,
`export.bench.run_benchmark`, and the `bertserve export` / `bertserve bench-model` commands (export/cli.py).
"""
