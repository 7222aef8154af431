"""Serving bundles: the contract an export writes and a server reads (`spec`), finding and opening them for
serving (`serving`), which variant of a bundle serves on this machine (`variant_choice`, from `hardware`), and how a
variant's runtime is opened with the serving threads (`runtimes`: ONNX Runtime, OpenVINO).

Torch-free and onnx-free: the export, the service, the benchmarks and the load tests' Triton peer all read bundles
through this package, so each of those decisions is made in one place.
"""
