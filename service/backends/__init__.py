"""Where a batch runs: ONNX Runtime / OpenVINO in this process (`ort_backend`) or a Triton server
(`triton_backend`), behind one interface (`base.Backend`)."""
