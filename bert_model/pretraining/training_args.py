"""The options of a pretraining run (`bertserve pretrain`), one documented field each, validated before work.

Defaults follow Devlin et al. (2019), appendix A.2 where they carry over to small models (AdamW, beta2 0.999,
weight decay 0.01, warm-up then linear decay, dropout 0.1, gradient clipping at 1.0), scaled down in steps
and batch for one machine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bert_model.pretraining.optim import OPTIMIZERS

MLM_BIAS_INITS = ("zero", "unigram")


@dataclass
class TrainingArgs:
    """Everything `pretrain` needs; paths are folders."""

    data: Path
    """Folder written by `pretrain-data` (meta.json, tokenizer/, train/, optional eval/)."""
    out: Path
    """Run folder: final model + tokenizer, checkpoint/ (resume state), metrics.jsonl."""
    config: str | None = None
    """A preset name (tiny, mini, small, medium, base, large) or a config.json path; from scratch."""
    init: str | None = None
    """Continue pretraining a checkpoint folder or built-in name (e.g. minilm) instead of starting from scratch."""
    max_steps: int = 1000
    """Optimizer steps of the whole run (the schedule decays to zero at this step)."""
    time_budget_minutes: float | None = None
    """Wall-clock budget of the run (evaluations included): the schedule decays to zero when the budget or
    max_steps runs out, whichever comes first. The run then depends on the machine's speed (not bit-for-bit
    reproducible); leave it unset for exact resumption."""
    batch_size: int = 32
    """Sequences per optimizer step, over all processes and accumulation steps (the global batch)."""
    micro_batch_size: int | None = None
    """Sequences per forward pass on one process; batch_size / (processes x micro) accumulation steps.
    Default: the whole per-process share in one pass."""
    learning_rate: float = 1e-4
    """Peak learning rate, reached at the end of warm-up."""
    optimizer: str = "adamw"
    """adamw, or lamb for very large batches."""
    weight_decay: float = 0.01
    """Decoupled weight decay (not on biases and LayerNorm weights)."""
    warmup_steps: int | None = None
    """Linear warm-up steps; default warmup_ratio x max_steps."""
    warmup_ratio: float = 0.05
    """Warm-up share of max_steps when warmup_steps is not given."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this (0 disables clipping)."""
    bf16: bool = False
    """bfloat16 autocast for the forward pass (CPU with AVX-512 BF16/AMX, or GPU); weights stay fp32."""
    eval_every: int = 0
    """Evaluate on the held-out split every N steps (and at step 0 and at the end); 0 = only at the end."""
    eval_max_instances: int = 2000
    """Held-out instances per evaluation (the first N, always the same ones)."""
    eval_batch_size: int = 64
    """Sequences per evaluation forward pass."""
    log_every: int = 10
    """Write a train line to metrics.jsonl every N steps (means over those steps)."""
    save_every: int = 0
    """Write a resumable checkpoint every N steps; 0 = only at the end or when interrupted."""
    seed: int = 42
    """Seeds the model initialisation, the data order, dynamic masks and dropout."""
    dropout: float | None = None
    """Override hidden and attention dropout of the model config."""
    position_init: str = "normal"
    """Start of a fresh model's learned position embeddings: normal (BERT's N(0, 0.02)) or sinusoidal
    (Vaswani et al. 2017, scaled to the same 0.02 RMS)."""
    attention_init: str = "normal"
    """Start of a fresh model's attention: normal (BERT), mimetic (W_k = W_q, Trockman & Kolter 2023) or local
    (layer 0's first heads read the tokens at offsets -1, +1, -2, +2; positions in their own subspace)."""
    mlm_bias_init: str = "zero"
    """Start of a fresh model's MLM decoder bias: zero (BERT) or unigram (log frequencies of the training text)."""
    resume: bool = False
    """Continue the run in `out` from its checkpoint (same data, batch and process count)."""
    stop_after: int | None = None
    """Stop (saving a checkpoint) after this many steps in this invocation, as if interrupted."""
    progress: bool | None = None
    """Show a progress bar; None = only on a terminal."""
    device: str = "auto"
    """auto (CUDA if present), cpu or cuda."""

    def __post_init__(self) -> None:
        self.data = Path(self.data)
        self.out = Path(self.out)

    def validate(self, world_size: int = 1) -> None:
        """Raise ValueError naming the first option that cannot work (before any model is built)."""
        if (self.config is None) == (self.init is None):
            raise ValueError("give exactly one of --config (train from scratch) and --init (continue a checkpoint)")
        self._check_counts()
        self._check_rates()
        if self.mlm_bias_init not in MLM_BIAS_INITS:
            raise ValueError(f"mlm_bias_init must be one of {MLM_BIAS_INITS}, got {self.mlm_bias_init!r}")
        self.accumulation_steps(world_size)
        self.resolved_warmup()

    def _check_counts(self) -> None:
        minimum = {"max_steps": 1, "batch_size": 1, "log_every": 1, "eval_batch_size": 1, "eval_max_instances": 1}
        minimum |= {"eval_every": 0, "save_every": 0, "seed": 0}
        for name, lowest in minimum.items():
            if getattr(self, name) < lowest:
                raise ValueError(f"{name} must be at least {lowest}, got {getattr(self, name)}")
        if self.stop_after is not None and self.stop_after < 1:
            raise ValueError(f"stop_after must be at least 1, got {self.stop_after}")

    def _check_rates(self) -> None:
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be positive, got {self.learning_rate}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.dropout is not None and not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.time_budget_minutes is not None and self.time_budget_minutes <= 0:
            raise ValueError(f"time_budget_minutes must be positive, got {self.time_budget_minutes}")
        if self.max_grad_norm < 0:
            raise ValueError(f"max_grad_norm must be >= 0, got {self.max_grad_norm}")

    def per_process_batch(self, world_size: int) -> int:
        if self.batch_size % world_size:
            raise ValueError(f"batch_size {self.batch_size} is not divisible by the {world_size} processes")
        return self.batch_size // world_size

    def accumulation_steps(self, world_size: int) -> int:
        """Forward/backward passes per optimizer step on each process."""
        share = self.per_process_batch(world_size)
        micro = self.micro_batch_size or share
        if micro < 1 or share % micro:
            raise ValueError(
                f"micro_batch_size {micro} must divide the per-process batch {share} "
                f"(batch_size {self.batch_size} / {world_size} processes)"
            )
        return share // micro

    def resolved_warmup(self) -> int:
        steps = self.warmup_steps if self.warmup_steps is not None else round(self.warmup_ratio * self.max_steps)
        if not 0 <= steps < self.max_steps:
            raise ValueError(f"warmup_steps must be in [0, max_steps={self.max_steps}), got {steps}")
        return steps

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["data"], data["out"] = str(self.data), str(self.out)
        return data
