"""Int8 quantization of the fused graph with ONNX Runtime's quantizer.

References: ONNX Runtime quantization docs (dynamic vs static, QOperator vs QDQ formats); Jacob et al. (2018),
"Quantization and Training of Neural Networks for Efficient Integer-Arithmetic-Only Inference" (affine int8).

- Dynamic: weights int8 per output channel, activations quantized per tensor at run time. On the fused BERT
  graph the quantizer turns `Attention` into `QAttention` and `MatMul` into `MatMulInteger` (+ scale), which ORT
  fuses into `DynamicQuantizeMatMul` / `MatMulIntegerToFloat`. The quantizer's shape inference fails on
  contrib ops unless `DefaultTensorType` is set (../shared/README.md). One scale and zero point per activation
  tensor means one per batch: a row's answer depends on the rows beside it (export/invariance.py refuses it for
  batched serving).
- Static (`quantize_static_int8`): the dynamic graph with every `DynamicQuantizeLinear` replaced by a
  `QuantizeLinear` whose scale and zero point are fixed, from the range its input takes over calibration inputs
  in the fp32 graph (MinMax, as the dynamic operator takes it per batch). The dynamic graph's int8 kernels
  (QAttention, int8 MatMuls with per-channel weights and float output) without its run-time range search, and every
  row is quantized on its own. The task
  heads stay float, and so do the MatMuls whose inputs carry outliers far beyond their bulk (`OUTLIER_RATIO`): in
  BERT encoders, the feed-forward output projections of the layers whose GELU outputs have a few huge channels.
  ONNX Runtime's own `quantize_static` does not fit the fused graph: it leaves `Attention` (a quarter of each
  layer's projections) in float, requantizes every MatMul's output (QLinearMatMul), and its calibration finds no
  activation ranges without symbolic shape inference first.
- Weight-only: int8 weights behind DequantizeLinear, activations in float in the graph; OpenVINO's CPU plugin
  runs such MatMuls with int8 kernels and quantizes activations dynamically per group of channels.

NNCF's statically calibrated graph for OpenVINO (`openvino-int8-static`) is export/static_quant.py's.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

Feed = Mapping[str, np.ndarray]
UINT8_LEVELS = 255
HEADS = r"/model/(bert/pooler|pooler|classifier|qa_outputs|cls)/"
"""Node names of the task heads (pooler, classifier, qa_outputs, the masked-LM head `cls/`), which the static graph
keeps float: they run on one row per input or have a few outputs, so int8 saves nothing there and costs accuracy."""
OUTLIER_RATIO = 5.0
"""A node of the static graph (MatMul, Gemm, Attention) stays float when its input's largest magnitude over the
calibration inputs is more than this many times the magnitude that OUTLIER_QUANTILE of its values stay under: a
fixed per-tensor range that wide leaves the bulk of the values a few dozen of int8's 255 levels. In BERT-like
encoders the inputs of some feed-forward output projections are such (the GELU outputs of a few channels, in every
input, dwarf the rest)."""
OUTLIER_QUANTILE = 0.9999
VALUES_PER_SAMPLE = 4096
"""Values of each calibrated tensor kept per calibration input (at random, seeded) to estimate its quantile."""


def quantize_dynamic_int8(
    source: Path,
    target: Path,
    *,
    per_channel: bool = True,
    reduce_range: bool = False,
    op_types: tuple[str, ...] = ("MatMul", "Attention"),
    exclude: Sequence[str] = (),
) -> Path:
    """Per-channel dynamic int8 quantization of `source` (a fused graph) into `target`; the nodes named in `exclude`
    stay float."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with quiet_root_logger():
        quantize_dynamic(
            str(source),
            str(target),
            per_channel=per_channel,
            reduce_range=reduce_range,
            weight_type=QuantType.QInt8,
            op_types_to_quantize=list(op_types),
            nodes_to_exclude=list(exclude),
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT, "MatMulConstBOnly": True},
        )
    return target


