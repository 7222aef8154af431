"""`bertserve pretrain-vocab`, `pretrain-data` and `pretrain`: the pretraining stages on the command line.

The same `pretrain` command runs data-parallel under torchrun, e.g.
`torchrun --nproc_per_node 2 -m bertserve pretrain ...` (see docs/pretraining.md). Heavy imports
(torch) happen inside the command bodies.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Annotated

import typer

from bertserve.cli_errors import exit_on_user_error

CorpusArg = Annotated[list[Path], typer.Argument(help="Plain-text corpus files (blank lines between documents).")]
FormatOpt = Annotated[
    str, typer.Option("--format", help="auto, plain (blank lines end documents) or wikitext (' = Title = ' does).")
]


def register(app: typer.Typer) -> None:
    app.command("pretrain-vocab")(pretrain_vocab)
    app.command("pretrain-data")(pretrain_data)
    app.command("pretrain")(pretrain)


def pretrain_vocab(
    corpus: CorpusArg,
    out: Annotated[Path, typer.Option("--out", help="Folder for vocab.txt, tokenizer.json, tokenizer_config.json.")],
    size: Annotated[int, typer.Option("--size", help="Vocabulary size (special tokens included).")] = 8192,
    cased: Annotated[bool, typer.Option("--cased", help="Keep case (default: lower-case, like BERT uncased).")] = False,
    min_frequency: Annotated[int, typer.Option(help="Drop merges seen fewer times than this.")] = 2,
    corpus_format: FormatOpt = "auto",
) -> None:
    """Train a WordPiece vocabulary on a corpus (for models pretrained from scratch)."""
    from bert_model.pretraining.vocab import train_wordpiece

    with exit_on_user_error():
        tokenizer = train_wordpiece(
            [str(p) for p in corpus],
            size,
            lowercase=not cased,
            min_frequency=min_frequency,
            corpus_format=corpus_format,  # type: ignore[arg-type]
        )
        tokenizer.save(out)
    typer.echo(f"wrote a {tokenizer.vocab_size}-token WordPiece vocabulary to {out}")


def pretrain_data(
    corpus: CorpusArg,
    out: Annotated[Path, typer.Option("--out", help="Data folder to write (meta.json, tokenizer/, train/, eval/).")],
    tokenizer: Annotated[
        str, typer.Option("--tokenizer", help="Tokenizer folder (from pretrain-vocab) or model name (minilm).")
    ] = "minilm",
    max_seq_length: Annotated[int, typer.Option(help="Tokens per instance, [CLS]/[SEP] included.")] = 128,
    objective: Annotated[
        str,
        typer.Option(
            help="mlm-nsp (BERT: sentence pairs with next-sentence labels) or mlm (RoBERTa: full sentences packed "
            "across documents, no NSP; pair it with --dynamic-masking)."
        ),
    ] = "mlm-nsp",
    short_seq_prob: Annotated[
        float, typer.Option(help="Probability of a shorter random target length (NSP pairs).")
    ] = 0.1,
    dupe_factor: Annotated[int, typer.Option(help="Passes over the corpus, each with new pairs and masks.")] = 5,
    masked_lm_prob: Annotated[float, typer.Option(help="Share of tokens chosen for masked LM.")] = 0.15,
    max_predictions_per_seq: Annotated[
        int | None, typer.Option(help="Cap on chosen tokens per sequence; default ceil(length x prob).")
    ] = None,
    whole_word: Annotated[bool, typer.Option("--whole-word", help="Mask all pieces of a word together.")] = False,
    dynamic_masking: Annotated[
        bool, typer.Option("--dynamic-masking", help="Store unmasked; mask anew every epoch when training.")
    ] = False,
    eval_fraction: Annotated[float, typer.Option(help="Share of whole documents held out for evaluation.")] = 0.0,
    instances_per_shard: Annotated[int, typer.Option(help="Instances per shard file.")] = 10_000,
    documents_per_block: Annotated[int, typer.Option(help="Documents processed together (bounds memory).")] = 10_000,
    corpus_format: FormatOpt = "auto",
    paragraphs_per_document: Annotated[
        int, typer.Option(help="In plain files, group this many blank-line-separated paragraphs into a document.")
    ] = 1,
    seed: Annotated[int, typer.Option(help="Seed of every random choice.")] = 12345,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace the contents of a non-empty --out.")] = False,
) -> None:
    """Turn raw text into sharded masked-LM (+ next-sentence) instances."""
    from bert_model.pretraining.build import DataOptions, build_pretraining_data
    from bert_model.pretraining.masking import MaskingOptions
    from bert_model.tokenization import BertTokenizer

    with exit_on_user_error():
        cap = max_predictions_per_seq or math.ceil(max_seq_length * masked_lm_prob)
        options = DataOptions(
            max_seq_length=max_seq_length,
            objective=objective,
            short_seq_prob=short_seq_prob,
            dupe_factor=dupe_factor,
            masking=MaskingOptions(masked_lm_prob, cap, whole_word),
            dynamic_masking=dynamic_masking,
            eval_fraction=eval_fraction,
            instances_per_shard=instances_per_shard,
            documents_per_block=documents_per_block,
            corpus_format=corpus_format,  # type: ignore[arg-type]
            paragraphs_per_document=paragraphs_per_document,
            seed=seed,
        )
        meta = build_pretraining_data(corpus, BertTokenizer.from_pretrained(tokenizer), out, options, overwrite)
    for name, info in meta.splits.items():
        labels = f"NotNext {info.not_next / max(info.instances, 1):.1%}" if meta.has_nsp else "no NSP labels"
        typer.echo(
            f"{name}: {info.documents} documents -> {info.instances} instances, {info.tokens} tokens, "
            f"{len(info.shards)} shard(s), {labels}"
        )
    typer.echo(f"wrote {out}")


def pretrain(
    data: Annotated[Path, typer.Option("--data", help="Folder written by pretrain-data.")],
    out: Annotated[Path, typer.Option("--out", help="Run folder: model, tokenizer, checkpoint/, metrics.jsonl.")],
    config: Annotated[
        str | None, typer.Option("--config", help="tiny, mini, small, medium, base, large or a config.json.")
    ] = None,
    init: Annotated[
        str | None, typer.Option("--init", help="Continue this checkpoint folder or name (minilm).")
    ] = None,
    max_steps: Annotated[int, typer.Option(help="Optimizer steps in total.")] = 1000,
    time_budget: Annotated[
        float | None,
        typer.Option(help="Minutes of wall time: the schedule ends when these or max-steps run out (not exact)."),
    ] = None,
    batch_size: Annotated[int, typer.Option(help="Global batch: sequences per optimizer step.")] = 32,
    micro_batch_size: Annotated[int | None, typer.Option(help="Sequences per forward pass per process.")] = None,
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate.")] = 1e-4,
    optimizer: Annotated[str, typer.Option(help="adamw or lamb.")] = "adamw",
    weight_decay: Annotated[float, typer.Option(help="Decoupled weight decay.")] = 0.01,
    warmup_steps: Annotated[int | None, typer.Option(help="Warm-up steps (default warmup-ratio x steps).")] = None,
    warmup_ratio: Annotated[float, typer.Option(help="Warm-up share of the steps.")] = 0.05,
    max_grad_norm: Annotated[float, typer.Option(help="Gradient clipping norm (0: off).")] = 1.0,
    bf16: Annotated[
        bool,
        typer.Option(
            "--bf16", help="bfloat16 autocast where the device computes it natively (CPU AVX512-BF16 / AMX, GPU)."
        ),
    ] = False,
    eval_every: Annotated[int, typer.Option(help="Held-out evaluation every N steps (0: at the end).")] = 0,
    eval_max_instances: Annotated[int, typer.Option(help="Held-out instances per evaluation.")] = 2000,
    log_every: Annotated[int, typer.Option(help="Train metrics line every N steps.")] = 10,
    save_every: Annotated[int, typer.Option(help="Checkpoint every N steps (0: at the end / on stop).")] = 0,
    seed: Annotated[int, typer.Option(help="Seed of initialisation, data order, masks, dropout.")] = 42,
    dropout: Annotated[float | None, typer.Option(help="Override the model's dropout.")] = None,
    position_init: Annotated[
        str, typer.Option(help="Fresh position embeddings: normal (BERT) or sinusoidal (then learned).")
    ] = "normal",
    attention_init: Annotated[
        str,
        typer.Option(
            help="Fresh attention: normal (BERT), mimetic (W_k = W_q at the start) or local (layer 0 starts "
            "reading the neighbouring tokens: leaves the masked-LM plateau far sooner)."
        ),
    ] = "normal",
    mlm_bias_init: Annotated[
        str, typer.Option(help="Fresh MLM output bias: zero (BERT) or unigram (log token frequencies of the data).")
    ] = "zero",
    resume: Annotated[bool, typer.Option("--resume", help="Continue the run in --out from its checkpoint.")] = False,
    stop_after: Annotated[int | None, typer.Option(help="Stop with a checkpoint after N steps of this call.")] = None,
    progress: Annotated[bool | None, typer.Option("--progress/--no-progress", help="Progress bar.")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
) -> None:
    """Pretrain BERT with masked LM + next-sentence prediction, or masked LM alone on `--objective mlm` data
    (runs DDP under torchrun)."""
    from bert_model.pretraining.trainer import pretrain as run_pretraining
    from bert_model.pretraining.training_args import TrainingArgs

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    with exit_on_user_error():
        args = TrainingArgs(
            data=data,
            out=out,
            config=config,
            init=init,
            max_steps=max_steps,
            time_budget_minutes=time_budget,
            batch_size=batch_size,
            micro_batch_size=micro_batch_size,
            learning_rate=lr,
            optimizer=optimizer,
            weight_decay=weight_decay,
            warmup_steps=warmup_steps,
            warmup_ratio=warmup_ratio,
            max_grad_norm=max_grad_norm,
            bf16=bf16,
            eval_every=eval_every,
            eval_max_instances=eval_max_instances,
            log_every=log_every,
            save_every=save_every,
            seed=seed,
            dropout=dropout,
            position_init=position_init,
            attention_init=attention_init,
            mlm_bias_init=mlm_bias_init,
            resume=resume,
            stop_after=stop_after,
            progress=progress,
            device=device,
        )
        result = run_pretraining(args)
    if int(os.environ.get("RANK", "0")) != 0:
        return
    state = "finished" if result.completed else "stopped (resume with --resume)"
    typer.echo(f"{state} at step {result.steps} after {result.seconds:.0f} s of training; run folder {args.out}")
    if result.last_eval:
        keys = ("mlm_loss", "mlm_acc", "nsp_loss", "nsp_acc")
        summary = {k: round(result.last_eval[k], 4) for k in keys if k in result.last_eval}
        typer.echo(f"held-out: {json.dumps(summary)}")
