"""`bertserve info MODEL`: config, parameter count and vocabulary of a checkpoint folder or built-in name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from bertserve.cli_errors import exit_on_user_error


def register(app: typer.Typer) -> None:
    app.command("info")(info)


def info(
    model: Annotated[str, typer.Argument(help="Checkpoint folder or built-in name (minilm, minilm-sst2, ...).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
) -> None:
    """Print the config, parameter count and vocabulary of a model."""
    with exit_on_user_error():
        summary = describe_model(model)
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    _print_tables(summary)


def describe_model(model: str) -> dict[str, Any]:
    """The facts `info` prints, as a dict."""
    from bert_model.checkpoint import load_checkpoint_state
    from bert_model.config import BertConfig
    from bert_model.registry import resolve_model_path
    from bert_model.tokenization import BertTokenizer

    folder = resolve_model_path(model)
    config = BertConfig.load(folder)
    state = load_checkpoint_state(folder, config)
    # Tied copies and buffers (old checkpoints store position_ids) are not parameters.
    parameters = sum(
        t.numel() for k, t in state.items() if not k.endswith(("decoder.weight", "decoder.bias", "position_ids"))
    )
    tokenizer = BertTokenizer.from_pretrained(folder)
    return {
        "model": model,
        "folder": str(folder),
        "config": config.to_hf_dict(),
        "parameters": int(parameters),
        "weights": sorted(p.name for p in Path(folder).iterdir() if p.suffix in {".safetensors", ".bin"}),
        "vocabulary": {
            "size": tokenizer.vocab_size,
            "lowercase": tokenizer.lowercase,
            "model_max_length": tokenizer.model_max_length,
            "special_tokens": {
                token: tokenizer.token_to_id(token) for token in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
            },
        },
    }


def _print_tables(summary: dict[str, Any]) -> None:
    console = Console()
    console.print(f"[bold]{summary['model']}[/bold]  ({summary['folder']})")
    console.print(f"parameters: {summary['parameters']:,}   weights: {', '.join(summary['weights'])}")
    config = Table("config field", "value", title="config")
    for key, value in sorted(summary["config"].items()):
        config.add_row(key, json.dumps(value))
    console.print(config)
    vocab = summary["vocabulary"]
    table = Table("vocabulary", "value")
    table.add_row("size", str(vocab["size"]))
    table.add_row("lowercase", str(vocab["lowercase"]))
    table.add_row("model_max_length", str(vocab["model_max_length"]))
    for token, index in vocab["special_tokens"].items():
        table.add_row(token, str(index))
    console.print(table)
