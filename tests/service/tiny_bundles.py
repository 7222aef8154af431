"""Tiny serving bundles for the service tests (tests may use torch; the service may not).

A random 2-layer, hidden-32 BERT per task over the real uncased WordPiece vocabulary of the embedded MiniLM
(so tokenization and character offsets are realistic), exported with `torch.onnx.export` (legacy exporter,
opset 17, dynamic batch and sequence axes from `bundles.spec`), a saved `BertTokenizer`, and a
`BundleManifest`. `max_seq_length` is small (64) so that long-context windowing is exercised by short texts.
"""

from __future__ import annotations

from pathlib import Path

from bundles.spec import INPUT_NAMES, BundleManifest, VariantSpec, dynamic_axes

CLASSIFY_LABELS = ["negative", "positive"]
NER_LABELS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
MAX_SEQ_LENGTH = 64
TASK_NAMES = {"classify": "tiny-classify", "qa": "tiny-qa", "ner": "tiny-ner"}
ENCODER_TASK_NAMES = {"embed": "tiny-embed", "fill-mask": "tiny-fill-mask"}
RERANK_NAME = "tiny-rerank"
"""A cross-encoder: a sequence classifier with one output, served as the rerank task."""
"""The encoder tasks, exported through export.wrapper.ExportWrapper as `bertserve export` does: BertModel's token
states mean-pooled in the graph (normalized by the service), and the masked-LM head's logits at the mask tokens."""
TASK_SETTINGS = {"embed": {"pooling": "mean", "normalize": True}, "fill-mask": {"mask_token": "[MASK]"}}


def build_tiny_bundle(out_dir: Path, task: str, name: str | None = None, seed: int = 0) -> Path:
    """Write a bundle folder for `task` (classify, qa, ner, embed, fill-mask) and return it."""
    import torch

    from bert_model.config import BertConfig
    from bert_model.heads import (
        BertForPreTraining,
        BertForQuestionAnswering,
        BertForSequenceClassification,
        BertForTokenClassification,
    )
    from bert_model.modeling import BertModel
    from bert_model.tokenization import BertTokenizer

    torch.manual_seed(seed)
    tokenizer = BertTokenizer.from_pretrained("minilm")
    labels = {"classify": CLASSIFY_LABELS, "ner": NER_LABELS, "rerank": ["relevance"]}.get(task, [])
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
        attn_implementation="eager",
    )
    if labels:
        config = config.with_labels(labels)
    model_class = {
        "classify": BertForSequenceClassification,
        "rerank": BertForSequenceClassification,
        "qa": BertForQuestionAnswering,
        "ner": BertForTokenClassification,
        "embed": BertModel,
        "fill-mask": BertForPreTraining,
    }[task]
    model = model_class(config).eval()
    output_names = BundleManifest(
        name="x",
        task=task,
        max_seq_length=MAX_SEQ_LENGTH,
        labels=labels or ["x"],
        variants={"v": VariantSpec("v.onnx", "CPUExecutionProvider", "fp32")},
    ).outputs  # every output of the graph (an embed graph's token states too)

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, input_ids, attention_mask, token_type_ids):  # type: ignore[no-untyped-def]
            out = self.inner(input_ids, attention_mask, token_type_ids)
            return tuple(getattr(out, n) for n in output_names)

    bundle = out_dir / (name or {**TASK_NAMES, **ENCODER_TASK_NAMES, "rerank": RERANK_NAME}[task])
    bundle.mkdir(parents=True, exist_ok=True)
    example = tokenizer(["hello world", "a slightly longer example sentence"])
    args = tuple(torch.from_numpy(example[n]) for n in INPUT_NAMES)
    with torch.no_grad():
        torch.onnx.export(
            _encoder_wrapper(model, task, tokenizer.mask_id) if task in ENCODER_TASK_NAMES else Wrapper().eval(),
            args,
            str(bundle / "cpu-fp32.onnx"),
            input_names=list(INPUT_NAMES),
            output_names=list(output_names),
            dynamic_axes=dynamic_axes(task),
            opset_version=17,
            dynamo=False,
        )
    tokenizer.save(bundle / "tokenizer")
    BundleManifest(
        name=bundle.name,
        task=task,
        max_seq_length=MAX_SEQ_LENGTH,
        labels=[] if task == "rerank" else labels,
        variants={"cpu-fp32": VariantSpec("cpu-fp32.onnx", "CPUExecutionProvider", "fp32")},
        source={"built_by": "tests/service/tiny_bundles.py", "seed": seed},
        task_settings=TASK_SETTINGS.get(task, {}),
    ).write(bundle)
    return bundle


