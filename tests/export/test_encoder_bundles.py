"""The encoder's own bundles on tiny models: embed (pooling read from a sentence-transformers layout, done in the
graph) and fill-mask (from our pretraining checkpoint and from Hugging Face's BertForMaskedLM; the head run at the
mask tokens only), exported and run by ONNX Runtime against PyTorch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
import transformers

from bert_model.heads import BertForMaskedLM, BertForPreTraining
from bert_model.modeling import BertModel
from bert_model.tasks.embeddings import l2_normalize, pool
from bert_model.tokenization import BertTokenizer
from bundles.spec import BundleManifest
from export.bundle import build_bundle
from export.sentence_layout import embedding_settings
from export.wrapper import ExportWrapper, GraphOptions, task_of_folder
from tests.export.conftest import tiny_config, write_vocab

FAST = {"variants": "cpu-fp32"}


def st_layout(folder: Path, modules: list[str], **pooling: bool) -> Path:
    """A sentence-transformers layout over `folder`: modules.json and the Pooling module's config."""
    entries = [{"idx": i, "name": str(i), "path": "" if kind == "Transformer" else f"{i}_{kind}",
                "type": f"sentence_transformers.models.{kind}"} for i, kind in enumerate(modules)]  # fmt: skip
    (folder / "modules.json").write_text(json.dumps(entries))
    if "Pooling" in modules:
        pool_dir = folder / f"{modules.index('Pooling')}_Pooling"
        pool_dir.mkdir()
        flags = {"pooling_mode_cls_token": False, "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False}
        (pool_dir / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **flags, **pooling}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64, "do_lower_case": False}))
    return folder


def tiny_encoder(folder: Path) -> Path:
    torch.manual_seed(0)
    BertModel(tiny_config()).save_pretrained(folder)
    write_vocab(folder)
    return folder


@pytest.mark.parametrize(
    ("modules", "flag", "expected"),
    [
        (["Transformer", "Pooling", "Normalize"], "pooling_mode_mean_tokens", ("mean", True)),
        (["Transformer", "Pooling"], "pooling_mode_cls_token", ("cls", False)),
        (["Transformer", "Pooling", "Normalize"], "pooling_mode_max_tokens", ("max", True)),
    ],
)
def test_pooling_and_normalize_are_read_from_the_layout(
    modules: list[str], flag: str, expected: tuple[str, bool], tmp_path: Path
) -> None:
    settings = embedding_settings(st_layout(tmp_path, modules, **{flag: True}))
    assert (settings.pooling, settings.normalize, settings.max_seq_length) == (*expected, 64)
    assert "modules.json" in settings.source and "Pooling/config.json" in settings.source


def test_without_a_layout_mean_pooling_unnormalized(tmp_path: Path) -> None:
    settings = embedding_settings(tmp_path)
    assert (settings.pooling, settings.normalize, settings.max_seq_length) == ("mean", False, None)
    assert "default" in settings.source


@pytest.mark.parametrize(
    ("modules", "pooling", "message"),
    [
        (["Transformer", "Pooling", "Dense", "Normalize"], {"pooling_mode_mean_tokens": True}, "Dense"),
        (["Transformer", "Pooling"], {"pooling_mode_mean_sqrt_len_tokens": True}, "mean_sqrt_len"),
        (["Transformer", "Pooling"], {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True}, "exactly"),
    ],
)
def test_layouts_the_service_cannot_reproduce_are_refused(
    modules: list[str], pooling: dict[str, bool], message: str, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match=message):
        embedding_settings(st_layout(tmp_path, modules, **pooling))


def test_embed_bundle_states_pooling_normalization_and_its_source(tmp_path: Path) -> None:
    folder = st_layout(tiny_encoder(tmp_path / "encoder"), ["Transformer", "Pooling", "Normalize"],
                       pooling_mode_cls_token=True)  # fmt: skip
    result = build_bundle(folder, tmp_path / "bundle", data_dir=tmp_path / "no-data", **FAST)
    manifest = BundleManifest.read(result.path)
    assert manifest.task == "embed" and manifest.task_settings == {"pooling": "cls", "normalize": True}
    assert manifest.max_seq_length == 64  # sentence_bert_config.json's, the length the model is used with
    assert manifest.source["task_settings_source"] == "modules.json + 1_Pooling/config.json"
    assert manifest.source["guard_inputs"]["settings"]["pooling"] == "cls"
    assert manifest.outputs == ["pooled_embedding", "normalized_embedding", "token_embeddings"]
    assert_graph_pools(result.path, folder, "cls")
    plain = build_bundle(tiny_encoder(tmp_path / "plain"), tmp_path / "plain-bundle", data_dir=tmp_path, **FAST)
    assert plain.manifest.task_settings == {"pooling": "mean", "normalize": False}
    assert plain.manifest.max_seq_length == 512
    assert_graph_pools(plain.path, tmp_path / "plain", "mean")


def encoder_batch(tokenizer: BertTokenizer) -> dict[str, np.ndarray]:
    return tokenizer(["the film was good", "a very boring plot and bad acting of the movie", "it"])


