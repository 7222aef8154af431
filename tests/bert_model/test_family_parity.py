"""Parity of every family of the encoder with Hugging Face `transformers` (the oracle), both ways.

For RoBERTa, XLM-RoBERTa, DistilBERT, ELECTRA, ALBERT (and BERT, for the table) and each head: a randomly
initialised tiny `transformers` model is saved, loaded by our `from_pretrained` and run on a padded batch
(token types where the family has them); then a random model of ours is saved and loaded by `transformers`.
max |difference| <= 1e-5 on every output, fp32, eval mode, eager attention on their side.
Run with `-s` to see the table family x head -> max |difference|.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from bert_model.config import FAMILIES, BertConfig
from bert_model.heads import (
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bert_model.modeling import BertModel

transformers.utils.logging.disable_progress_bar()

TOLERANCE = 1e-5
SIZES = {"vocab_size": 99, "max_position_embeddings": 64}
BERT_SIZES = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 37}
# Each family's tiny transformers config: its own key names, embedding_size 16 where the family has one, RoBERTa's
# padding index and single token type.
HF_CONFIGS: dict[str, dict[str, Any]] = {
    "bert": BERT_SIZES,
    "roberta": {**BERT_SIZES, "pad_token_id": 1, "type_vocab_size": 1, "layer_norm_eps": 1e-5},
    "xlm-roberta": {**BERT_SIZES, "pad_token_id": 1, "type_vocab_size": 1, "layer_norm_eps": 1e-5},
    "distilbert": {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 37},
    "electra": {**BERT_SIZES, "embedding_size": 16},
    "albert": {**BERT_SIZES, "embedding_size": 16, "hidden_act": "gelu_new"},
}
# (head, ours, number of labels, output fields)
HEADS: list[tuple[str, type, int, tuple[str, ...]]] = [
    ("Model", BertModel, 0, ("last_hidden_state", "pooler_output")),
    ("ForSequenceClassification", BertForSequenceClassification, 3, ("logits",)),
    ("ForSequenceClassification", BertForSequenceClassification, 1, ("logits",)),
    ("ForQuestionAnswering", BertForQuestionAnswering, 2, ("start_logits", "end_logits")),
    ("ForTokenClassification", BertForTokenClassification, 5, ("logits",)),
    ("ForMaskedLM", BertForMaskedLM, 0, ("logits",)),
]
CASES = [(family, *head) for family in HF_CONFIGS for head in HEADS]
IDS = [
    f"{family}-{head}{labels if head == 'ForSequenceClassification' else ''}" for family, head, _, labels, _ in CASES
]
RESULTS: dict[tuple[str, str], float] = {}
"""(family, head column) -> the larger max |difference| of the two directions, for the printed table."""


def hf_config(family: str, labels: int) -> transformers.PretrainedConfig:
    values: dict[str, Any] = {**SIZES, **HF_CONFIGS[family]}
    if labels:
        values["num_labels"] = labels
    return transformers.AutoConfig.for_model(family, attn_implementation="eager", **values)


def hf_class(family: str, head: str) -> Any:
    return getattr(transformers, FAMILIES[family].class_prefix + head)


def padded_batch(config: BertConfig) -> dict[str, torch.Tensor]:
    """Four rows of 13 ids, two padded (mask 0, pad id), two segments where the family has token types."""
    generator = torch.Generator().manual_seed(3)
    input_ids = torch.randint(3, config.vocab_size, (4, 13), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 9:] = 0
    attention_mask[2, 5:] = 0
    input_ids[attention_mask == 0] = config.pad_token_id
    token_type_ids = torch.zeros_like(input_ids)
    if config.type_vocab_size > 1:
        token_type_ids[:, 7:] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


def their_inputs(config: BertConfig, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """DistilBERT's forward takes no token types."""
    return batch if config.family.has_token_types else {k: v for k, v in batch.items() if k != "token_type_ids"}


def max_diff(ours: object, theirs: object, fields: tuple[str, ...]) -> float:
    """Largest |ours - theirs| over the fields both outputs carry (a family without a pooler has none)."""
    differences = []
    for name in fields:
        mine, reference = getattr(ours, name), getattr(theirs, name, None)
        if mine is None and reference is None:
            continue
        differences.append(float((mine - reference).abs().max()))
    return max(differences)


def compare(ours: Any, theirs: Any, fields: tuple[str, ...]) -> float:
    """The larger difference of our SDPA and our eager attention (the graph export traces) from theirs."""
    batch = padded_batch(ours.config)
    encoder = ours if isinstance(ours, BertModel) else ours.bert
    differences = []
    with torch.no_grad():
        expected = theirs(**their_inputs(ours.config, batch))
        for implementation in ("sdpa", "eager"):
            encoder.set_attn_implementation(implementation)
            differences.append(max_diff(ours(**batch), expected, fields))
    return max(differences)


def record(family: str, head: str, labels: int, difference: float) -> None:
    column = f"{head}({labels})" if head == "ForSequenceClassification" else head
    RESULTS[family, column] = max(RESULTS.get((family, column), 0.0), difference)


@pytest.fixture(scope="module", autouse=True)
def _print_table() -> Iterator[None]:
    yield
    if not RESULTS:
        return
    columns = list(dict.fromkeys(column for _, column in RESULTS))
    lines = ["| family | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for family in dict.fromkeys(family for family, _ in RESULTS):
        cells = [f"{RESULTS[family, c]:.1e}" if (family, c) in RESULTS else "" for c in columns]
        lines.append(f"| {family} | " + " | ".join(cells) + " |")
    print("\nmax |ours - transformers| (random tiny models, both directions)\n" + "\n".join(lines))


@pytest.mark.parametrize(("family", "head", "ours_cls", "labels", "fields"), CASES, ids=IDS)
def test_transformers_checkpoint_loads_into_ours(family, head, ours_cls, labels, fields, tmp_path: Path) -> None:
    torch.manual_seed(0)
    theirs = hf_class(family, head)(hf_config(family, labels)).eval()
    with torch.no_grad():
        for parameter in theirs.parameters():  # away from the initialisation: biases and norms matter too
            parameter.add_(0.02 * torch.randn_like(parameter))
    theirs.save_pretrained(tmp_path)
    ours = ours_cls.from_pretrained(tmp_path)
    assert ours.config.model_type == family
    assert ours.load_report.missing_head_keys == [] or head == "Model"
    assert ours.load_report.unexpected_keys == []
    difference = compare(ours, theirs, fields)
    record(family, head, labels, difference)
    assert difference <= TOLERANCE


@pytest.mark.parametrize(("family", "head", "ours_cls", "labels", "fields"), CASES, ids=IDS)
def test_ours_saved_loads_into_transformers(family, head, ours_cls, labels, fields, tmp_path: Path) -> None:
    torch.manual_seed(1)
    config = BertConfig.from_hf_dict(hf_config(family, labels).to_dict())
    ours = ours_cls(config).eval()
    ours.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == family and saved["architectures"] == [FAMILIES[family].class_prefix + head]
    theirs, info = hf_class(family, head).from_pretrained(
        tmp_path, output_loading_info=True, attn_implementation="eager"
    )
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert type(transformers.AutoConfig.from_pretrained(tmp_path)) is type(theirs.config)
    difference = compare(ours, theirs.eval(), fields)
    record(family, head, labels, difference)
    assert difference <= TOLERANCE
