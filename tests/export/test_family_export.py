"""`bertserve export` for every family and task, from a saved `transformers` folder, and the fused graph of each.

For BERT, DistilBERT, ELECTRA, RoBERTa, XLM-RoBERTa and ALBERT and each task (classify, qa, ner, embed from the
base model, fill-mask from the masked LM): a random tiny `transformers` model with a tokenizer of its family
(tests/bert_model/test_tokenization_family.py) is saved, exported to a cpu-fp32 bundle through the command, and
the bundle checked: the fused graph matches PyTorch within 1e-4 on the guard's inputs, ONNX Runtime's optimizer
fused attention (one Attention per layer, two SkipLayerNormalization per layer, one BiasGelu / FastGelu per
layer), the manifest names the family, and DistilBERT's graph takes no token types. RoBERTa's and XLM-R's
positions (a cumulative sum over the non-padding tokens) keep the optimizer from fusing EmbedLayerNormalization:
their embeddings end in a plain LayerNormalization. Run with `-s` for the table of fused nodes per family.
`save_family_model` is shared with the serving test.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch
import transformers
from typer.testing import CliRunner

from bert_model.config import FAMILIES as FAMILY_CONFIGS
from bert_model.config import BertConfig
from bertserve.commands.export import register
from export.graph import sample_inputs
from export.wrapper import task_of_folder
from tests.bert_model.test_family_parity import HF_CONFIGS, hf_class
from tests.bert_model.test_tokenization_family import FAMILIES, save_family_tokenizer

MAX_SEQ_LENGTH = 64
LAYERS = 2
TASK_HEADS = {
    "classify": "ForSequenceClassification",
    "qa": "ForQuestionAnswering",
    "ner": "ForTokenClassification",
    "embed": "Model",
    "fill-mask": "ForMaskedLM",
}
TASK_LABELS = {"classify": ["negative", "neutral", "positive"], "ner": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]}
GUARD_TEXTS = [
    "Ada Lovelace worked with Charles Babbage in London.",
    "Emoji 😀 in 東京 with café, José and Zoë.",
    "A combining e\u0301 mark, and a CRLF line\r\nbreak here.",
    "Paris is the capital of France.",
]
GUARD_QUESTIONS = ["Who worked with Babbage?", "Where is the capital?"]
FUSED: dict[tuple[str, str], dict[str, float]] = {}
CASES = [pytest.param(family, task, id=f"{family}-{task}") for family in FAMILIES for task in TASK_HEADS]


def save_family_model(family: str, task: str, folder: Path, tokenizer_folder: Path, seed: int = 0) -> Path:
    """A random tiny transformers model of `family` for `task` (2 layers, hidden 32, weights moved off their
    initialisation so that outputs differ), serving MAX_SEQ_LENGTH tokens, saved with the tokenizer's files."""
    vocab = len(transformers.AutoTokenizer.from_pretrained(tokenizer_folder))
    config: dict[str, Any] = {**HF_CONFIGS[family], "vocab_size": vocab}
    offset = config.get("pad_token_id", 0) + 1 if FAMILY_CONFIGS[family].positions_after_padding else 0
    config["max_position_embeddings"] = MAX_SEQ_LENGTH + offset
    labels = TASK_LABELS.get(task)
    if labels:
        config.update(id2label=dict(enumerate(labels)), label2id={label: i for i, label in enumerate(labels)})
    torch.manual_seed(seed)
    model = hf_class(family, TASK_HEADS[task])(transformers.AutoConfig.for_model(family, **config)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    model.save_pretrained(folder)
    for file in tokenizer_folder.iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    return folder


def write_guard_texts(task: str, path: Path) -> Path:
    """The guard's calibration file: texts, or question<TAB>context lines for qa."""
    lines = [f"{q}\t{' '.join(GUARD_TEXTS)}" for q in GUARD_QUESTIONS] if task == "qa" else GUARD_TEXTS
    path.write_text("\n".join(line.replace("\r\n", " ") for line in lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("family-tokenizers")
    return {family: save_family_tokenizer(family, root / family) for family in FAMILIES}


@pytest.fixture(scope="module")
def cli() -> tuple[CliRunner, Any]:
    import typer

    app = typer.Typer()

    @app.callback()
    def root() -> None:
        """Test app."""

    register(app)
    return CliRunner(), app


@pytest.fixture(scope="module", autouse=True)
def _print_fused_table() -> Iterator[None]:
    yield
    if not FUSED:
        return
    names = ["Attention", "SkipLayerNormalization", "EmbedLayerNormalization", "LayerNormalization", "gelu", "nodes"]
    lines = ["| family | task | " + " | ".join(names) + " | max abs diff |", "|---" * (len(names) + 3) + "|"]
    for (family, task), counts in FUSED.items():
        cells = [str(counts.get(name, 0)) for name in names]
        lines.append(f"| {family} | {task} | " + " | ".join(cells) + f" | {counts['diff']:.1e} |")
    print("\nfused nodes of the cpu-fp32 graph (2 layers) and its max |diff| from PyTorch\n" + "\n".join(lines))


def test_every_family_s_architectures_name_their_task(tmp_path: Path) -> None:
    for family, config in FAMILY_CONFIGS.items():
        for task, head in TASK_HEADS.items():
            data = {"model_type": family, "architectures": [config.class_prefix + head]}
            (tmp_path / "config.json").write_text(json.dumps(data))
            assert task_of_folder(tmp_path) == task, (family, head)
        (tmp_path / "config.json").write_text(json.dumps({"model_type": family}))
        assert task_of_folder(tmp_path) == "embed"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="model_type 'gpt2'; supported: albert, bert, distilbert"):
        task_of_folder(tmp_path)
    causal = {"model_type": "roberta", "architectures": ["RobertaForCausalLM"]}
    (tmp_path / "config.json").write_text(json.dumps(causal))
    with pytest.raises(ValueError, match="RobertaForSequenceClassification"):
        task_of_folder(tmp_path)


@pytest.mark.parametrize("family", FAMILIES)
def test_trace_inputs_stay_within_the_token_types(family: str) -> None:
    config = BertConfig.from_hf_dict({"model_type": family, **HF_CONFIGS[family], "vocab_size": 99})
    _, _, token_type_ids = sample_inputs(config)
    assert int(token_type_ids.max()) < max(config.type_vocab_size, 1)


def _gelus(counts: dict[str, int]) -> int:
    return counts.get("BiasGelu", 0) + counts.get("FastGelu", 0)


@pytest.mark.parametrize(("family", "task"), CASES)
def test_export_every_family_and_task(
    family: str, task: str, tokenizers: dict[str, Path], cli: tuple[CliRunner, Any], tmp_path: Path
) -> None:
    folder = save_family_model(family, task, tmp_path / "model", tokenizers[family])
    runner, app = cli
    out = tmp_path / "bundle"
    arguments = ["export", str(folder), "--out", str(out), "--variants", "cpu-fp32", "--strict"]
    result = runner.invoke(app, [*arguments, "--calibration", str(write_guard_texts(task, tmp_path / "guard.txt"))])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["task"] == task and manifest["max_seq_length"] == MAX_SEQ_LENGTH
    assert manifest["source"]["model_type"] == family
    variant = manifest["variants"]["cpu-fp32"]
    counts = variant["fused_ops"]
    FUSED[family, task] = {**counts, "gelu": _gelus(counts), "diff": variant["parity"]["max_abs_diff"]}
    assert variant["parity"]["max_abs_diff"] <= 1e-4
    assert counts["Attention"] == LAYERS and counts["SkipLayerNormalization"] == 2 * LAYERS
    assert _gelus(counts) == LAYERS + (task == "fill-mask")  # the masked-LM transform has one more
    positions_by_cumsum = FAMILY_CONFIGS[family].positions_after_padding
    assert counts.get("EmbedLayerNormalization", 0) == (0 if positions_by_cumsum else 1)
    graph = onnx.load(str(out / variant["file"]), load_external_data=False)
    inputs = {node.name for node in graph.graph.input}
    assert ("token_type_ids" in inputs) == FAMILY_CONFIGS[family].has_token_types, inputs
