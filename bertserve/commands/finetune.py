"""`bertserve finetune {classify,qa,ner,rerank}`, `bertserve evaluate` and `bertserve retrieval-eval`: thin typer
wrappers over `run` and `retrieval_eval`.

The finetune commands are generated, not written out: each takes the run's data and model options
(`RUN_OPTIONS`), every field of `TrainingOptions` that carries command-line metadata (`options.cli`: help text and
flags; name, type and default come from the field itself), the LoRA switch and its settings (`LORA_OPTIONS`), and
every field of its task's options class (`ClassifyOptions`, `QAOptions`, `NEROptions`, `RerankOptions`). So an
option is declared once, and cannot drift from the dataclass it fills. torch is imported only inside the command
bodies (through `bert_model.finetuning.run`), so registering these commands costs nothing to `bertserve serve`.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from bert_model.finetuning.options import (
    TASK_TRAINING_DEFAULTS,
    ClassifyOptions,
    FinetuneRun,
    NEROptions,
    QAOptions,
    RerankOptions,
    TaskOptions,
    TrainingOptions,
)
from bertserve.cli_errors import exit_on_user_error

TASKS: dict[str, tuple[type[TaskOptions], str]] = {
    "classify": (ClassifyOptions, "Fine-tune a text (pair) classifier on TSV / CSV / JSONL data."),
    "qa": (QAOptions, "Fine-tune extractive question answering on SQuAD v1.1 / v2.0 JSON."),
    "ner": (NEROptions, "Fine-tune NER on CoNLL column files (IOB1 or IOB2)."),
    "rerank": (
        RerankOptions,
        "Fine-tune a cross-encoder reranker on SQuAD JSON (hard negatives mined) or query / positive / negatives "
        "JSON lines.",
    ),
}
"""Each finetune command: its task options class and its help."""

REQUIRED = inspect.Parameter.empty


@dataclasses.dataclass(frozen=True)
class CliOption:
    """One command-line option: parameter name, value type, default (REQUIRED: none), help text, flags, and how its
    text becomes the field's value (`parse`, for list and mapping fields)."""

    name: str
    kind: Any
    default: Any
    help: str
    flags: tuple[str, ...] = ()
    parse: Callable[[Any], Any] | None = None

    def value(self, given: Any) -> Any:
        return self.parse(given) if self.parse else given

    def parameter(self) -> inspect.Parameter:
        """The keyword parameter typer reads: the type as annotation, the option (default, flags, help) as default."""
        default = ... if self.default is REQUIRED else self.default
        option = typer.Option(default, *self.flags, help=self.help)
        return inspect.Parameter(self.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=self.kind)


RUN_OPTIONS = (
    CliOption("train", str, REQUIRED, "Training data file."),
    CliOption("out", str, REQUIRED, "Output folder for the model, metrics.jsonl, eval_results.json, run.json."),
    CliOption(
        "model",
        str,
        "minilm",
        "Model to start from: a checkpoint folder of any family (BERT, RoBERTa, XLM-R, DistilBERT, ELECTRA, ALBERT) "
        "or a built-in name.",
    ),
    CliOption("eval_path", str | None, None, "Evaluation data: best-checkpoint selection + final scores.", ("--eval",)),
)
"""What `FinetuneRun` takes besides the options classes: the data, the output folder, the starting model."""

LORA_OPTIONS = (
    CliOption("lora", bool, False, "Train LoRA adapters (small composite) or every weight.", ("--lora/--full",)),
    CliOption("lora_rank", int, 16, "LoRA rank r."),
    CliOption("lora_alpha", float, 32.0, "LoRA alpha (update scaled by alpha / r)."),
    CliOption("lora_targets", str, "query,key,value,dense", "Comma-separated encoder linear layers to adapt."),
    CliOption(
        "lora_layernorm",
        bool,
        True,
        "With LoRA, also train LayerNorms.",
        ("--lora-layernorm/--no-lora-layernorm",),
    ),
    CliOption("lora_bias", bool, True, "With LoRA, also train encoder biases.", ("--lora-bias/--no-lora-bias",)),
)
"""`TrainingOptions.lora` as options: the switch, then LoRAConfig's rank, alpha, target_modules, train_layernorm and
train_bias (its defaults; `bert_model.adapters` imports torch, so they are stated here and a test compares them)."""


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


def field_options(options_class: type, defaults: dict[str, Any] | None = None) -> list[CliOption]:
    """The options of a dataclass: its fields with `cli` metadata, in field order, with the field's default (or the
    one in `defaults`). A list field is given as `a,b`, a mapping as `a=x,b=y`."""
    found = []
    for field in dataclasses.fields(options_class):
        if "cli_help" not in field.metadata:
            continue
        kind = _field_type(options_class, field)
        origins = {typing.get_origin(kind), *(typing.get_origin(arg) for arg in typing.get_args(kind))}
        parse = _pairs if dict in origins else _names if list in origins else None
        default = (defaults or {}).get(field.name, field.default)
        help_text, flags = field.metadata["cli_help"], field.metadata["cli_flags"]
        found.append(CliOption(field.name, str | None if parse else kind, default, help_text, flags, parse))
    return found