def assert_graph_pools(bundle: Path, folder: Path, pooling: str) -> None:
    """The bundle's graph outputs the (B, H) sentence vectors that `bert_model.tasks.embeddings.pool` makes of
    the encoder's token states, their `l2_normalize`d copies (what the service computed from `last_hidden_state`
    before), and the token states themselves, (B, S, H)."""
    tokenizer = BertTokenizer.from_pretrained(bundle / "tokenizer")
    batch = encoder_batch(tokenizer)
    session = ort.InferenceSession(str(bundle / "cpu-fp32.onnx"), providers=["CPUExecutionProvider"])
    pooled, normalized, tokens = session.run(["pooled_embedding", "normalized_embedding", "token_embeddings"], batch)
    with torch.inference_mode():
        states = BertModel.from_pretrained(folder)(**{k: torch.from_numpy(v) for k, v in batch.items()})
    expected = pool(states.last_hidden_state.numpy(), batch["attention_mask"], pooling)
    assert pooled.shape == normalized.shape == (3, 32) and np.abs(pooled - expected).max() <= 1e-5
    assert np.abs(normalized - l2_normalize(expected)).max() <= 1e-6
    real = batch["attention_mask"].astype(bool)  # padded positions carry no answer
    assert tokens.shape == (*batch["input_ids"].shape, 32)
    assert np.abs(tokens[real] - states.last_hidden_state.numpy()[real]).max() <= 1e-5


@pytest.mark.parametrize("pooling", ["mean", "cls", "max"])
def test_export_wrapper_pools_as_the_reference(pooling: str) -> None:
    torch.manual_seed(0)
    model = BertModel(tiny_config()).eval()
    ids = torch.randint(5, 99, (3, 7))
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1, 1] + [0] * 5])
    with torch.inference_mode():
        pooled, normalized, tokens = ExportWrapper(model, "embed", GraphOptions(pooling))(
            ids, mask, torch.zeros_like(ids)
        )
        states = model(ids, mask, torch.zeros_like(ids)).last_hidden_state.numpy()
    np.testing.assert_array_equal(tokens.numpy(), states)  # the token states, as the encoder computes them
    expected = pool(states, mask.numpy(), pooling)
    np.testing.assert_allclose(pooled.numpy(), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(normalized.numpy(), l2_normalize(expected), rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="pooling must be one of mean, cls, max"):
        GraphOptions(pooling="sum")


def save_pretraining(folder: Path) -> Path:
    torch.manual_seed(1)
    BertForPreTraining(tiny_config()).save_pretrained(folder)
    write_vocab(folder)
    return folder


def save_hf_masked_lm(folder: Path) -> Path:
    torch.manual_seed(2)
    config = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=512)  # fmt: skip
    transformers.BertForMaskedLM(config).eval().save_pretrained(folder)
    write_vocab(folder)
    return folder


@pytest.mark.parametrize("save", [save_pretraining, save_hf_masked_lm], ids=["pretraining", "hf-masked-lm"])
def test_fill_mask_bundle_scores_the_mask_tokens_only(save, tmp_path: Path) -> None:
    folder = save(tmp_path / "model")
    assert task_of_folder(folder) == "fill-mask"
    result = build_bundle(folder, tmp_path / "bundle", variants="cpu-fp32,gpu-fp16", data_dir=tmp_path)
    manifest = BundleManifest.read(result.path)
    assert manifest.task == "fill-mask" and manifest.task_settings == {"mask_token": "[MASK]"}
    assert manifest.outputs == ["mask_logits"]
    parity = manifest.variants["cpu-fp32"].parity
    assert parity["max_abs_diff"] <= 1e-4 and manifest.source["guard_inputs"]["count"] == 12
    fused = manifest.variants["cpu-fp32"].fused_ops  # the encoder's fusions, and the head's GELU, survive
    assert (fused["Attention"], fused["SkipLayerNormalization"], fused["EmbedLayerNormalization"]) == (2, 4, 1)
    assert fused["BiasGelu"] == 3
    tokenizer = BertTokenizer.from_pretrained(result.path / "tokenizer")
    texts = ["the film was [MASK] good", "a [MASK] plot and [MASK] boring [MASK] of the movie", "not a mask here"]
    batch = tokenizer(texts)
    session = ort.InferenceSession(str(result.path / "cpu-fp32.onnx"), providers=["CPUExecutionProvider"])
    (logits,) = session.run(["mask_logits"], batch)
    with torch.inference_mode():
        expected = BertForMaskedLM.from_pretrained(folder)(**{k: torch.from_numpy(v) for k, v in batch.items()})
    assert logits.shape == (3, 3, 99)  # (B, the most masks in one row, V), not (B, S, V)
    for row, count in ((0, 1), (1, 3)):  # each row's masks in position order, then filler rows
        positions = np.flatnonzero(batch["input_ids"][row] == tokenizer.mask_id)
        assert len(positions) == count
        assert np.abs(logits[row, :count] - expected.logits.numpy()[row, positions]).max() <= 1e-4
    (alone,) = session.run(["mask_logits"], {k: v[2:] for k, v in batch.items()})
    assert alone.shape == (1, 1, 99)  # a batch without masks still has one (filler) row per input
