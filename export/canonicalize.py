"""Rewrite a traced BERT graph into the sub-graph shapes that ONNX Runtime's BERT fusions recognise.

Our eager attention and embeddings are written the plain way (`scores * D**-0.5`, `arange(S)` positions);
the optimizer's pattern tables (onnxruntime/transformers/fusion_attention.py, fusion_embedlayer.py) know the
older Hugging Face shapes instead. Two exact rewrites bridge that, without touching the model code:

- attention scale: `Mul(MatMul(Q, K^T), c) -> Add(mask) -> Softmax` becomes `Div(MatMul, 1/c)`. With Mul, the
  fuser's "first parent of type Mul" lookup on the mask Add picks the scale instead of the mask's Mul and the
  Attention fusion fails (fusion_attention.py, mask path). c is a power of two's square root (D**-0.5): 1/c is
  exact for every D that is a power of 4, and within one ulp otherwise.
- position ids: `Gather(position_table, Unsqueeze(Range(0, S)))` gets an `Expand(..., Shape(input_ids))` in
  front, the DistilBERT-style position pattern, so EmbedLayerNormalization fuses (same values: positions are
  broadcast over the batch either way).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper


class _Index:
    """Producer / consumer / constant look-ups over one graph."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.producer = {output: node for node in graph.node for output in node.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.initializers = {tensor.name: tensor for tensor in graph.initializer}

    def constant(self, name: str) -> np.ndarray | None:
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant" and node.attribute[0].name == "value":
            return numpy_helper.to_array(node.attribute[0].t)
        if name in self.initializers:
            return numpy_helper.to_array(self.initializers[name])
        return None

    def op_of(self, name: str) -> str | None:
        node = self.producer.get(name)
        return node.op_type if node is not None else None


def attention_scale_to_div(model: onnx.ModelProto) -> int:
    """Turn every attention-score `Mul(MatMul, scalar)` feeding `Add -> Softmax` into a `Div`; returns how many."""
    index = _Index(model.graph)
    rewritten = 0
    for node in model.graph.node:
        if node.op_type != "Mul" or index.op_of(node.input[0]) != "MatMul":
            continue
        scale = index.constant(node.input[1])
        users = index.consumers.get(node.output[0], [])
        if scale is None or scale.size != 1 or len(users) != 1 or users[0].op_type != "Add":
            continue
        if not any(user.op_type == "Softmax" for user in index.consumers.get(users[0].output[0], [])):
            continue
        divisor_name = f"{node.output[0]}__divisor"
        divisor = np.array(1.0 / float(scale.reshape(())), dtype=scale.dtype).reshape(scale.shape)
        model.graph.initializer.append(numpy_helper.from_array(divisor, divisor_name))
        node.op_type = "Div"
        node.input[1] = divisor_name
        rewritten += 1
    return rewritten


def expand_position_ids(model: onnx.ModelProto, input_ids: str = "input_ids") -> bool:
    """Insert `Expand(positions, Shape(input_ids))` before the position-embedding Gather; True if it did."""
    index = _Index(model.graph)
    for position, node in enumerate(model.graph.node):
        if node.op_type != "Gather" or len(node.input) < 2 or index.op_of(node.input[1]) != "Unsqueeze":
            continue
        unsqueeze = index.producer[node.input[1]]
        if index.op_of(unsqueeze.input[0]) != "Range":
            continue
        shape_name = f"{node.name or node.output[0]}__input_shape"
        expanded = f"{node.name or node.output[0]}__positions"
        shape = helper.make_node("Shape", [input_ids], [shape_name], name=shape_name)
        expand = helper.make_node("Expand", [node.input[1], shape_name], [expanded], name=expanded)
        node.input[1] = expanded
        model.graph.node.insert(position, expand)
        model.graph.node.insert(position, shape)
        return True
    return False


def canonicalize(model: onnx.ModelProto) -> dict[str, int]:
    """Apply both rewrites in place; returns what each changed (for the export log)."""
    return {
        "attention_scale_to_div": attention_scale_to_div(model),
        "expand_position_ids": int(expand_position_ids(model)),
    }
