"""Layer 0's attention of a pretraining model on real instances: what the fresh-start tests (mimetic, local) read."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from bert_model.heads import BertForPreTraining
from bert_model.pretraining.dataset import InstanceStream, collate
from bert_model.pretraining.shards import DataMeta
from bert_model.tokenization import BertTokenizer


def real_batch(data_folder: Path, meta: DataMeta, tokenizer: BertTokenizer, size: int) -> dict[str, torch.Tensor]:
    """The first `size` training instances of a seeded stream, collated into tensors."""
    instances = InstanceStream(data_folder, meta, "train", seed=0).take(size)
    return {k: torch.from_numpy(v) for k, v in collate(instances, tokenizer.pad_id).items()}


def layer0_attention_logits(model: BertForPreTraining, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(B, heads, S, S) attention logits q . k / sqrt(head_dim) of layer 0, computed from its own weights
    (padding not masked)."""
    config = model.config
    heads, head_dim = config.num_attention_heads, config.hidden_size // config.num_attention_heads
    with torch.no_grad():
        hidden = model.bert.embeddings(batch["input_ids"], batch["token_type_ids"])
        attention = model.bert.encoder.layer[0].attention.self
        rows, width = hidden.shape[:2]
        q = attention.query(hidden).view(rows, width, heads, head_dim).transpose(1, 2)
        k = attention.key(hidden).view(rows, width, heads, head_dim).transpose(1, 2)
        return q @ k.transpose(-1, -2) / math.sqrt(head_dim)
