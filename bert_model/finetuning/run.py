"""`finetune` and `evaluate` as functions: load, train, select the best checkpoint, save, score.

Output folder of `finetune`:

    config.json, tokenizer files      the model (full weights, or a small LoRA composite over the base model)
    model.safetensors | adapter.safetensors
    metrics.jsonl                     training-loss lines and one line per evaluation
    eval_results.json                 the final evaluation on the whole eval set (best checkpoint)
    run.json                          the options, data files, seed, steps and wall time of the run

The model may be of any family of the encoder (BERT, RoBERTa, XLM-RoBERTa, DistilBERT, ELECTRA, ALBERT): the head
class arranges itself from the folder's config (`BertConfig.family`), a full folder is saved in the family's own
layout (transformers loads it back), and a LoRA composite names the family's architecture. The tokenizer is the
folder's (`BertTokenizer.from_pretrained`); it must pad with the model's `pad_token_id` where positions count from
it (RoBERTa, XLM-R). bf16 autocast is used only where the CPU computes bf16 natively.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import platform
import time
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from bert_model.adapters import LoRAConfig, apply_lora, base_state_dict, save_composite, trainable_parameter_count
from bert_model.checkpoint import PreTrainedMixin
from bert_model.config import META_KEY, BertConfig
from bert_model.finetuning.classify import write_classify_predictions
from bert_model.finetuning.ner import write_conll_predictions
from bert_model.finetuning.options import ClassifyOptions, FinetuneRun, TaskOptions
from bert_model.finetuning.qa import QARecipe, write_squad_predictions
from bert_model.finetuning.recipe import EvalOutcome, EvalSet, TaskRecipe
from bert_model.finetuning.recipes import default_options, make_recipe, stored_settings
from bert_model.finetuning.rerank import write_rerank_predictions
from bert_model.finetuning.trainer import Trainer
from bert_model.registry import TASK_MODELS, resolve_model_path
from bert_model.tokenization import BertTokenizer
from bert_model.training import MetricsLog, resolve_bf16

logger = logging.getLogger(__name__)


# ---- finetune -------------------------------------------------------------------------------------------
def finetune(run: FinetuneRun) -> dict[str, Any]:
    """Train, keep the best checkpoint on the eval set, save it to `run.out`; returns the run summary."""
    started = time.perf_counter()
    options = dataclasses.replace(run.training, bf16=resolve_bf16(run.training.bf16))
    if options.threads:
        torch.set_num_threads(options.threads)
    torch.manual_seed(options.seed)
    out = Path(run.out)
    tokenizer = BertTokenizer.from_pretrained(run.model)
    check_model_inputs(BertConfig.load(resolve_model_path(run.model)), tokenizer, run.task_options, run.model)
    recipe = make_recipe(run.task, tokenizer, run.task_options)
    train = recipe.load_train(run.train, options.max_train_examples)
    eval_set = recipe.load_eval(run.eval) if run.eval else None
    model = recipe.model_class().from_pretrained(run.model, **recipe.config_overrides())  # type: ignore[attr-defined]
    lora = options.lora
    if lora is not None:
        lora.extra_modules = tuple(dict.fromkeys((*lora.extra_modules, *recipe.lora_extra_modules)))
        apply_lora(model, lora)
    log = MetricsLog(out / "metrics.jsonl")

    def evaluate(current: nn.Module, limit: int | None) -> dict[str, Any]:
        assert eval_set is not None
        return recipe.evaluate(current, eval_set, limit, options.eval_batch_size, options.bf16).metrics

    trainer = Trainer(
        model,
        options,
        lambda indices: recipe.batch(train, indices),
        train.unit_lengths(),
        evaluate if eval_set is not None else None,
        recipe.primary_metric,
        log,
        recipe.loss,
    )
    logger.info(
        "training %d features (%d examples), %d steps", len(train.features), train.examples, trainer.total_steps
    )
    result = trainer.train()
    final = _final_evaluation(recipe, model, eval_set, options.eval_batch_size, options.bf16, log)
    if isinstance(recipe, QARecipe) and final is not None and recipe.version_2:
        recipe.null_threshold = float(final.metrics["best_null_threshold"])
    save_model(model, out, run.model, recipe, tokenizer, lora)
    summary = {
        "run": run.to_dict(),
        "train_examples": train.examples,
        "train_features": len(train.features),
        "trainable_parameters": trainable_parameter_count(model),
        "steps": result.steps,
        "train_seconds": round(result.seconds, 1),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "best_step": result.best_step,
        "eval": final.metrics if final else None,
        "precision": "bf16-autocast" if options.bf16 else "fp32",
        "torch": torch.__version__,
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
    }
    (out / "run.json").write_text(json.dumps(summary, indent=2) + "\n")
    if final is not None:
        (out / "eval_results.json").write_text(json.dumps(final.metrics, indent=2) + "\n")
    return summary


def check_model_inputs(config: BertConfig, tokenizer: BertTokenizer, options: TaskOptions, model: str) -> None:
    """Refuse, before any work, inputs the model would read wrongly: windows longer than its positions allow, and
    (RoBERTa-style positions, counted from the padding id) a tokenizer that pads with another id."""
    if options.max_seq_length > config.max_sequence_length:
        raise ValueError(
            f"max_seq_length {options.max_seq_length} is longer than {model!r} accepts ({config.max_sequence_length} "
            "tokens)"
        )
    if config.family.positions_after_padding and tokenizer.pad_id != config.pad_token_id:
        raise ValueError(
            f"{model!r} is a {config.model_type} model whose positions count from pad_token_id {config.pad_token_id}, "
            f"but its tokenizer pads with id {tokenizer.pad_id}: use the tokenizer the model was trained with"
        )


def _final_evaluation(
    recipe: TaskRecipe, model: nn.Module, eval_set: EvalSet | None, batch_size: int, bf16: bool, log: MetricsLog
) -> EvalOutcome | None:
    if eval_set is None:
        return None
    outcome = recipe.evaluate(model, eval_set, None, batch_size, bf16)
    log.write({"final": True, "eval": outcome.metrics})
    return outcome


def save_model(
    model: nn.Module,
    out: Path,
    base_model: str,
    recipe: TaskRecipe,
    tokenizer: BertTokenizer,
    lora: LoRAConfig | None,
) -> None:
    """Save full weights, or (LoRA) a small composite over `base_model`; tokenizer files beside them."""
    settings = {"task": recipe.settings()}
    if lora is not None:
        base_folder = resolve_model_path(base_model)
        base_name = base_model if _is_builtin(base_model) else str(base_folder)
        save_composite(model, out, base_name, base_state_dict(base_folder), lora, extra_meta=settings)
        tokenizer.save(out)
        if _is_wordpiece(tokenizer):
            (out / "tokenizer.json").unlink()  # vocab.txt + tokenizer_config.json rebuild it; keeps the folder small
        return
    trained = cast(PreTrainedMixin, model)
    trained.config = trained.config.replace(extra={**trained.config.extra, META_KEY: settings})
    trained.save_pretrained(out)
    tokenizer.save(out)


def _is_wordpiece(tokenizer: BertTokenizer) -> bool:
    """Whether vocab.txt alone rebuilds the tokenizer (a WordPiece model; not byte-level BPE or Unigram)."""
    return bool(json.loads(tokenizer.backend.to_str()).get("model", {}).get("type") == "WordPiece")


def _is_builtin(name: str) -> bool:
    return name == "minilm" or name in TASK_MODELS


# ---- evaluate -------------------------------------------------------------------------------------------
def evaluate_model(
    model_name: str,
    task: str | None,
    data: str | Path,
    *,
    predictions: str | Path | None = None,
    batch_size: int = 64,
    bf16: bool = False,
    options: Any = None,
    limit: int | None = None,
    label_map: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Score a fine-tuned model on a labelled file with the tasks' post-processing and metrics."""
    started = time.perf_counter()
    folder = resolve_model_path(model_name)
    config = BertConfig.load(folder)
    settings = stored_settings(config)
    task = task or settings.get("name") or TASK_MODELS.get(str(model_name))
    if task is None:
        raise ValueError(f"cannot tell the task of {model_name!r}: pass --task classify, qa, ner or rerank")
    if settings.get("name") not in (None, task):
        raise ValueError(f"{model_name!r} was fine-tuned for {settings['name']!r}, not {task!r}")
    tokenizer = BertTokenizer.from_pretrained(folder)
    options = options or default_options(task, settings)
    if label_map is not None and isinstance(options, ClassifyOptions):
        options.label_map = label_map
    check_model_inputs(config, tokenizer, options, str(model_name))
    recipe = make_recipe(task, tokenizer, options, config)
    eval_set = recipe.load_eval(data)
    model = recipe.model_class().from_pretrained(folder)  # type: ignore[attr-defined]
    outcome = recipe.evaluate(model, eval_set, limit, batch_size, resolve_bf16(bf16, activity="evaluating"))
    if predictions is not None:
        write_predictions(task, Path(predictions), eval_set, outcome)
    return {
        "model": str(model_name),
        "task": task,
        "data": str(data),
        "examples": len(eval_set.examples) if limit is None else min(limit, len(eval_set.examples)),
        **outcome.metrics,
        "seconds": round(time.perf_counter() - started, 1),
    }


def write_predictions(task: str, path: Path, eval_set: EvalSet, outcome: EvalOutcome) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = {
        "classify": write_classify_predictions,
        "qa": write_squad_predictions,
        "ner": write_conll_predictions,
        "rerank": write_rerank_predictions,
    }
    writer[task](path, eval_set, outcome)
