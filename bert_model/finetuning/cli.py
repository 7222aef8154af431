"""`bertserve finetune {classify,qa,ner}` and `bertserve evaluate`: thin typer wrappers over `run`.

torch is imported only inside the command bodies (through `bert_model.finetuning.run`), so registering these
commands costs nothing to `bertserve serve`.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from bert_model.cli_errors import exit_on_user_error

Model = Annotated[str, typer.Option(help="Model to start from: a checkpoint folder or built-in name.")]
Train = Annotated[str, typer.Option(help="Training data file.")]
Eval = Annotated[str | None, typer.Option("--eval", help="Evaluation data: best-checkpoint selection + final scores.")]
Out = Annotated[str, typer.Option(help="Output folder for the model, metrics.jsonl, eval_results.json, run.json.")]
Epochs = Annotated[float, typer.Option(help="Passes over the training data (fractions allowed).")]
MaxSteps = Annotated[int | None, typer.Option(help="Stop after this many steps instead (schedule ends there).")]
BatchSize = Annotated[int, typer.Option(help="Training features per step.")]
LearningRate = Annotated[float | None, typer.Option("--lr", help="Peak learning rate [default: 5e-5 full, 5e-4 LoRA].")]
Warmup = Annotated[float, typer.Option(help="Fraction of steps with linear warm-up.")]
WeightDecay = Annotated[float, typer.Option(help="AdamW weight decay.")]
Seed = Annotated[int, typer.Option(help="Seed of head/adapter init, dropout and batch order.")]
Bf16 = Annotated[bool, typer.Option("--bf16/--no-bf16", help="bf16 autocast (faster on CPUs with AMX/AVX512-BF16).")]
EvalEvery = Annotated[int | None, typer.Option(help="Evaluate every N steps [default: each epoch].")]
EvalLimit = Annotated[int | None, typer.Option(help="Evaluate on N evenly spaced examples during training.")]
MaxTrain = Annotated[int | None, typer.Option(help="Use only the first N training examples.")]
Threads = Annotated[int | None, typer.Option(help="torch threads [default: torch's choice].")]
Lora = Annotated[bool, typer.Option("--lora/--full", help="Train LoRA adapters (small composite) or every weight.")]
LoraRank = Annotated[int, typer.Option(help="LoRA rank r.")]
LoraAlpha = Annotated[float, typer.Option(help="LoRA alpha (update scaled by alpha / r).")]
LoraTargets = Annotated[str, typer.Option(help="Comma-separated encoder linear layers to adapt.")]
LoraNorms = Annotated[
    bool, typer.Option("--lora-layernorm/--no-lora-layernorm", help="With LoRA, also train LayerNorms.")
]
LoraBias = Annotated[bool, typer.Option("--lora-bias/--no-lora-bias", help="With LoRA, also train encoder biases.")]
MaxSeq = Annotated[int, typer.Option(help="Tokens per input window, specials included.")]


def register(app: typer.Typer) -> None:
    finetune_app = typer.Typer(help="Fine-tune a model for a task family.", no_args_is_help=True)
    finetune_app.command("classify")(finetune_classify)
    finetune_app.command("qa")(finetune_qa)
    finetune_app.command("ner")(finetune_ner)
    app.add_typer(finetune_app, name="finetune")
    app.command("evaluate")(evaluate)


def _training(**values: Any) -> Any:
    from bert_model.adapters import lora_config_from_args
    from bert_model.finetuning.options import TrainingOptions

    lora = None
    if values.pop("lora"):
        lora = lora_config_from_args(
            values.pop("lora_rank"),
            values.pop("lora_alpha"),
            [values.pop("lora_targets")],
            train_layernorm=values.pop("lora_layernorm"),
            train_bias=values.pop("lora_bias"),
        )
    for key in ("lora_rank", "lora_alpha", "lora_targets", "lora_layernorm", "lora_bias"):
        values.pop(key, None)
    return TrainingOptions(lora=lora, **values)


def _run(task: str, model: str, train: str, eval_path: str | None, out: str, training: Any, options: Any) -> None:
    from bert_model.finetuning.options import FinetuneRun
    from bert_model.finetuning.run import finetune

    summary = finetune(FinetuneRun(task, model, train, out, eval_path, training, options))
    typer.echo(
        json.dumps(
            {"out": out, "steps": summary["steps"], "wall_seconds": summary["wall_seconds"], "eval": summary["eval"]}
        )
    )


def finetune_classify(
    train: Train,
    out: Out,
    model: Model = "minilm",
    eval_path: Eval = None,
    epochs: Epochs = 3.0,
    max_steps: MaxSteps = None,
    batch_size: BatchSize = 32,
    learning_rate: LearningRate = None,
    warmup_ratio: Warmup = 0.1,
    weight_decay: WeightDecay = 0.01,
    seed: Seed = 42,
    bf16: Bf16 = False,
    eval_every: EvalEvery = None,
    eval_limit: EvalLimit = None,
    max_train_examples: MaxTrain = None,
    threads: Threads = None,
    lora: Lora = False,
    lora_rank: LoraRank = 16,
    lora_alpha: LoraAlpha = 32.0,
    lora_targets: LoraTargets = "query,key,value,dense",
    lora_layernorm: LoraNorms = True,
    lora_bias: LoraBias = True,
    max_seq_length: MaxSeq = 128,
    text_column: Annotated[str | None, typer.Option(help="Text column [default: detected].")] = None,
    pair_column: Annotated[str | None, typer.Option(help="Second-text column of pairs [default: detected].")] = None,
    label_column: Annotated[str | None, typer.Option(help="Label column [default: detected].")] = None,
    label_map: Annotated[str | None, typer.Option(help="Rename labels: '0=negative,1=positive'.")] = None,
    labels: Annotated[str | None, typer.Option(help="Label order of the head: 'negative,positive'.")] = None,
) -> None:
    """Fine-tune a text (pair) classifier on TSV / CSV / JSONL data."""
    with exit_on_user_error():
        from bert_model.finetuning.options import ClassifyOptions

        training = _training(**_training_values(locals()))
        options = ClassifyOptions(
            max_seq_length, text_column, pair_column, label_column, _pairs(label_map), _names(labels)
        )
        _run("classify", model, train, eval_path, out, training, options)


def finetune_qa(
    train: Train,
    out: Out,
    model: Model = "minilm",
    eval_path: Eval = None,
    epochs: Epochs = 2.0,
    max_steps: MaxSteps = None,
    batch_size: BatchSize = 32,
    learning_rate: LearningRate = None,
    warmup_ratio: Warmup = 0.1,
    weight_decay: WeightDecay = 0.01,
    seed: Seed = 42,
    bf16: Bf16 = False,
    eval_every: EvalEvery = None,
    eval_limit: EvalLimit = None,
    max_train_examples: MaxTrain = None,
    threads: Threads = None,
    lora: Lora = False,
    lora_rank: LoraRank = 16,
    lora_alpha: LoraAlpha = 32.0,
    lora_targets: LoraTargets = "query,key,value,dense",
    lora_layernorm: LoraNorms = True,
    lora_bias: LoraBias = True,
    max_seq_length: MaxSeq = 384,
    doc_stride: Annotated[int, typer.Option(help="Context tokens shared by consecutive windows.")] = 128,
    max_query_length: Annotated[int, typer.Option(help="Question tokens kept.")] = 64,
    max_answer_length: Annotated[int, typer.Option(help="Longest answer in tokens.")] = 30,
) -> None:
    """Fine-tune extractive question answering on SQuAD v1.1 / v2.0 JSON."""
    with exit_on_user_error():
        from bert_model.finetuning.options import QAOptions

        training = _training(**_training_values(locals()))
        options = QAOptions(max_seq_length, doc_stride, max_query_length, max_answer_length)
        _run("qa", model, train, eval_path, out, training, options)


def finetune_ner(
    train: Train,
    out: Out,
    model: Model = "minilm",
    eval_path: Eval = None,
    epochs: Epochs = 3.0,
    max_steps: MaxSteps = None,
    batch_size: BatchSize = 32,
    learning_rate: LearningRate = None,
    warmup_ratio: Warmup = 0.1,
    weight_decay: WeightDecay = 0.01,
    seed: Seed = 42,
    bf16: Bf16 = False,
    eval_every: EvalEvery = None,
    eval_limit: EvalLimit = None,
    max_train_examples: MaxTrain = None,
    threads: Threads = None,
    lora: Lora = False,
    lora_rank: LoraRank = 16,
    lora_alpha: LoraAlpha = 32.0,
    lora_targets: LoraTargets = "query,key,value,dense",
    lora_layernorm: LoraNorms = True,
    lora_bias: LoraBias = True,
    max_seq_length: MaxSeq = 128,
    stride: Annotated[int, typer.Option(help="Tokens shared by windows of long sentences.")] = 32,
    tag_column: Annotated[int, typer.Option(help="Column of the NER tag (negative counts from the end).")] = -1,
    scheme: Annotated[str, typer.Option(help="Tag scheme of the files: auto, iob1, iob2.")] = "auto",
    labels: Annotated[str | None, typer.Option(help="Label order of the head: 'O,B-PER,I-PER,...'.")] = None,
) -> None:
    """Fine-tune NER on CoNLL column files (IOB1 or IOB2)."""
    with exit_on_user_error():
        from bert_model.finetuning.options import NEROptions

        training = _training(**_training_values(locals()))
        options = NEROptions(max_seq_length, stride, tag_column, scheme, _names(labels))
        _run("ner", model, train, eval_path, out, training, options)


def evaluate(
    model: Annotated[str, typer.Argument(help="Fine-tuned model folder or built-in name (minilm-sst2, ...).")],
    data: Annotated[str, typer.Option(help="Labelled data: TSV/CSV/JSONL, SQuAD JSON or CoNLL file.")],
    task: Annotated[str | None, typer.Option(help="classify, qa or ner [default: from the model].")] = None,
    predictions: Annotated[
        str | None, typer.Option(help="Write predictions here (SQuAD: the official {id: answer} JSON).")
    ] = None,
    batch_size: Annotated[int, typer.Option(help="Features per forward pass.")] = 64,
    bf16: Bf16 = False,
    limit: Annotated[int | None, typer.Option(help="Score only N evenly spaced examples.")] = None,
    label_map: Annotated[
        str | None, typer.Option(help="classify: rename raw labels '0=negative,1=positive' [default: as trained].")
    ] = None,
) -> None:
    """Score a fine-tuned model on labelled data; prints one JSON line of metrics."""
    with exit_on_user_error():
        from bert_model.finetuning.run import evaluate_model

        result = evaluate_model(
            model,
            task,
            data,
            predictions=predictions,
            batch_size=batch_size,
            bf16=bf16,
            limit=limit,
            label_map=_pairs(label_map),
        )
    typer.echo(json.dumps(result))


_TRAINING_KEYS = (
    "epochs",
    "max_steps",
    "batch_size",
    "learning_rate",
    "warmup_ratio",
    "weight_decay",
    "seed",
    "bf16",
    "eval_every",
    "eval_limit",
    "max_train_examples",
    "threads",
    "lora",
    "lora_rank",
    "lora_alpha",
    "lora_targets",
    "lora_layernorm",
    "lora_bias",
)


def _training_values(values: dict[str, Any]) -> dict[str, Any]:
    return {key: values[key] for key in _TRAINING_KEYS}


def _pairs(text: str | None) -> dict[str, str] | None:
    if not text:
        return None
    pairs = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError(f"--label-map entries look like RAW=NAME, got {item!r}")
        pairs[key.strip()] = value.strip()
    return pairs


def _names(text: str | None) -> list[str] | None:
    return [name.strip() for name in text.split(",") if name.strip()] if text else None