def _field_type(owner: type, field: dataclasses.Field[Any]) -> Any:
    """A field's annotation as a type, evaluated in its module as `typing.get_type_hints` does, one field at a time:
    the options module imports `LoRAConfig` (torch) for type checking only, and no option is of that type."""
    if not isinstance(field.type, str):
        return field.type
    return eval(field.type, vars(sys.modules[owner.__module__]))


def training_options(task: str) -> list[CliOption]:
    return [*field_options(TrainingOptions, TASK_TRAINING_DEFAULTS.get(task)), *LORA_OPTIONS]


def register(app: typer.Typer) -> None:
    finetune_app = typer.Typer(help="Fine-tune a model for a task family.", no_args_is_help=True)
    for task in TASKS:
        finetune_app.command(task)(finetune_command(task))
    app.add_typer(finetune_app, name="finetune")
    app.command("evaluate")(evaluate)
    app.command("retrieval-eval")(retrieval_eval)


def finetune_command(task: str) -> Callable[..., None]:
    """The `finetune <task>` command: every option generated (see the module docstring)."""
    options_class, summary = TASKS[task]
    training = training_options(task)
    task_fields = field_options(options_class)

    def command(**values: Any) -> None:
        with exit_on_user_error():
            run = {option.name: values[option.name] for option in RUN_OPTIONS}
            options = _training({option.name: values[option.name] for option in training})
            task_options = options_class(**{option.name: option.value(values[option.name]) for option in task_fields})
            _run(task, run["model"], run["train"], run["eval_path"], run["out"], options, task_options)

    command.__name__ = command.__qualname__ = f"finetune_{task}"
    command.__doc__ = summary
    parameters = [option.parameter() for option in (*RUN_OPTIONS, *training, *task_fields)]
    command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    return command


def _training(values: dict[str, Any]) -> TrainingOptions:
    from bert_model.adapters import lora_config_from_args

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
    from bert_model.finetuning.run import finetune

    summary = finetune(FinetuneRun(task, model, train, out, eval_path, training, options))
    typer.echo(
        json.dumps(
            {"out": out, "steps": summary["steps"], "wall_seconds": summary["wall_seconds"], "eval": summary["eval"]}
        )
    )


BF16 = next(option for option in field_options(TrainingOptions) if option.name == "bf16")


def evaluate(
    model: Annotated[str, typer.Argument(help="Fine-tuned model folder or built-in name (minilm-sst2, ...).")],
    data: Annotated[
        str, typer.Option(help="Labelled data: TSV/CSV/JSONL, SQuAD JSON, CoNLL file or rerank pairs JSON lines.")
    ],
    task: Annotated[str | None, typer.Option(help="classify, qa, ner or rerank [default: from the model].")] = None,
    predictions: Annotated[
        str | None, typer.Option(help="Write predictions here (SQuAD: the official {id: answer} JSON).")
    ] = None,
    batch_size: Annotated[int, typer.Option(help="Features per forward pass.")] = 64,
    bf16: Annotated[bool, typer.Option(*BF16.flags, help=BF16.help)] = False,
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


def retrieval_eval(
    squad: Annotated[Path, typer.Option(help="SQuAD JSON: every question against every paragraph of the file.")],
    host: Annotated[
        str | None, typer.Option(help="REST URL of a running service (loopback only) whose /embed is scored.")
    ] = None,
    model: Annotated[str | None, typer.Option(help="The served embed model. [the service's default]")] = None,
    reference: Annotated[
        str | None,
        typer.Option(help="Also score sentence-transformers on this checkpoint folder or built-in name (minilm)."),
    ] = None,
    max_paragraphs: Annotated[
        int | None, typer.Option(help="Only the first N paragraphs and their questions. [all]")
    ] = None,
    batch_size: Annotated[int, typer.Option(help="Texts per /embed request and per sentence-transformers batch.")] = 16,
    api_key: Annotated[str | None, typer.Option(help="Bearer key of the service, if it needs one.")] = None,
    out: Annotated[Path | None, typer.Option(help="Also write the results as one JSON file.")] = None,
    rerank: Annotated[
        str | None,
        typer.Option(help="Also score the two-stage pipeline: the embeddings' top-k reranked by this served model."),
    ] = None,
    top_k: Annotated[
        int, typer.Option(help="Candidates per question the reranker ranks (with --rerank, --reference-rerank).")
    ] = 20,
    reference_rerank: Annotated[
        str | None,
        typer.Option(
            help="Also score the two-stage pipeline in-process: --reference's top-k reranked by this cross-encoder "
            "(folder or built-in name) in PyTorch."
        ),
    ] = None,
) -> None:
    """Question -> paragraph retrieval (recall@1, @5, MRR) through the service and/or sentence-transformers; with
    --rerank, the embeddings' top-k reranked by a served cross-encoder, with its latency per query; with
    --reference-rerank, reranked in-process (PyTorch)."""
    from bertserve.retrieval_eval import run_retrieval_eval

    run_retrieval_eval(
        squad,
        host=host,
        model=model,
        reference=reference,
        max_paragraphs=max_paragraphs,
        batch_size=batch_size,
        api_key=api_key,
        out=out,
        echo=typer.echo,
        rerank=rerank,
        top_k=top_k,
        reference_rerank=reference_rerank,
    )
