"""Behaviour of our BERT and its heads on a tiny config: shapes, masking, losses, weight tying, errors."""

from __future__ import annotations

import pytest
import torch

from bert_model.config import BertConfig
from bert_model.heads import (
    BertForMaskedLM,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bert_model.modeling import BertModel

TINY = BertConfig(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
)


def batch(seed: int = 0, batch_size: int = 3, seq_len: int = 11) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, TINY.vocab_size, (batch_size, seq_len), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 7:] = 0  # a padded row
    input_ids[1, 7:] = 0
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, 5:] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def test_shapes() -> None:
    model = BertModel(TINY).eval()
    out = model(**batch())
    assert out.last_hidden_state.shape == (3, 11, 32)
    assert out.pooler_output is not None and out.pooler_output.shape == (3, 32)
    assert BertModel(TINY, add_pooling_layer=False)(**batch()).pooler_output is None


def test_padding_does_not_change_real_tokens() -> None:
    model = BertModel(TINY).eval()
    inputs = batch()
    short = {k: v[1:2, :7] for k, v in inputs.items()}
    with torch.no_grad():
        padded = model(**inputs).last_hidden_state[1, :7]
        alone = model(**short).last_hidden_state[0]
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=1e-5)


def test_attention_is_bidirectional() -> None:
    model = BertModel(TINY).eval()
    inputs = batch()
    changed = {k: v.clone() for k, v in inputs.items()}
    changed["input_ids"][0, -1] = (changed["input_ids"][0, -1] % 98) + 1
    with torch.no_grad():
        before = model(**inputs).last_hidden_state[0, 0]
        after = model(**changed).last_hidden_state[0, 0]
    assert not torch.allclose(before, after), "the first token must see the last one"


def test_segment_and_position_embeddings_matter() -> None:
    model = BertModel(TINY).eval()
    inputs = batch()
    swapped = dict(inputs, token_type_ids=1 - inputs["token_type_ids"])
    with torch.no_grad():
        assert not torch.allclose(model(**inputs).last_hidden_state, model(**swapped).last_hidden_state)
        ids = torch.full((1, 4), 5)
        hidden = model(ids).last_hidden_state[0]
    assert not torch.allclose(hidden[0], hidden[1]), "same token at two positions must differ"


def test_sdpa_and_eager_agree() -> None:
    model = BertModel(TINY).eval()
    inputs = batch()
    with torch.no_grad():
        sdpa = model(**inputs).last_hidden_state
        model.set_attn_implementation("eager")
        eager = model(**inputs).last_hidden_state
    assert model.config.attn_implementation == "eager"
    torch.testing.assert_close(sdpa, eager, atol=1e-5, rtol=1e-5)


def test_mlm_decoder_is_tied_to_word_embeddings() -> None:
    model = BertForPreTraining(TINY)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert model.cls.predictions.decoder.bias is model.cls.predictions.bias


def test_pretraining_loss_only_with_labels_and_only_on_labelled_positions() -> None:
    model = BertForPreTraining(TINY).eval()
    inputs = batch()
    out = model(**inputs)
    assert out.loss is None and out.prediction_logits.shape == (3, 11, 99) and out.masked_lm_logits is None
    labels = torch.full((3, 11), -100)
    labels[0, 2], labels[2, 4] = 7, 9
    nsp = torch.tensor([0, 1, 0])
    with torch.no_grad():
        out = model(**inputs, labels=labels, next_sentence_label=nsp)
        full = model(**inputs).prediction_logits
    assert out.prediction_logits is None and out.masked_lm_logits.shape == (2, 99)
    torch.testing.assert_close(out.masked_lm_logits, full[labels != -100])
    expected_mlm = torch.nn.functional.cross_entropy(full[labels != -100], labels[labels != -100])
    expected_nsp = torch.nn.functional.cross_entropy(out.seq_relationship_logits, nsp)
    torch.testing.assert_close(out.mlm_loss, expected_mlm)
    torch.testing.assert_close(out.nsp_loss, expected_nsp)
    torch.testing.assert_close(out.loss, expected_mlm + expected_nsp)
    # Changing the label of an ignored position changes nothing.
    labels_ignored_changed = labels.clone()
    labels_ignored_changed[1, 1] = -100
    with torch.no_grad():
        again = model(**inputs, labels=labels_ignored_changed, next_sentence_label=nsp)
    torch.testing.assert_close(again.loss, out.loss)


def test_classification_losses() -> None:
    config = TINY.with_labels(["a", "b", "c"])
    model = BertForSequenceClassification(config).eval()
    out = model(**batch())
    assert out.logits.shape == (3, 3) and out.loss is None
    labels = torch.tensor([0, 2, 1])
    out = model(**batch(), labels=labels)
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits, labels))
    regression = BertForSequenceClassification(TINY.with_labels(["score"])).eval()
    scores = torch.tensor([0.5, 1.0, -1.0])
    assert regression.problem_type_of(scores) == "regression"
    out = regression(**batch(), labels=scores)
    assert out.loss is not None and out.logits.shape == (3, 1)
    torch.testing.assert_close(out.loss, torch.nn.functional.mse_loss(out.logits.squeeze(-1), scores))


