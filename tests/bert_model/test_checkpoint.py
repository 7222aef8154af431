"""Checkpoint folders: save -> load identical, HF layouts (prefixes, .bin, shards, TF names), clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from bert_model.config import BertConfig
from bert_model.heads import BertForPreTraining, BertForSequenceClassification, BertForTokenClassification
from bert_model.modeling import BertModel
from bert_model.registry import minilm_path, resolve_model_path
from bert_model.weights import read_state_dict, to_family_names, to_our_names

TINY = BertConfig(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
)
INPUTS = {"input_ids": torch.tensor([[2, 5, 9, 11, 3, 0]]), "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 0]])}


def test_save_load_identical_outputs(tmp_path) -> None:
    torch.manual_seed(0)
    model = BertForPreTraining(TINY).eval()
    model.save_pretrained(tmp_path)
    again = BertForPreTraining.from_pretrained(tmp_path)
    assert again.cls.predictions.decoder.weight is again.bert.embeddings.word_embeddings.weight
    with torch.no_grad():
        a, b = model(**INPUTS), again(**INPUTS)
    assert torch.equal(a.prediction_logits, b.prediction_logits)
    assert torch.equal(a.seq_relationship_logits, b.seq_relationship_logits)
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert "cls.predictions.decoder.weight" not in saved, "tied weights are saved once"
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["BertForPreTraining"]


def test_minilm_save_load_and_transformers_round_trip(tmp_path) -> None:
    model = BertModel.from_pretrained("minilm")
    model.save_pretrained(tmp_path)
    again = BertModel.from_pretrained(tmp_path)
    theirs = transformers.BertModel.from_pretrained(tmp_path).eval()
    ids = torch.tensor([[101, 7592, 2088, 102]])
    with torch.no_grad():
        ours_out = model(ids).last_hidden_state
        assert torch.equal(ours_out, again(ids).last_hidden_state)
        assert float((ours_out - theirs(ids).last_hidden_state).abs().max()) <= 1e-5


def test_base_checkpoint_into_head_model_reports_new_head(tmp_path) -> None:
    model = BertForSequenceClassification.from_pretrained("minilm", id2label={0: "neg", 1: "pos"})
    assert model.load_report is not None
    assert model.load_report.missing_head_keys == ["classifier.weight", "classifier.bias"]
    assert model.config.num_labels == 2


def test_head_checkpoint_into_base_model_drops_prefix_and_reports_unused(tmp_path) -> None:
    torch.manual_seed(0)
    head_model = BertForTokenClassification(TINY.with_labels(["O", "B-X"])).eval()
    head_model.save_pretrained(tmp_path)
    base = BertModel.from_pretrained(tmp_path)
    assert base.load_report is not None
    assert set(base.load_report.unexpected_keys) == {"classifier.weight", "classifier.bias"}
    assert base.load_report.missing_head_keys == ["pooler.dense.weight", "pooler.dense.bias"]
    with torch.no_grad():
        torch.testing.assert_close(base(**INPUTS).last_hidden_state, head_model.bert(**INPUTS).last_hidden_state)


def test_pytorch_bin_and_tf_names_and_shards(tmp_path) -> None:
    torch.manual_seed(0)
    model = BertModel(TINY).eval()
    state = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
        for k, v in model.state_dict().items()
    }
    state["embeddings.position_ids"] = torch.arange(64)[None]
    TINY.save(tmp_path / "bin")
    torch.save(state, tmp_path / "bin" / "pytorch_model.bin")
    loaded = BertModel.from_pretrained(tmp_path / "bin")
    # Sharded safetensors with an index.
    shard_dir = tmp_path / "shards"
    TINY.save(shard_dir)
    tensors = model.checkpoint_tensors()
    names = sorted(tensors)
    halves = {"a.safetensors": names[: len(names) // 2], "b.safetensors": names[len(names) // 2 :]}
    for file, keys in halves.items():
        save_file({k: tensors[k] for k in keys}, str(shard_dir / file))
    index = {"weight_map": {k: file for file, keys in halves.items() for k in keys}}
    (shard_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    sharded = BertModel.from_pretrained(shard_dir)
    with torch.no_grad():
        expected = model(**INPUTS).last_hidden_state
        assert torch.equal(loaded(**INPUTS).last_hidden_state, expected)
        assert torch.equal(sharded(**INPUTS).last_hidden_state, expected)


class NotATensor:
    pass


def test_pickles_beyond_tensors_are_refused(tmp_path) -> None:
    TINY.save(tmp_path)
    torch.save({"weights": NotATensor()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="only weights_only loading is allowed"):
        BertModel.from_pretrained(tmp_path)


def test_folder_without_weights(tmp_path) -> None:
    TINY.save(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no weights in .*expected one of model.safetensors"):
        BertModel.from_pretrained(tmp_path)


def test_folder_without_config(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        BertModel.from_pretrained(tmp_path)


def test_wrong_shape_names_the_parameter(tmp_path) -> None:
    BertModel(TINY).save_pretrained(tmp_path)
    wrong = TINY.replace(intermediate_size=40)
    wrong.save(tmp_path)
    with pytest.raises(ValueError, match=r"shape mismatch for 6 parameter\(s\)") as error:
        BertModel.from_pretrained(tmp_path)
    assert "'encoder.layer.0.intermediate.dense.weight': checkpoint has (37, 32), model expects (40, 32)" in str(
        error.value
    )


def test_missing_encoder_weights_are_an_error(tmp_path) -> None:
    BertModel(TINY).save_pretrained(tmp_path)
    state = read_state_dict(tmp_path)
    del state["encoder.layer.1.output.dense.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"lacks 1 encoder weight\(s\).*encoder.layer.1.output.dense.weight"):
        BertModel.from_pretrained(tmp_path)


def test_config_overrides(tmp_path) -> None:
    model = BertModel.from_pretrained("minilm", attn_implementation="eager", hidden_dropout_prob=0.0)
    assert model.config.attn_implementation == "eager" and model.config.hidden_dropout_prob == 0.0
    with pytest.raises(ValueError, match="unknown BertConfig field"):
        BertModel.from_pretrained("minilm", hidden=3)


def test_registry(tmp_path) -> None:
    assert resolve_model_path("minilm") == minilm_path()
    assert (minilm_path() / "model.safetensors").is_file()
    assert resolve_model_path(tmp_path) == tmp_path.resolve()
    with pytest.raises(FileNotFoundError, match="neither a model folder nor a built-in model name"):
        resolve_model_path("bert-base-uncased")
    file = tmp_path / "weights.bin"
    file.write_bytes(b"")
    with pytest.raises(NotADirectoryError, match="is a file"):
        resolve_model_path(file)


def test_input_longer_than_max_positions(tmp_path) -> None:
    model = BertModel.from_pretrained("minilm")
    with pytest.raises(ValueError, match="513 tokens but the model accepts at most 512"):
        model(torch.ones((1, 513), dtype=torch.long))


def test_copy_of_minilm_folder_with_bin_weights(tmp_path) -> None:
    # A real checkpoint in the legacy pytorch_model.bin layout loads to the same weights.
    for name in ("config.json", "vocab.txt", "tokenizer_config.json"):
        shutil.copy(minilm_path() / name, tmp_path / name)
    torch.save(load_file(str(minilm_path() / "model.safetensors")), tmp_path / "pytorch_model.bin")
    a, b = BertModel.from_pretrained(tmp_path), BertModel.from_pretrained("minilm")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_resolves_paths_given_as_strings(tmp_path: Path) -> None:
    BertModel(TINY).save_pretrained(tmp_path)
    assert isinstance(BertModel.from_pretrained(str(tmp_path)), BertModel)


def test_an_unsupported_model_type_folder_gets_the_one_message(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError) as error:
        BertModel.from_pretrained(tmp_path)
    assert str(error.value) == (
        "config.json has model_type 'gpt2'; supported: albert, bert, distilbert, electra, roberta, xlm-roberta"
    )


TINY_DISTILBERT = BertConfig(
    model_type="distilbert",
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
    type_vocab_size=0,
)


def test_distilbert_is_saved_in_its_own_names_and_loads_from_ours_too(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = BertForSequenceClassification(TINY_DISTILBERT.with_labels(["neg", "pos"])).eval()
    model.save_pretrained(tmp_path)
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert {
        "distilbert.transformer.layer.1.attention.q_lin.weight",
        "distilbert.transformer.layer.0.sa_layer_norm.bias",
        "distilbert.transformer.layer.0.ffn.lin2.weight",
        "pre_classifier.weight",
        "classifier.bias",
    } <= set(saved)
    assert not any(key.startswith("bert.") or "out_proj" in key for key in saved)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [
        "DistilBertForSequenceClassification"
    ]
    # A state dict in our own names (as a composite folder's adapter stores them) loads unchanged.
    again = BertForSequenceClassification(TINY_DISTILBERT.with_labels(["neg", "pos"]))
    report = again.load_checked(model.state_dict())
    assert report.missing_head_keys == [] and report.unexpected_keys == []
    with torch.no_grad():
        assert torch.equal(again.eval()(**INPUTS).logits, model(**INPUTS).logits)


@pytest.mark.parametrize("model_type", ["roberta", "distilbert", "electra", "albert"])
def test_family_names_map_onto_ours_and_back(model_type: str) -> None:
    for head in ("Model", "ForMaskedLM", "ForSequenceClassification"):
        ours = {f"bert.{name}": torch.zeros(1) for name in ("encoder.layer.1.attention.self.query.weight",)}
        ours["cls.predictions.transform.dense.weight"] = torch.zeros(1)
        theirs = to_family_names(ours, model_type, head)
        assert not any(key.startswith("bert.") for key in theirs)
        assert set(to_our_names(theirs, model_type, head)) == set(ours)
        assert set(to_our_names(ours, model_type, head)) == set(ours), "our names pass unchanged"


def test_albert_layer_names_and_its_one_shared_layer() -> None:
    renamed = to_our_names(
        {
            "albert.encoder.albert_layer_groups.0.albert_layers.0.attention.dense.weight": torch.zeros(1),
            "albert.encoder.embedding_hidden_mapping_in.bias": torch.zeros(1),
            "albert.pooler.weight": torch.zeros(1),
            "predictions.decoder.bias": torch.zeros(1),
        },
        "albert",
        "ForMaskedLM",
    )
    assert set(renamed) == {
        "bert.encoder.layer.0.attention.output.dense.weight",
        "bert.embeddings_project.bias",
        "bert.pooler.dense.weight",
        "cls.predictions.decoder.bias",
    }
    model = BertModel(TINY.replace(model_type="albert", embedding_size=16))
    assert len(model.encoder.layer) == 1 and model.encoder.num_hidden_layers == 2


def test_a_family_base_checkpoint_into_a_head_model_reports_the_new_head(tmp_path: Path) -> None:
    torch.manual_seed(0)
    hf_config = transformers.RobertaConfig(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
        type_vocab_size=1,
        pad_token_id=1,
    )
    transformers.RobertaForMaskedLM(hf_config).save_pretrained(tmp_path)
    model = BertForSequenceClassification.from_pretrained(tmp_path, id2label={0: "neg", 1: "pos"})
    assert model.load_report is not None
    assert model.load_report.missing_head_keys == [
        "classifier.dense.weight",
        "classifier.dense.bias",
        "classifier.out_proj.weight",
        "classifier.out_proj.bias",
    ]
    assert {"lm_head.dense.weight", "lm_head.bias"} <= set(model.load_report.unexpected_keys)
