"""Parity with Hugging Face `transformers` (the oracle): every class, tiny random configs and the real MiniLM
weights, real sentences with padding and sentence pairs. max |difference| <= 1e-5, fp32, eval mode."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import transformers

from bert_model.config import BertConfig
from bert_model.heads import (
    BertForMaskedLM,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bert_model.modeling import BertModel
from bert_model.registry import minilm_path
from bert_model.tasks.classification import classification_scores, default_score_function
from bert_model.tokenization import BertTokenizer
from tests.bert_model.real_text import conll_sentences, squad_pairs, sst2_sentences

TOLERANCE = 1e-5
LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]

# (ours, theirs, output fields compared)
CLASSES = [
    (BertModel, transformers.BertModel, ("last_hidden_state", "pooler_output")),
    (BertForPreTraining, transformers.BertForPreTraining, ("prediction_logits", "seq_relationship_logits")),
    (BertForMaskedLM, transformers.BertForMaskedLM, ("logits",)),
    (BertForSequenceClassification, transformers.BertForSequenceClassification, ("logits",)),
    (BertForTokenClassification, transformers.BertForTokenClassification, ("logits",)),
    (BertForQuestionAnswering, transformers.BertForQuestionAnswering, ("start_logits", "end_logits")),
]
IDS = [ours.__name__ for ours, _, _ in CLASSES]
MINILM_RESULTS: dict[str, float] = {}
"""Class -> max |difference| on the real MiniLM weights (both attention implementations), printed with `-s`."""


@pytest.fixture(scope="module", autouse=True)
def _print_minilm_row() -> Iterator[None]:
    yield
    if MINILM_RESULTS:
        cells = ", ".join(f"{name} {difference:.1e}" for name, difference in MINILM_RESULTS.items())
        print(f"\nmax |ours - transformers| on all-MiniLM-L6-v2, real sentences: {cells}")


def max_diff(ours: object, theirs: object, fields: tuple[str, ...]) -> float:
    return max(float((getattr(ours, f) - getattr(theirs, f)).abs().max()) for f in fields)


@pytest.fixture(scope="module")
def real_batch(data_dir: Path) -> dict[str, torch.Tensor]:
    """Real single sentences and (question, context) pairs, padded to one batch."""
    tokenizer = BertTokenizer.from_pretrained("minilm")
    singles = sst2_sentences(data_dir, 10) + conll_sentences(data_dir, 6)
    questions, contexts = zip(*squad_pairs(data_dir, 6), strict=True)
    encodings = tokenizer.encode_batch(singles, max_length=128)
    encodings += tokenizer.encode_batch(list(questions), list(contexts), max_length=192, truncation="only_second")
    arrays = tokenizer.pad(encodings)
    assert arrays["attention_mask"].min() == 0, "the batch must contain padding"
    assert arrays["token_type_ids"].max() == 1, "the batch must contain sentence pairs"
    return {name: torch.from_numpy(array) for name, array in arrays.items()}


def num_labels(ours_cls: type) -> int:
    return 2 if ours_cls is BertForQuestionAnswering else len(LABELS)  # QA: start and end


def tiny_hf_config(labels: int) -> transformers.BertConfig:
    return transformers.BertConfig(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
        num_labels=labels,
        attn_implementation="eager",
    )


def tiny_batch() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    input_ids = torch.randint(1, 99, (4, 13), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[2, 6:] = 0
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, 7:] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


@pytest.mark.parametrize(("ours_cls", "hf_cls", "fields"), CLASSES, ids=IDS)
def test_tiny_random_hf_checkpoint_loads_into_ours(ours_cls, hf_cls, fields, tmp_path) -> None:
    torch.manual_seed(0)
    theirs = hf_cls(tiny_hf_config(num_labels(ours_cls))).eval()
    theirs.save_pretrained(tmp_path)
    ours = ours_cls.from_pretrained(tmp_path)
    assert ours.load_report.missing_head_keys == []
    inputs = tiny_batch()
    with torch.no_grad():
        assert max_diff(ours(**inputs), theirs(**inputs), fields) <= TOLERANCE


@pytest.mark.parametrize(("ours_cls", "hf_cls", "fields"), CLASSES, ids=IDS)
def test_tiny_random_ours_loads_into_hf(ours_cls, hf_cls, fields, tmp_path) -> None:
    torch.manual_seed(1)
    config = BertConfig(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
    ).with_labels(LABELS[: num_labels(ours_cls)])
    ours = ours_cls(config).eval()
    ours.save_pretrained(tmp_path)
    theirs = hf_cls.from_pretrained(tmp_path).eval()
    inputs = tiny_batch()
    with torch.no_grad():
        assert max_diff(ours(**inputs), theirs(**inputs), fields) <= TOLERANCE


@pytest.mark.parametrize(("ours_cls", "hf_cls", "fields"), CLASSES, ids=IDS)
def test_minilm_real_weights_on_real_sentences(ours_cls, hf_cls, fields, real_batch, tmp_path) -> None:
    # The heads are random (MiniLM ships none): Hugging Face initialises them, we import its checkpoint.
    torch.manual_seed(2)
    theirs = hf_cls.from_pretrained(minilm_path(), num_labels=num_labels(ours_cls), attn_implementation="eager")
    theirs.eval().save_pretrained(tmp_path)
    for attn in ("sdpa", "eager"):
        theirs.set_attn_implementation(attn)
        ours = ours_cls.from_pretrained(tmp_path, attn_implementation=attn)
        with torch.no_grad():
            difference = max_diff(ours(**real_batch), theirs(**real_batch), fields)
        MINILM_RESULTS[ours_cls.__name__] = max(MINILM_RESULTS.get(ours_cls.__name__, 0.0), difference)
        assert difference <= TOLERANCE, f"{ours_cls.__name__} ({attn}) differs by {difference}"


def test_minilm_builtin_name_matches_hf(real_batch) -> None:
    ours = BertModel.from_pretrained("minilm")
    theirs = transformers.BertModel.from_pretrained(minilm_path()).eval()
    with torch.no_grad():
        ours_out, theirs_out = ours(**real_batch), theirs(**real_batch)
    assert max_diff(ours_out, theirs_out, ("last_hidden_state", "pooler_output")) <= TOLERANCE


def _labels(kind: str, num: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(4)
    if kind == "class":
        return torch.randint(0, num, (4,), generator=generator)
    if kind == "multi_hot":
        return torch.randint(0, 2, (4, num), generator=generator).float()
    return torch.randn((4, num) if num > 1 else (4,), generator=generator)


@pytest.mark.parametrize(
    ("problem_type", "labels", "kind"),
    [
        ("single_label_classification", 3, "class"),
        ("multi_label_classification", 3, "multi_hot"),
        ("regression", 1, "real"),
        ("regression", 3, "real"),
        (None, 3, "class"),  # inferred: integer labels, several outputs
        (None, 3, "multi_hot"),  # inferred: float labels, several outputs
        (None, 1, "real"),  # inferred: one output
    ],
)
def test_sequence_classification_loss_matches_hf_for_every_problem_type(
    problem_type: str | None, labels: int, kind: str, tmp_path: Path
) -> None:
    torch.manual_seed(5)
    hf_config = tiny_hf_config(labels)
    hf_config.problem_type = problem_type
    theirs = transformers.BertForSequenceClassification(hf_config).eval()
    theirs.save_pretrained(tmp_path)
    ours = BertForSequenceClassification.from_pretrained(tmp_path)
    assert ours.config.problem_type == problem_type
    targets = _labels(kind, labels)
    with torch.no_grad():
        expected = theirs(**tiny_batch(), labels=targets).loss
        loss = ours(**tiny_batch(), labels=targets).loss
    assert loss is not None
    torch.testing.assert_close(loss, expected, atol=TOLERANCE, rtol=TOLERANCE)


@pytest.mark.parametrize(
    ("problem_type", "labels"),
    [
        ("single_label_classification", 3),
        ("multi_label_classification", 3),
        ("multi_label_classification", 1),
        ("regression", 1),
        ("regression", 3),
        (None, 3),
        (None, 1),
    ],
)
def test_default_scores_match_the_hf_pipeline_for_every_problem_type(
    problem_type: str | None, labels: int, data_dir: Path, tmp_path: Path
) -> None:
    """The service's scores for a model: `default_score_function` of its problem_type applied to our logits equals
    what transformers' text-classification pipeline returns for the same checkpoint (function_to_apply unset)."""
    torch.manual_seed(7)
    hf_config = tiny_hf_config(labels)
    hf_config.vocab_size, hf_config.problem_type = 30522, problem_type  # MiniLM's vocabulary: real tokenization
    theirs = transformers.BertForSequenceClassification(hf_config).eval()
    with torch.no_grad():
        theirs.classifier.weight.mul_(30)  # scores away from 0.5 / 1/n, so that the function shows
    theirs.save_pretrained(tmp_path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_path()))
    pipe = transformers.pipeline("text-classification", model=theirs, tokenizer=tokenizer, device="cpu")
    texts = sst2_sentences(data_dir, 4)
    expected = pipe(texts, top_k=None)
    ours = BertForSequenceClassification.from_pretrained(tmp_path).eval()
    batch = BertTokenizer.from_pretrained("minilm")(texts)
    with torch.no_grad():
        logits = ours(**{name: torch.from_numpy(array) for name, array in batch.items()}).logits.numpy()
    function = default_score_function(problem_type, labels)
    assert function == {"regression": "none", "multi_label_classification": "sigmoid"}.get(
        problem_type or "", "sigmoid" if labels == 1 else "softmax"
    )
    scores = classification_scores(logits, function)
    for row, answer in zip(scores, expected, strict=True):
        by_label = {item["label"]: item["score"] for item in answer}
        assert by_label == pytest.approx({hf_config.id2label[i]: float(v) for i, v in enumerate(row)}, abs=1e-5)


def test_masked_lm_loads_a_pretraining_checkpoint(tmp_path: Path) -> None:
    """`bertserve pretrain` writes BertForPreTraining folders; the masked-LM model reads their MLM head as is."""
    torch.manual_seed(6)
    theirs = transformers.BertForPreTraining(tiny_hf_config(2)).eval()
    theirs.save_pretrained(tmp_path)
    ours = BertForMaskedLM.from_pretrained(tmp_path)
    assert ours.load_report.missing_head_keys == []
    assert set(ours.load_report.unexpected_keys) >= {"cls.seq_relationship.weight", "bert.pooler.dense.weight"}
    inputs = tiny_batch()
    with torch.no_grad():
        difference = (ours(**inputs).logits - theirs(**inputs).prediction_logits).abs().max()
    assert float(difference) <= TOLERANCE
