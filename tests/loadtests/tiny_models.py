"""A tiny random sentiment classifier in both forms the load tests need, built from one set of weights.

- a Hugging Face checkpoint folder (config.json, model.safetensors, tokenizer files) for the naive peer's
  `transformers` pipeline, written with our `save_pretrained`;
- a serving bundle (manifest.json, tokenizer/, cpu-fp32.onnx) for `bertserve serve`, exported with the legacy
  exporter at opset 17 with the dynamic axes of `bundles.spec`.
2 layers, hidden 32, over the real uncased MiniLM WordPiece vocabulary, so tokenization is realistic and both
servers do the real work of a request, only with a much smaller network. Tests may use torch; the load
tests themselves do not.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from bundles.spec import INPUT_NAMES, BundleManifest, VariantSpec, dynamic_axes

if TYPE_CHECKING:
    from bert_model.config import BertConfig

LABELS = ["negative", "positive"]
MAX_SEQ_LENGTH = 128


def _tiny_config(vocab_size: int, max_positions: int) -> BertConfig:
    """2 layers, hidden 32, eager attention (exportable): the size of every tiny load-test model."""
    from bert_model.config import BertConfig

    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=max_positions,
        attn_implementation="eager",
    )


def build_tiny_classifier(out_dir: Path, name: str = "tiny-sst2") -> tuple[Path, Path]:
    """(checkpoint folder, bundle folder) of the same random tiny classifier."""
    import torch

    from bert_model.heads import BertForSequenceClassification
    from bert_model.tokenization import BertTokenizer

    torch.manual_seed(0)
    tokenizer = BertTokenizer.from_pretrained("minilm")
    config = _tiny_config(tokenizer.vocab_size, MAX_SEQ_LENGTH).with_labels(LABELS)
    model = BertForSequenceClassification(config).eval()
    checkpoint = model.save_pretrained(out_dir / f"{name}-hf")
    tokenizer.save(checkpoint)

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, input_ids, attention_mask, token_type_ids):  # type: ignore[no-untyped-def]
            return self.inner(input_ids, attention_mask, token_type_ids).logits

    bundle = out_dir / name
    bundle.mkdir(parents=True, exist_ok=True)
    example = tokenizer(["hello world", "a slightly longer example sentence"])
    args = tuple(torch.from_numpy(example[n]) for n in INPUT_NAMES)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation and tracer notes
        torch.onnx.export(
            Logits().eval(),
            args,
            str(bundle / "cpu-fp32.onnx"),
            input_names=list(INPUT_NAMES),
            output_names=["logits"],
            dynamic_axes=dynamic_axes("classify"),
            opset_version=17,
            dynamo=False,
        )
    tokenizer.save(bundle / "tokenizer")
    BundleManifest(
        name=name,
        task="classify",
        max_seq_length=MAX_SEQ_LENGTH,
        labels=LABELS,
        variants={"cpu-fp32": VariantSpec("cpu-fp32.onnx", "CPUExecutionProvider", "fp32")},
        source={"built_by": "tests/loadtests/tiny_models.py", "seed": 0},
    ).write(bundle)
    return checkpoint, bundle


def build_tiny_qa_checkpoint(out_dir: Path, name: str = "tiny-squad-hf") -> Path:
    """A Hugging Face checkpoint folder of a random tiny extractive-QA model (same size as the classifier)."""
    import torch

    from bert_model.heads import BertForQuestionAnswering
    from bert_model.tokenization import BertTokenizer

    torch.manual_seed(0)
    tokenizer = BertTokenizer.from_pretrained("minilm")
    config = _tiny_config(tokenizer.vocab_size, 512)
    checkpoint = BertForQuestionAnswering(config).eval().save_pretrained(out_dir / name)
    tokenizer.save(checkpoint)
    return checkpoint