@contextmanager
def quiet_root_logger() -> Iterator[None]:
    """The root logger at ERROR while ONNX Runtime's quantizer runs (it logs every node it skips there), and back at
    its level afterwards, so that the export's own warnings (refused and batch-dependent variants) still show."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


@dataclass
class ActivationStats:
    """What calibration saw of one activation tensor: its range, and a sample of its magnitudes."""

    low: float = np.inf
    high: float = -np.inf
    magnitudes: list[np.ndarray] = field(default_factory=list)

    def add(self, value: np.ndarray, rng: np.random.Generator) -> None:
        self.low, self.high = min(self.low, float(value.min())), max(self.high, float(value.max()))
        flat = np.abs(value.ravel())
        self.magnitudes.append(flat if flat.size <= VALUES_PER_SAMPLE else rng.choice(flat, VALUES_PER_SAMPLE))

    @property
    def outlier_ratio(self) -> float:
        """The largest magnitude over the OUTLIER_QUANTILE one (1 for a tensor without outliers)."""
        bulk = float(np.quantile(np.concatenate(self.magnitudes), OUTLIER_QUANTILE)) if self.magnitudes else 0.0
        return max(abs(self.low), abs(self.high)) / bulk if bulk > 0 else 1.0


def quantize_static_int8(source: Path, target: Path, samples: Sequence[Feed]) -> Path:
    """Per-channel int8 of `source` (a fused graph) into `target` with activation scales fixed by the ranges their
    tensors take over `samples` (single unpadded inputs, so padding never widens a range) in `source` itself. The
    task heads and the nodes whose inputs have outliers (OUTLIER_RATIO) stay float."""
    inputs = quantizable_inputs(onnx.load(str(source), load_external_data=False))
    stats = activation_stats(source, sorted(set(inputs.values())), samples)
    kept = [node for node, name in inputs.items() if re.match(HEADS, node) or stats[name].outlier_ratio > OUTLIER_RATIO]
    # the quantizer rewrites a Gemm as `<name>_MatMul` (+ Add) before it quantizes
    quantize_dynamic_int8(source, target, exclude=[*kept, *(f"{node}_MatMul" for node in kept)])
    model = onnx.load(str(target))
    fix_activation_scales(model, {name: (entry.low, entry.high) for name, entry in stats.items()})
    fuse_integer_matmuls(model)
    onnx.save(model, str(target))
    return target


def quantizable_inputs(model: onnx.ModelProto) -> dict[str, str]:
    """Node name -> the activation input the dynamic quantizer quantizes, for each node it quantizes: MatMul and
    Gemm with a constant weight, and fused Attention."""
    constants = {tensor.name for tensor in model.graph.initializer}
    found: dict[str, str] = {}
    for node in model.graph.node:
        weighted = node.op_type in ("MatMul", "Gemm") and len(node.input) > 1 and node.input[1] in constants
        if weighted or node.op_type == "Attention":
            found[node.name] = node.input[0]
    return found


def activation_stats(source: Path, names: Sequence[str], samples: Sequence[Feed]) -> dict[str, ActivationStats]:
    """Tensor name -> its ActivationStats over `samples`, run through the graph `source` by ONNX Runtime's CPU
    provider with those tensors as extra outputs."""
    import onnxruntime as ort

    if not samples:
        raise ValueError("static int8 needs calibration inputs, and none were given")
    model = onnx.load(str(source))
    outputs = {output.name for output in model.graph.output}
    model.graph.output.extend(
        onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in names if name not in outputs
    )
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    inputs = {node.name for node in session.get_inputs()}
    stats = {name: ActivationStats() for name in names}
    rng = np.random.default_rng(0)
    for sample in samples:
        values = session.run(list(names), {k: np.asarray(v, np.int64) for k, v in sample.items() if k in inputs})
        for name, value in zip(names, values, strict=True):
            stats[name].add(value, rng)
    return stats


def fixed_scale(low: float, high: float) -> tuple[np.ndarray, np.ndarray]:
    """The uint8 scale and zero point `DynamicQuantizeLinear` would take for a tensor ranging over [low, high]: the
    range widened to hold 0, zero point rounded and saturated (the ONNX operator's definition)."""
    low, high = min(low, 0.0), max(high, 0.0)
    scale = (high - low) / UINT8_LEVELS or 1.0
    zero_point = np.clip(np.round(-low / scale), 0, UINT8_LEVELS)
    return np.array(scale, np.float32), np.array(zero_point, np.uint8)


def fix_activation_scales(model: onnx.ModelProto, ranges: Mapping[str, tuple[float, float]]) -> None:
    """Replace each `DynamicQuantizeLinear` of `model` by a `QuantizeLinear` with the fixed scale and zero point of
    its input's range, stored as initializers under the names of the dynamic node's scale and zero-point outputs, so
    that every consumer (QAttention, MatMulInteger and its scale products) reads them unchanged."""
    from onnx import helper, numpy_helper

    nodes = []
    for node in model.graph.node:
        if node.op_type != "DynamicQuantizeLinear":
            nodes.append(node)
            continue
        if node.input[0] not in ranges:
            raise ValueError(f"no calibrated range for {node.input[0]!r}, which {node.name!r} quantizes")
        scale, zero_point = fixed_scale(*ranges[node.input[0]])
        model.graph.initializer.extend(
            [numpy_helper.from_array(scale, node.output[1]), numpy_helper.from_array(zero_point, node.output[2])]
        )
        nodes.append(
            helper.make_node(
                "QuantizeLinear", [node.input[0], node.output[1], node.output[2]], [node.output[0]], name=node.name
            )
        )
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def fuse_integer_matmuls(model: onnx.ModelProto) -> int:
    """Rewrite each `MatMulInteger -> Cast -> Mul(scale_a · scale_b)` of `model` as one `MatMulIntegerToFloat`
    (ONNX Runtime's contrib op: the int8 product scaled to float in the kernel, one pass over the output); returns
    how many. ONNX Runtime fuses that pattern itself only while the scale product is computed at run time: with a
    fixed activation scale its constant folding multiplies the two scales first and the pattern no longer matches."""
    from onnx import helper

    graph = model.graph
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    producers = {name: node for node in graph.node for name in node.output}
    fused: dict[int, onnx.NodeProto] = {}
    dropped: set[int] = set()
    for node in graph.node:
        chain = _scaled_integer_matmul(node, consumers, producers)
        if chain is None:
            continue
        cast, mul, scales, (a_scale, b_scale) = chain
        a, b, a_zero, b_zero = node.input
        inputs = [a, b, a_scale, b_scale, a_zero, b_zero]
        fused[id(node)] = helper.make_node(
            "MatMulIntegerToFloat", inputs, [mul.output[0]], name=node.name, domain="com.microsoft"
        )
        dropped |= {id(cast), id(mul)} | ({id(scales)} if len(consumers[scales.output[0]]) == 1 else set())
    kept = [fused.get(id(node), node) for node in graph.node if id(node) not in dropped]
    del graph.node[:]
    graph.node.extend(kept)
    return len(fused)


ScaledMatMul = tuple[onnx.NodeProto, onnx.NodeProto, onnx.NodeProto, tuple[str, str]]
"""The Cast and Mul after a MatMulInteger, the Mul of the two scales, and (activation scale, weight scale)."""


def _scaled_integer_matmul(
    node: onnx.NodeProto, consumers: Mapping[str, list[onnx.NodeProto]], producers: Mapping[str, onnx.NodeProto]
) -> ScaledMatMul | None:
    """The scaled pattern after `node`, when `node` is a MatMulInteger whose activation comes from a QuantizeLinear
    and whose float result is its int32 product cast to float times the product of the two inputs' scales."""
    quantize = producers.get(node.input[0]) if node.op_type == "MatMulInteger" and len(node.input) == 4 else None
    if quantize is None or quantize.op_type != "QuantizeLinear":
        return None
    cast = _only_consumer(node.output[0], "Cast", consumers)
    mul = _only_consumer(cast.output[0], "Mul", consumers) if cast is not None else None
    if cast is None or mul is None or _cast_to(cast) != onnx.TensorProto.FLOAT:
        return None
    scales = producers.get(mul.input[1] if mul.input[0] == cast.output[0] else mul.input[0])
    a_scale = quantize.input[1]
    if scales is None or scales.op_type != "Mul" or a_scale not in scales.input or len(scales.input) != 2:
        return None
    b_scale = scales.input[1] if scales.input[0] == a_scale else scales.input[0]
    return cast, mul, scales, (a_scale, b_scale)


def _only_consumer(name: str, op_type: str, consumers: Mapping[str, list[onnx.NodeProto]]) -> onnx.NodeProto | None:
    after = consumers.get(name, [])
    return after[0] if len(after) == 1 and after[0].op_type == op_type else None


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


def _cast_to(cast: onnx.NodeProto) -> int | None:
    return next((attribute.i for attribute in cast.attribute if attribute.name == "to"), None)
