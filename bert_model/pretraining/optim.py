"""Optimizers and the learning-rate schedule of BERT pretraining.

- AdamW (Loshchilov & Hutter 2019): `torch.optim.AdamW`, as BERT's "Adam with decoupled weight decay".
- LAMB (You et al. 2020, "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes",
  algorithm 2): Adam's bias-corrected update plus decoupled weight decay, rescaled per parameter tensor by the
  trust ratio ||w|| / ||update||, which keeps very large batches (32k) stable. Written here: torch has none.
- Schedule (Devlin et al. 2019, appendix A.2): linear warm-up to the peak rate, then linear decay to zero
  (`bert_model.training.lr_multiplier`, shared with fine-tuning). With a time budget the schedule's progress is
  the larger of steps done / max_steps and time spent / budget, so that the decay reaches zero when the budget
  runs out (the "budget" schedules of Geiping & Goldstein 2022, "Cramming: Training a Language Model on a Single
  GPU in One Day", section 4.3).
- Weight decay skips biases and LayerNorm parameters (`bert_model.training.parameter_groups`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn
from torch.optim import Optimizer

from bert_model.training import lr_multiplier, parameter_groups

OPTIMIZERS: tuple[str, ...] = ("adamw", "lamb")


class Lamb(Optimizer):
    """LAMB: layer-wise adaptive moments, for large-batch training (You et al. 2020, algorithm 2)."""

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
    ) -> None:
        if lr < 0:
            raise ValueError(f"learning rate must be >= 0, got {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                self._update(param, group, beta1, beta2)
        return loss

    def _update(self, param: torch.Tensor, group: dict, beta1: float, beta2: float) -> None:
        grad = param.grad
        assert grad is not None
        state = self.state[param]
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(param)
            state["exp_avg_sq"] = torch.zeros_like(param)
        state["step"] += 1
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        m_hat = exp_avg / (1 - beta1 ** state["step"])
        v_hat = exp_avg_sq / (1 - beta2 ** state["step"])
        update = m_hat / (v_hat.sqrt() + group["eps"])
        if group["weight_decay"] != 0:
            update.add_(param, alpha=group["weight_decay"])
        weight_norm = param.norm()
        update_norm = update.norm()
        trust = torch.where(
            (weight_norm > 0) & (update_norm > 0), weight_norm / update_norm, torch.ones_like(weight_norm)
        )
        param.add_(update * trust, alpha=-group["lr"])


def build_optimizer(
    model: nn.Module,
    name: str,
    lr: float,
    weight_decay: float = 0.01,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-6,
) -> Optimizer:
    """AdamW or LAMB over `model` with BERT's weight-decay exclusions."""
    groups = parameter_groups(model, weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)
    if name == "lamb":
        return Lamb(groups, lr=lr, betas=betas, eps=eps)
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")


class WarmupLinearSchedule:
    """Sets the learning rate of every parameter group before each optimizer step.

    Stateless apart from (step, elapsed seconds), which the trainer checkpoints: nothing else to save.
    """

    def __init__(
        self, optimizer: Optimizer, peak_lr: float, warmup_steps: int, total_steps: int, budget_s: float | None = None
    ) -> None:
        if warmup_steps < 0 or total_steps < 1 or warmup_steps >= max(total_steps, 2):
            raise ValueError(f"need 0 <= warmup_steps < total_steps, got {warmup_steps} and {total_steps}")
        if budget_s is not None and budget_s <= 0:
            raise ValueError(f"the time budget must be positive, got {budget_s} s")
        self.optimizer = optimizer
        self.peak_lr = peak_lr
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.budget_s = budget_s

    def progress(self, step: int, elapsed_s: float) -> float:
        """Schedule position in steps: `step`, or further along when the time budget is spent faster."""
        if self.budget_s is None:
            return float(step)
        return max(float(step), elapsed_s / self.budget_s * self.total_steps)

    def finished(self, step: int, elapsed_s: float) -> bool:
        return self.progress(step, elapsed_s) >= self.total_steps

    def apply(self, step: int, elapsed_s: float = 0.0) -> float:
        """Set and return the learning rate of optimizer step `step` (0-based)."""
        lr = self.peak_lr * lr_multiplier(self.progress(step, elapsed_s), self.warmup_steps, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr
