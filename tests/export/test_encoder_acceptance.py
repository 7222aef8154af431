"""Acceptance of the encoder's bundles against the libraries people use them through, on real sentences:

- embed: the exported MiniLM bundle, run by ONNX Runtime (its graph pools as the manifest says) and normalized by
  `bert_model.tasks.embeddings`, against `sentence-transformers` loading the same local folder (the oracle);
- fill-mask: a masked-LM checkpoint's bundle (its graph scores the mask tokens only), post-processed by
  `bert_model.tasks.fill_mask`, against transformers' `fill-mask` pipeline on the same checkpoint, with and
  without `targets`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
import transformers

from bert_model.registry import minilm_path
from bert_model.tasks.classification import build_classification_features
from bert_model.tasks.features import collate
from bert_model.tasks.fill_mask import build_fill_mask_features, fill_mask_postprocess, target_ids
from bert_model.tokenization import BertTokenizer
from bundles.runtimes import open_variant, openvino_available
from bundles.spec import TOKENIZER_DIR, BundleManifest
from bundles.variant_choice import choose_variant
from export.bundle import build_bundle

pytestmark = pytest.mark.slow


def real_sentences(data_dir: Path) -> list[str]:
    """All 436 SST-2 dev-half-a sentences and 164 SQuAD dev questions: 600 real texts."""
    lines = (data_dir / "sst2/dev.half-a.tsv").read_text(encoding="utf-8").splitlines()[1:]
    sentences = [line.split("\t")[0] for line in lines if line.strip()]
    squad = json.loads((data_dir / "squad_v1.1/dev-v1.1.half-a.json").read_text(encoding="utf-8"))
    questions = [qa["question"] for a in squad["data"][:3] for p in a["paragraphs"] for qa in p["qas"]]
    return sentences + questions[:164]


def bundle_vectors(bundle: Path, variant: str, texts: list[str]) -> np.ndarray:
    """Sentence vectors as the service answers by default: the bundle's graph pools, and normalizes when its manifest
    says the model does."""
    manifest = BundleManifest.read(bundle)
    tokenizer = BertTokenizer.from_pretrained(bundle / TOKENIZER_DIR)
    features = build_classification_features(tokenizer, texts, max_seq_length=manifest.max_seq_length)
    spec = manifest.variants[variant]
    path = bundle / spec.file
    run = open_variant(path, spec, manifest.output_names).run
    vectors = []
    for start in range(0, len(features), 32):
        feed = collate(features[start : start + 32], tokenizer.pad_id)
        outputs = run(feed)  # (B, H) each: pooled, and normalized, in the graph
        normalize = manifest.task_settings["normalize"]
        vectors.append(outputs["normalized_embedding"] if normalize else outputs["pooled_embedding"])
    return np.concatenate(vectors)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def minilm_embed_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    variants = "cpu-fp32,openvino-int8" if openvino_available() else "cpu-fp32,cpu-int8"
    return build_bundle("minilm", tmp_path_factory.mktemp("embed") / "minilm", variants=variants).path


def test_minilm_embeddings_equal_sentence_transformers(minilm_embed_bundle: Path, data_dir: Path) -> None:
    from sentence_transformers import SentenceTransformer

    texts = real_sentences(data_dir)
    assert len(texts) >= 500
    manifest = BundleManifest.read(minilm_embed_bundle)
    assert manifest.task_settings == {"pooling": "mean", "normalize": True}  # all-MiniLM-L6-v2's own modules
    oracle = SentenceTransformer(str(minilm_path()), device="cpu").encode(texts, batch_size=32)
    fp32 = cosines(bundle_vectors(minilm_embed_bundle, "cpu-fp32", texts), oracle)
    assert fp32.min() >= 0.99999, f"cpu-fp32 vs sentence-transformers: min cosine {fp32.min():.7f}"
    default = choose_variant(manifest, "cpu")
    reduced = cosines(bundle_vectors(minilm_embed_bundle, default, texts), oracle)
    assert reduced.mean() >= 0.995 and reduced.min() >= 0.98, (default, reduced.mean(), reduced.min())
    guard = manifest.variants[default].parity
    assert guard["cosine_mean"] >= 0.995 and guard["retrieval_top1_agreement"] >= 0.95


@pytest.fixture(scope="module")
def masked_lm_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real-size masked-LM checkpoint: MiniLM's encoder with Hugging Face's BertForMaskedLM head (its decoder tied
    to MiniLM's word embeddings, its transform seeded), and MiniLM's tokenizer."""
    folder = tmp_path_factory.mktemp("mlm") / "minilm-mlm"
    torch.manual_seed(0)
    transformers.BertForMaskedLM.from_pretrained(minilm_path()).eval().save_pretrained(folder)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(minilm_path() / name, folder / name)
    return folder


def test_fill_mask_equals_the_transformers_pipeline(masked_lm_folder: Path, data_dir: Path, tmp_path: Path) -> None:
    bundle = build_bundle(masked_lm_folder, tmp_path / "bundle", variants="cpu-fp32").path
    lines = (data_dir / "sst2/dev.half-a.tsv").read_text(encoding="utf-8").splitlines()[1:61]
    texts = []
    for index, line in enumerate(lines):  # one word masked per sentence, at a spread of positions
        words = line.split("\t")[0].split()
        words[index % len(words)] = "[MASK]"
        texts.append(" ".join(words))
    pipeline = transformers.pipeline("fill-mask", model=str(masked_lm_folder), device="cpu", top_k=5)
    tokenizer = BertTokenizer.from_pretrained(bundle / TOKENIZER_DIR)
    features = build_fill_mask_features(tokenizer, texts)
    session = ort.InferenceSession(str(bundle / "cpu-fp32.onnx"), providers=["CPUExecutionProvider"])
    rows = []
    for start in range(0, len(features), 8):  # batches of 8: rows of a batch share its (B, M, V) output
        (logits,) = session.run(["mask_logits"], collate(features[start : start + 8], tokenizer.pad_id))
        rows.extend(logits)
    ours = fill_mask_postprocess(tokenizer, features, rows, top_k=5)
    targets = ["good", "bad", "film", "movie"]
    scored = fill_mask_postprocess(tokenizer, features, rows, top_k=5, targets=target_ids(tokenizer, targets))
    assert len(texts) >= 50
    for index, text in enumerate(texts):
        for got, expected in ((ours[index], pipeline(text)), (scored[index], pipeline(text, targets=targets))):
            assert [f["token"] for f in got[0]] == [e["token"] for e in expected], text
            assert np.abs(np.array([f["score"] for f in got[0]]) - [e["score"] for e in expected]).max() <= 1e-4
