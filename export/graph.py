"""ONNX graph building: legacy TorchScript export of the eager-attention model, then ONNX Runtime's BERT fusion.

References: ONNX operator set 17; ONNX Runtime's transformer optimizer (`onnxruntime.transformers.optimizer`,
`model_type="bert"`), which rewrites the eager attention sub-graph into one `Attention` contrib op per layer,
residual + LayerNorm into `SkipLayerNormalization`, the three embeddings + LayerNorm into
`EmbedLayerNormalization` and MatMul bias + erf GELU into `BiasGelu`.
"""

from __future__ import annotations

import logging
import warnings
from collections import Counter
from pathlib import Path

import onnx
import torch
from torch import nn

from bert_model.config import BertConfig
from bundles.spec import INPUT_NAMES, OUTPUT_NAMES, dynamic_axes
from export.wrapper import ExportWrapper, GraphOptions, encoder_of

OPSET = 17
FUSED_OPS: tuple[str, ...] = (
    "Attention",
    "QAttention",
    "MultiHeadAttention",
    "SkipLayerNormalization",
    "EmbedLayerNormalization",
    "BiasGelu",
    "FastGelu",
    "Gelu",
    "LayerNormalization",
    "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat",
)
"""Operators whose presence shows a fusion (counted in the manifest's `fused_ops`)."""


def sample_inputs(config: BertConfig, batch: int = 2, seq_len: int = 16) -> tuple[torch.Tensor, ...]:
    """Deterministic int64 inputs for tracing: real-looking ids, a padded second row, two segments where the model
    has two token types (segment 0 alone for RoBERTa's single type; DistilBERT's graph takes none)."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1000 % config.vocab_size, config.vocab_size, (batch, seq_len), generator=generator)
    attention_mask = torch.ones(batch, seq_len, dtype=torch.int64)
    attention_mask[1:, seq_len // 2 :] = 0
    token_type_ids = torch.zeros(batch, seq_len, dtype=torch.int64)
    token_type_ids[:, seq_len // 2 :] = min(1, max(config.type_vocab_size - 1, 0))
    return input_ids, attention_mask, token_type_ids


def export_onnx(model: nn.Module, task: str, path: Path, options: GraphOptions | None = None) -> Path:
    """Trace `model` (switched to eager attention) into an opset-17 ONNX file with dynamic batch/sequence axes;
    `options` say what an embed or fill-mask graph computes after the encoder (export.wrapper)."""
    encoder = encoder_of(model)
    previous = encoder.config.attn_implementation
    encoder.set_attn_implementation("eager")
    wrapper = ExportWrapper(model, task, options).eval()
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                wrapper,
                sample_inputs(encoder.config),
                str(path),
                input_names=list(INPUT_NAMES),
                output_names=list(OUTPUT_NAMES[task]),
                dynamic_axes=dynamic_axes(task),
                opset_version=OPSET,
                do_constant_folding=True,
                dynamo=False,
            )
    finally:
        # Legacy export leaves the module in train mode (shared/README.md): restore eval and attention.
        model.eval()
        encoder.set_attn_implementation(previous)
    return path


def fuse_bert(source: Path, target: Path, config: BertConfig) -> dict[str, int]:
    """Run ONNX Runtime's BERT optimizer on `source`, write `target`; returns the fused-op counts."""
    from onnxruntime.transformers.optimizer import optimize_model

    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    optimized = optimize_model(
        str(source),
        model_type="bert",
        num_heads=config.num_attention_heads,
        hidden_size=config.hidden_size,
        opt_level=0,
        use_gpu=False,
    )
    optimized.save_model_to_file(str(target))
    return fused_op_counts(onnx.load(str(target), load_external_data=False))


def op_counts(model: onnx.ModelProto) -> Counter[str]:
    """How many nodes of each operator type the main graph has."""
    return Counter(node.op_type for node in model.graph.node)


def fused_op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Counts of the fused operators (FUSED_OPS) present in the graph, plus the total node count."""
    counts = op_counts(model)
    result = {name: counts[name] for name in FUSED_OPS if counts[name]}
    result["nodes"] = sum(counts.values())
    return result