def _encoder_wrapper(model, task: str, mask_id: int):  # type: ignore[no-untyped-def]
    from export.wrapper import ExportWrapper, GraphOptions

    return ExportWrapper(model, task, GraphOptions(pooling="mean", mask_token_id=mask_id)).eval()


EXPORTED_EMBED_NAME = "tiny-embed-exported"
EARLIER_EMBED_NAME = "tiny-embed-earlier"


def export_tiny_encoder(out_dir: Path, seed: int = 0) -> tuple[Path, Path]:
    """A tiny random BERT encoder over MiniLM's vocabulary saved as a Hugging Face folder (`transformers` loads it),
    and its bundle as `bertserve export` writes it (cpu-fp32, guarded on built-in sentences): (folder, bundle)."""
    import torch

    from bert_model.config import BertConfig
    from bert_model.modeling import BertModel
    from bert_model.tokenization import BertTokenizer
    from export.bundle import build_bundle

    torch.manual_seed(seed)
    tokenizer = BertTokenizer.from_pretrained("minilm")
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=MAX_SEQ_LENGTH,
    )
    folder = out_dir / "tiny-encoder"
    BertModel(config).save_pretrained(folder)
    tokenizer.save(folder)
    bundle = out_dir / EXPORTED_EMBED_NAME
    build_bundle(folder, bundle, variants="cpu-fp32", data_dir=out_dir / "no-data")
    return folder, bundle


def as_earlier_embed_bundle(bundle: Path, out_dir: Path) -> Path:
    """A copy of embed bundle `bundle` as an earlier build exported it: its graph puts out the sentence vectors only
    (no token states) and its manifest lists those two outputs."""
    import json
    import shutil

    import onnx

    copy = out_dir / EARLIER_EMBED_NAME
    shutil.copytree(bundle, copy)
    graph = onnx.load(str(copy / "cpu-fp32.onnx"))
    kept = [output for output in graph.graph.output if output.name != "token_embeddings"]
    del graph.graph.output[:]
    graph.graph.output.extend(kept)
    onnx.save(graph, str(copy / "cpu-fp32.onnx"))
    data = json.loads((copy / "manifest.json").read_text())
    data.update(name=EARLIER_EMBED_NAME, outputs=["pooled_embedding", "normalized_embedding"])
    (copy / "manifest.json").write_text(json.dumps(data))
    return copy


def build_all(out_dir: Path) -> dict[str, Path]:
    return {task: build_tiny_bundle(out_dir, task) for task in TASK_NAMES}


def build_encoders(out_dir: Path) -> dict[str, Path]:
    """The embed and fill-mask bundles (task -> folder)."""
    return {task: build_tiny_bundle(out_dir, task) for task in ENCODER_TASK_NAMES}


def with_openvino_variant(bundle: Path, out_dir: Path) -> Path:
    """A copy of a tiny bundle in `out_dir` whose ONNX graph is also declared as an OpenVINO variant."""
    import json
    import shutil

    copy = out_dir / bundle.name
    shutil.copytree(bundle, copy)
    data = json.loads((copy / "manifest.json").read_text())
    data["variants"]["openvino-fp32"] = {"file": "cpu-fp32.onnx", "provider": "OpenVINO", "precision": "fp32"}
    (copy / "manifest.json").write_text(json.dumps(data))
    return copy
