"""The training loop shared by every task: AdamW, warm-up + linear decay, bf16 autocast (as `options.bf16` says;
`run.finetune` decides it from the CPU), periodic evaluation with best-checkpoint selection, and metrics as JSON
lines.

Schedule and optimizer follow Devlin et al. (2019), appendix A.3 (Adam with decoupled weight decay,
Loshchilov & Hutter 2019; linear warm-up then linear decay). The best trainable parameters (by the task's
primary metric on the eval set) are kept in memory and restored at the end.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from bert_model.finetuning.batching import fit_segments, training_batches
from bert_model.finetuning.inference import autocast
from bert_model.finetuning.options import TrainingOptions
from bert_model.training import MetricsLog, TrainResult, lr_multiplier, parameter_groups

BatchBuilder = Callable[[list[int]], dict[str, torch.Tensor]]
Evaluate = Callable[[nn.Module, int | None], dict[str, Any]]
Loss = Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]


def head_loss(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The loss the head computes from the targets among `inputs`."""
    return model(**inputs).loss


def make_optimizer(model: nn.Module, options: TrainingOptions) -> torch.optim.AdamW:
    """AdamW over the trainable parameters; no weight decay on biases and LayerNorm parameters."""
    groups = parameter_groups(model, options.weight_decay)
    return torch.optim.AdamW(groups, lr=options.peak_learning_rate, betas=(0.9, 0.999), eps=1e-8)


class Trainer:
    """Runs the loop for one model; the task supplies batches, evaluation and its primary metric."""

    def __init__(
        self,
        model: nn.Module,
        options: TrainingOptions,
        build_batch: BatchBuilder,
        lengths: Sequence[int],
        evaluate: Evaluate | None = None,
        primary_metric: str = "f1",
        log: MetricsLog | None = None,
        loss: Loss = head_loss,
    ) -> None:
        if not lengths:
            raise ValueError("the training set is empty")
        self.model, self.options, self.build_batch, self.loss = model, options, build_batch, loss
        self.lengths, self.evaluate, self.primary_metric = list(lengths), evaluate, primary_metric
        self.log = log or MetricsLog(None)
        self.rng = np.random.default_rng(options.seed)
        self.batches_per_epoch = math.ceil(len(lengths) / options.batch_size)
        self.total_steps = options.max_steps or max(1, math.ceil(options.epochs * self.batches_per_epoch))
        self.result = TrainResult()
        self._best_state: dict[str, torch.Tensor] | None = None
        self._queue: list[list[int]] = []

    def train(self) -> TrainResult:
        optimizer = make_optimizer(self.model, self.options)
        warmup = int(self.options.warmup_ratio * self.total_steps)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: lr_multiplier(step, warmup, self.total_steps)
        )
        started, losses = time.perf_counter(), []
        self.model.train()
        bar = tqdm(total=self.total_steps, desc="finetune", unit="step", mininterval=5.0)
        for step in range(1, self.total_steps + 1):
            losses.append(self._step(self._next_batch(), optimizer))
            scheduler.step()
            bar.update(1)
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}", lr=f"{scheduler.get_last_lr()[0]:.2e}", refresh=False)
            if step % self.options.log_every == 0:
                self.result.last_train = self._log_train(step, losses, float(scheduler.get_last_lr()[0]), started)
            if self._should_evaluate(step):
                self._evaluate(step, started)
        bar.close()
        self.result.steps, self.result.seconds = self.total_steps, time.perf_counter() - started
        self._restore_best()
        return self.result

    # ---- internals --------------------------------------------------------------------------------------
    def _next_batch(self) -> list[int]:
        if not self._queue:  # a new epoch: a fresh random order
            self._queue = training_batches(
                self.lengths, self.options.batch_size, self.rng, self.options.length_grouping
            )
        return self._queue.pop()

    def _step(self, batch: list[int], optimizer: torch.optim.Optimizer) -> float:
        inputs = fit_segments(self.build_batch(batch), self.model)
        with autocast(self.options.bf16):
            loss = self.loss(self.model, inputs)
        loss.backward()
        if self.options.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(
                [p for p in self.model.parameters() if p.requires_grad], self.options.max_grad_norm
            )
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    def _should_evaluate(self, step: int) -> bool:
        if self.evaluate is None:
            return False
        if step == self.total_steps:
            return True
        if self.options.eval_every is not None:
            return step % self.options.eval_every == 0
        return step % self.batches_per_epoch == 0

    def _log_train(self, step: int, losses: list[float], lr: float, started: float) -> dict[str, Any]:
        record = {
            "step": step,
            "epoch": round(step / self.batches_per_epoch, 4),
            "train_loss": float(np.mean(losses[-self.options.log_every :])),
            "learning_rate": lr,
            "elapsed_s": round(time.perf_counter() - started, 1),
        }
        self.log.write(record)
        return record

    def _evaluate(self, step: int, started: float) -> None:
        assert self.evaluate is not None
        metrics = self.evaluate(self.model, self.options.eval_limit)
        self.model.train()
        value = float(metrics[self.primary_metric])
        improved = self.result.best_metric is None or value > self.result.best_metric
        if improved:
            self.result.best_metric, self.result.best_step = value, step
            self._best_state = {
                name: p.detach().clone() for name, p in self.model.named_parameters() if p.requires_grad
            }
        record = {
            "step": step,
            "epoch": round(step / self.batches_per_epoch, 4),
            "eval": metrics,
            "best": improved,
            "elapsed_s": round(time.perf_counter() - started, 1),
        }
        self.result.last_eval = record
        self.log.write(record)
        tqdm.write(f"step {step}: {self.primary_metric} {value:.2f}" + (" (best)" if improved else ""))

    def _restore_best(self) -> None:
        if self._best_state is None:
            return
        parameters = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, value in self._best_state.items():
                parameters[name].copy_(value)
