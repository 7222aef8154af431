"""`--attention-init local`: layer 0's first heads start on fixed neighbours, positions in their own subspace."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bert_model.config import BertConfig
from bert_model.heads import BertForPreTraining
from bert_model.pretraining.local_attention import LOCAL_OFFSETS, local_attention_
from bert_model.pretraining.model_setup import build_model
from bert_model.pretraining.shards import DataMeta
from bert_model.tokenization import BertTokenizer
from tests.bert_model.pretraining.attention_probe import layer0_attention_logits, real_batch


def _layer0_attention(model: BertForPreTraining, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(B, heads, S, S) attention probabilities of layer 0, padding masked."""
    padding = batch["attention_mask"][:, None, None, :] == 0
    return layer0_attention_logits(model, batch).masked_fill(padding, float("-inf")).softmax(-1)


def _weight_on_offsets(probabilities: torch.Tensor, lengths: torch.Tensor) -> list[float]:
    """Mean attention weight that head h puts on position i + LOCAL_OFFSETS[h], over the positions i where that
    token exists (inside the unpadded sequence)."""
    shares = []
    for head, offset in enumerate(LOCAL_OFFSETS[: probabilities.shape[1]]):
        values = [
            probabilities[row, head, i, i + offset].item()
            for row, length in enumerate(lengths.tolist())
            for i in range(max(0, -offset), length - max(0, offset))
        ]
        shares.append(sum(values) / len(values))
    return shares


def test_mini_starts_with_heads_on_the_neighbouring_tokens(data_folder: Path, tmp_path: Path) -> None:
    meta, tokenizer = DataMeta.load(data_folder), BertTokenizer.from_pretrained(data_folder / "tokenizer")
    config = BertConfig.preset("mini", vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id)
    mini = config.save(tmp_path / "mini")
    torch.manual_seed(0)
    model = build_model(meta, tokenizer, config=str(mini), attention_init="local").eval()
    torch.manual_seed(0)
    plain = build_model(meta, tokenizer, config=str(mini)).eval()
    batch = real_batch(data_folder, meta, tokenizer, 4)
    lengths = batch["attention_mask"].sum(1)
    local_shares = _weight_on_offsets(_layer0_attention(model, batch), lengths)
    plain_shares = _weight_on_offsets(_layer0_attention(plain, batch), lengths)
    # previous, next, two back, two ahead: nearly all the weight, where BERT's start spreads it evenly
    assert min(local_shares) > 0.95, local_shares
    assert max(plain_shares) < 3.0 / lengths.min().item(), plain_shares
    head_dim = config.hidden_size // config.num_attention_heads
    embeddings = model.bert.embeddings
    # the first head_dim dimensions hold positions only; words and segments start at zero there
    assert embeddings.word_embeddings.weight[:, :head_dim].abs().max().item() == 0.0
    assert embeddings.token_type_embeddings.weight[:, :head_dim].abs().max().item() == 0.0
    assert embeddings.position_embeddings.weight[:, head_dim:].abs().max().item() == 0.0
    assert embeddings.word_embeddings.weight[:, head_dim:].std().item() == pytest.approx(0.02, rel=0.05)
    # layer 0's values and the later layers keep BERT's start (mini's 4 heads are all local heads)
    layer0, layer1 = model.bert.encoder.layer[0].attention.self, model.bert.encoder.layer[1].attention.self
    assert torch.equal(layer0.value.weight, plain.bert.encoder.layer[0].attention.self.value.weight)
    assert torch.equal(layer1.query.weight, plain.bert.encoder.layer[1].attention.self.query.weight)
    assert torch.equal(layer1.key.weight, plain.bert.encoder.layer[1].attention.self.key.weight)


def test_local_start_on_a_small_model_and_its_refusals(data_folder: Path, tiny_config: Path) -> None:
    meta, tokenizer = DataMeta.load(data_folder), BertTokenizer.from_pretrained(data_folder / "tokenizer")
    model = build_model(meta, tokenizer, config=str(tiny_config), attention_init="local").eval()
    batch = real_batch(data_folder, meta, tokenizer, 4)
    lengths = batch["attention_mask"].sum(1)
    shares = _weight_on_offsets(_layer0_attention(model, batch), lengths)
    # 4 frequencies per head (8 dimensions) instead of 32: a softer peak, still far above an even spread
    assert min(shares) > 5.0 / lengths.min().item(), shares
    with pytest.raises(ValueError, match="lays out the position embeddings itself"):
        build_model(meta, tokenizer, config=str(tiny_config), attention_init="local", position_init="sinusoidal")
    with pytest.raises(ValueError, match="not to --init"):
        build_model(meta, tokenizer, init="minilm", attention_init="local")
    one_head = BertForPreTraining(BertConfig(vocab_size=50, hidden_size=16, num_attention_heads=1))
    with pytest.raises(ValueError, match="at least 2 attention heads"):
        local_attention_(one_head)
