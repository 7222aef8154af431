"""Masked-LM accuracy of a saved model on the held-out split of any pretraining data folder.

The training loop scores a run on its own data's held-out split. Comparing runs that were trained on differently
built data (sentence pairs for NSP, packed full sentences without it) needs one more measure: every model on the
same held-out instances with the same (static) masks. The held-out split is masked once when the data is
written, and the same `seed` holds out the same documents whatever the objective, so two data folders built from
one corpus with one seed hold out the same text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from bert_model.heads import IGNORE_INDEX, BertForMaskedLM
from bert_model.pretraining.dataset import collate, iter_split
from bert_model.pretraining.shards import DataMeta


@torch.no_grad()
def held_out_mlm(
    model: BertForMaskedLM, data: str | Path, limit: int | None = 1000, batch_size: int = 64
) -> dict[str, Any]:
    """`mlm_acc` and `mlm_loss` (per masked token) and `masked_tokens` over the first `limit` held-out instances
    of the data folder `data` (fp32, eval mode; the model's mode is restored)."""
    meta = DataMeta.load(data)
    if meta.vocab_size != model.config.vocab_size:
        raise ValueError(
            f"{data} has {meta.vocab_size} token ids but the model's vocabulary has {model.config.vocab_size}"
        )
    instances = list(iter_split(data, meta, "eval", limit))
    hits, loss_sum, count = 0, 0.0, 0
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(instances), batch_size):
            batch = collate(instances[start : start + batch_size], meta.special_ids["pad"])
            inputs = {name: torch.from_numpy(batch[name]) for name in ("input_ids", "attention_mask", "token_type_ids")}
            labels = torch.from_numpy(batch["labels"])
            chosen = labels != IGNORE_INDEX
            hidden = model.bert(**inputs).last_hidden_state  # (B, S, H)
            logits = model.cls(hidden[chosen]).float()  # (M, V): only the masked positions are decoded
            targets = labels[chosen]
            hits += int((logits.argmax(-1) == targets).sum())
            loss_sum += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
            count += int(targets.numel())
    finally:
        model.train(was_training)
    return {"mlm_acc": hits / max(count, 1), "mlm_loss": loss_sum / max(count, 1), "masked_tokens": count}