def test_token_classification_ignores_minus_100() -> None:
    model = BertForTokenClassification(TINY.with_labels(["O", "B-PER", "I-PER"])).eval()
    labels = torch.full((3, 11), -100)
    labels[:, 1:4] = 1
    out = model(**batch(), labels=labels)
    assert out.logits.shape == (3, 11, 3)
    selected = labels != -100
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits[selected], labels[selected]))


def test_question_answering_loss_clamps_out_of_window_positions() -> None:
    model = BertForQuestionAnswering(TINY).eval()
    out = model(**batch(), start_positions=torch.tensor([1, 2, 500]), end_positions=torch.tensor([3, 4, 500]))
    assert out.start_logits.shape == (3, 11) and out.end_logits.shape == (3, 11)
    start = torch.nn.functional.cross_entropy(out.start_logits[:2], torch.tensor([1, 2]))
    end = torch.nn.functional.cross_entropy(out.end_logits[:2], torch.tensor([3, 4]))
    torch.testing.assert_close(out.loss, (start + end) / 2)


def test_heads_without_labels_refuse_to_build() -> None:
    with pytest.raises(ValueError, match="needs labels"):
        BertForSequenceClassification(TINY)
    with pytest.raises(ValueError, match="needs labels"):
        BertForTokenClassification(TINY)


def test_bad_inputs_are_refused_clearly() -> None:
    model = BertModel(TINY).eval()
    with pytest.raises(ValueError, match="at most 64"):
        model(torch.ones((1, 65), dtype=torch.long))
    with pytest.raises(ValueError, match=r"shape \(batch, sequence\)"):
        model(torch.ones((5,), dtype=torch.long))
    with pytest.raises(ValueError, match="input_ids must lie in"):
        model(torch.full((1, 4), 99))
    with pytest.raises(ValueError, match="attention_mask has shape"):
        model(torch.ones((1, 4), dtype=torch.long), attention_mask=torch.ones((1, 5), dtype=torch.long))


def test_training_step_reduces_loss() -> None:
    model = BertForSequenceClassification(TINY.with_labels(["a", "b"]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs, labels = batch(), torch.tensor([0, 1, 1])
    losses = []
    for _ in range(40):
        loss = model(**inputs, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.5


ROBERTA = TINY.replace(model_type="roberta", pad_token_id=1, type_vocab_size=1)


def test_roberta_positions_start_past_padding_and_skip_it() -> None:
    model = BertModel(ROBERTA).eval()
    ids = torch.tensor([[0, 7, 8, 2, 1, 1], [1, 1, 0, 7, 8, 2]])  # right- and left-padded, pad id 1
    assert model.embeddings.position_ids(ids).tolist() == [[2, 3, 4, 5, 1, 1], [1, 1, 2, 3, 4, 5]]
    mask = (ids != 1).long()
    with torch.no_grad():
        hidden = model(ids, attention_mask=mask).last_hidden_state
    # The same tokens at the same counted positions give the same states wherever the padding is.
    torch.testing.assert_close(hidden[0, :4], hidden[1, 2:], atol=1e-5, rtol=1e-5)
    assert ROBERTA.max_sequence_length == 62
    with pytest.raises(ValueError, match="63 tokens but the model accepts at most 62"):
        model(torch.full((1, 63), 5))


def test_distilbert_ignores_token_types_and_has_no_pooler() -> None:
    distilbert = TINY.replace(model_type="distilbert", type_vocab_size=0)
    model = BertModel(distilbert).eval()
    assert model.embeddings.token_type_embeddings is None and model.pooler is None
    inputs = batch()
    with torch.no_grad():
        with_types = model(**inputs)
        without = model(inputs["input_ids"], inputs["attention_mask"])
    assert with_types.pooler_output is None
    assert torch.equal(with_types.last_hidden_state, without.last_hidden_state)


def test_distilbert_sinusoidal_positions_match_transformers() -> None:
    from transformers.models.distilbert.modeling_distilbert import create_sinusoidal_embeddings

    config = TINY.replace(model_type="distilbert", type_vocab_size=0, sinusoidal_pos_embds=True)
    table = BertModel(config).embeddings.position_embeddings.weight
    expected = create_sinusoidal_embeddings(64, 32, torch.empty(64, 32))
    torch.testing.assert_close(table.detach(), expected)


def test_narrow_embeddings_are_projected_and_tied_to_a_narrow_decoder() -> None:
    electra = TINY.replace(model_type="electra", embedding_size=16)
    model = BertForMaskedLM(electra).eval()
    assert model.bert.embeddings.word_embeddings.weight.shape == (99, 16)
    assert model.bert.embeddings_project is not None and model.bert.embeddings_project.in_features == 16
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert model(**batch()).logits.shape == (3, 11, 99)


def test_albert_applies_one_shared_layer() -> None:
    albert = TINY.replace(model_type="albert", embedding_size=16, num_hidden_layers=5)
    model = BertModel(albert)
    assert len(model.encoder.layer) == 1
    assert sum(p.numel() for p in model.parameters()) < sum(p.numel() for p in BertModel(TINY).parameters())


def test_next_sentence_pretraining_is_bert_only() -> None:
    with pytest.raises(ValueError, match="next-sentence pretraining is BERT's"):
        BertForPreTraining(ROBERTA)
