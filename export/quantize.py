"""Int8 quantization of the fused graph with ONNX Runtime's quantizer.

References: ONNX Runtime quantization docs (dynamic vs static, QOperator vs QDQ formats); Jacob et al. (2018),
"Quantization and Training of Neural Networks for Efficient Integer-Arithmetic-Only Inference" (affine int8).

- Dynamic: weights int8 per output channel, activations quantized per tensor at run time. On the fused BERT
  graph the quantizer turns `Attention` into `QAttention` and `MatMul` into `MatMulInteger` (+ scale), which ORT
  fuses into `DynamicQuantizeMatMul` / `MatMulIntegerToFloat`. The quantizer's shape inference fails on
  contrib ops unless `DefaultTensorType` is set (../shared/README.md).
- Weight-only: int8 weights behind DequantizeLinear, activations in float in the graph; OpenVINO's CPU plugin
  runs such MatMuls with int8 kernels and quantizes activations dynamically per group of channels.

Statically calibrated int8 (activation ranges measured in advance) is not built here but by NNCF in
`export/static_quant.py` (the `openvino-int8-static` variant): one range per tensor over every MatMul, as ONNX
Runtime's static quantizer writes it, kept the same SST-2 label on only 95.6-97.3% of inputs, because BERT's outlier
activation channels defeat a per-tensor range; that recipe keeps the MatMuls most hurt by it in bf16.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx


def quantize_dynamic_int8(
    source: Path,
    target: Path,
    *,
    per_channel: bool = True,
    reduce_range: bool = False,
    op_types: tuple[str, ...] = ("MatMul", "Attention"),
) -> Path:
    """Per-channel dynamic int8 quantization of `source` (a fused graph) into `target`."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.getLogger("root").setLevel(logging.ERROR)
    quantize_dynamic(
        str(source),
        str(target),
        per_channel=per_channel,
        reduce_range=reduce_range,
        weight_type=QuantType.QInt8,
        op_types_to_quantize=list(op_types),
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT, "MatMulConstBOnly": True},
    )
    return target


def weight_only_int8(source: Path, target: Path) -> Path:
    """Int8 weights (symmetric, per output channel) behind `DequantizeLinear`, activations left in float.

    Every MatMul whose second input is a 2-D float initializer W (K, N) gets W ≈ scale[n] · Wq[k, n], Wq int8 in
    [-127, 127], stored as an int8 initializer + DequantizeLinear(axis=1). Runtimes that recognise compressed
    weights (OpenVINO's CPU plugin) then run the MatMul with int8 weights and, with dynamic quantization,
    int8 activations quantized per token group at run time.
    """
    from onnx import helper, numpy_helper

    model = onnx.load(str(source))
    initializers = {t.name: t for t in model.graph.initializer}
    new_nodes = []
    for node in model.graph.node:
        weight = initializers.get(node.input[1]) if node.op_type == "MatMul" else None
        if weight is None or len(weight.dims) != 2 or weight.data_type != onnx.TensorProto.FLOAT:
            new_nodes.append(node)
            continue
        values = numpy_helper.to_array(weight)
        scale = np.maximum(np.abs(values).max(axis=0), 1e-12) / 127.0
        quantized = np.clip(np.round(values / scale), -127, 127).astype(np.int8)
        base = f"{weight.name}__int8"
        model.graph.initializer.extend(
            [
                numpy_helper.from_array(quantized, base),
                numpy_helper.from_array(scale.astype(np.float32), f"{base}_scale"),
                numpy_helper.from_array(np.zeros(scale.shape, np.int8), f"{base}_zero"),
            ]
        )
        dequantized = f"{base}_dq"
        new_nodes.append(
            helper.make_node(
                "DequantizeLinear", [base, f"{base}_scale", f"{base}_zero"], [dequantized], name=dequantized, axis=1
            )
        )
        node.input[1] = dequantized
        new_nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(new_nodes)
    used = {name for node in model.graph.node for name in node.input}
    kept = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    onnx.save(model, str(target))
    return target
