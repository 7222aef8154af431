"""Options of a fine-tuning run, validated before any work starts (one docstring per field).

A field that is also an option of `bertserve finetune {classify,qa,ner,rerank}` carries its help text (and its flags
where they are not `--<name>`) in its metadata (`cli`); the commands are generated from these fields
(finetuning/cli.py), with the field's name, type and default. Torch-free, so that building the command line imports
no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import bert_model.tasks.defaults as defaults

if TYPE_CHECKING:
    from bert_model.adapters import LoRAConfig

TASK_NAMES: tuple[str, ...] = ("classify", "qa", "ner", "rerank")
DEFAULT_LEARNING_RATE = {"full": 5e-5, "lora": 5e-4}
TASK_TRAINING_DEFAULTS: dict[str, dict[str, Any]] = {"qa": {"epochs": 2.0}}
"""The `finetune <task>` command's defaults where they differ from TrainingOptions' (SQuAD's epochs are long)."""


def cli(help_text: str, *flags: str) -> dict[str, Any]:
    """Field metadata that makes the field a `bertserve finetune` option: its help text, and its flags when they are
    not `--<name>` (`--lr`, or a boolean's `--on/--off` pair)."""
    return {"cli_help": help_text, "cli_flags": flags}


def _max_seq_length(default: int) -> Any:
    return field(default=default, metadata=cli("Tokens per input window, specials included."))


@dataclass
class TrainingOptions:
    """The optimisation schedule and bookkeeping shared by every task."""

    epochs: float = field(default=3.0, metadata=cli("Passes over the training data (fractions allowed)."))
    """Passes over the training set (fractions allowed); ignored when `max_steps` is set."""
    max_steps: int | None = field(
        default=None, metadata=cli("Stop after this many steps instead (schedule ends there).")
    )
    """Stop after this many optimizer steps (the schedule decays to zero there)."""
    batch_size: int = field(default=32, metadata=cli("Training features per step."))
    """Training examples (features) per step."""
    learning_rate: float | None = field(
        default=None, metadata=cli("Peak learning rate [default: 5e-5 full, 5e-4 LoRA].", "--lr")
    )
    """Peak learning rate; None picks 5e-5 for full fine-tuning and 5e-4 for LoRA."""
    warmup_ratio: float = field(default=0.1, metadata=cli("Fraction of steps with linear warm-up."))
    """Fraction of the steps with linear warm-up from 0; the rest decays linearly to 0."""
    weight_decay: float = field(default=0.01, metadata=cli("AdamW weight decay."))
    """AdamW decoupled weight decay (not applied to biases and LayerNorm weights)."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm (0 disables it)."""
    seed: int = field(default=42, metadata=cli("Seed of head/adapter init, dropout and batch order."))
    """Seeds head initialisation, LoRA initialisation, dropout and batch order."""
    bf16: bool = field(
        default=False,
        metadata=cli(
            "bf16 autocast where the CPU computes it natively (AMX/AVX512-BF16) or on CUDA; fp32 elsewhere.",
            "--bf16/--no-bf16",
        ),
    )
    """bf16 autocast for training and evaluation forwards, where the CPU computes bf16 natively (AMX/AVX512-BF16)
    or on CUDA; elsewhere fp32, with one warning (`bert_model.training.resolve_bf16`)."""
    eval_every: int | None = field(default=None, metadata=cli("Evaluate every N steps [default: each epoch]."))
    """Evaluate every N steps; None evaluates at the end of each epoch."""
    eval_limit: int | None = field(default=None, metadata=cli("Evaluate on N evenly spaced examples during training."))
    """Evaluate on an evenly spaced subset of this many eval examples during training (the final one is full)."""
    eval_batch_size: int = 64
    """Features per forward pass at evaluation."""
    max_train_examples: int | None = field(default=None, metadata=cli("Use only the first N training examples."))
    """Use only the first N training examples (quick trials)."""
    length_grouping: bool = True
    """Batch examples of similar length together (padding only to the longest in the batch)."""
    threads: int | None = field(default=None, metadata=cli("torch threads [default: torch's choice]."))
    """torch intra-op threads; None keeps torch's default."""
    lora: LoRAConfig | None = None
    """Train LoRA adapters (and what the LoRAConfig adds) instead of every weight (on the command line: `--lora` and
    the `--lora-*` options)."""
    log_every: int = 50
    """Write a training-loss line to metrics.jsonl every N steps."""

    def __post_init__(self) -> None:
        if self.epochs <= 0 and self.max_steps is None:
            raise ValueError(f"epochs must be positive, got {self.epochs}")
        for name in ("batch_size", "eval_batch_size", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("max_steps", "eval_every", "eval_limit", "max_train_examples", "threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1 (or unset), got {value}")
        if self.learning_rate is not None and not 0 < self.learning_rate < 1:
            raise ValueError(f"learning_rate must be in (0, 1), got {self.learning_rate}")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")

    @property
    def peak_learning_rate(self) -> float:
        if self.learning_rate is not None:
            return self.learning_rate
        return DEFAULT_LEARNING_RATE["lora" if self.lora else "full"]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["lora"] = self.lora.to_dict() if self.lora else None
        data["peak_learning_rate"] = self.peak_learning_rate
        return data


@dataclass
class ClassifyOptions:
    """Text classification data and input length."""

    max_seq_length: int = _max_seq_length(128)
    text_column: str | None = field(default=None, metadata=cli("Text column [default: detected]."))
    """Column of the (first) text; detected from the header when None."""
    pair_column: str | None = field(default=None, metadata=cli("Second-text column of pairs [default: detected]."))
    """Column of the second text of a pair; detected when None."""
    label_column: str | None = field(default=None, metadata=cli("Label column [default: detected]."))
    label_map: dict[str, str] | None = field(default=None, metadata=cli("Rename labels: '0=negative,1=positive'."))
    """Rename raw labels, e.g. {"0": "negative", "1": "positive"} (on the command line `0=negative,1=positive`)."""
    labels: list[str] | None = field(default=None, metadata=cli("Label order of the head: 'negative,positive'."))
    """Label order of the head; default: the training labels, sorted."""

    def __post_init__(self) -> None:
        _check_length(self.max_seq_length)


@dataclass
class QAOptions:
    """SQuAD windows and answer decoding."""

    max_seq_length: int = _max_seq_length(defaults.QA_MAX_SEQ_LENGTH)
    doc_stride: int = field(
        default=defaults.QA_DOC_STRIDE, metadata=cli("Context tokens shared by consecutive windows.")
    )
    """Context tokens shared by consecutive windows."""
    max_query_length: int = field(default=defaults.QA_MAX_QUERY_LENGTH, metadata=cli("Question tokens kept."))
    max_answer_length: int = field(default=defaults.QA_MAX_ANSWER_LENGTH, metadata=cli("Longest answer in tokens."))
    """Longest answer in tokens."""

    def __post_init__(self) -> None:
        from bert_model.tasks.qa import QASettings

        _check_length(self.max_seq_length)
        QASettings(self.max_seq_length, self.doc_stride, self.max_query_length, self.max_answer_length)


@dataclass
class NEROptions:
    """CoNLL columns, windows and labels."""

    max_seq_length: int = _max_seq_length(defaults.NER_MAX_SEQ_LENGTH)
    stride: int = field(default=defaults.NER_STRIDE, metadata=cli("Tokens shared by windows of long sentences."))
    """Tokens shared by consecutive windows of a long sentence."""
    tag_column: int = field(default=-1, metadata=cli("Column of the NER tag (negative counts from the end)."))
    scheme: str = field(default="auto", metadata=cli("Tag scheme of the files: auto, iob1, iob2."))
    """Tag scheme of the files: auto, iob1 or iob2 (everything is converted to IOB2)."""
    labels: list[str] | None = field(default=None, metadata=cli("Label order of the head: 'O,B-PER,I-PER,...'."))
    """Label order of the head; default: O then B-/I- for each entity type, sorted."""

    def __post_init__(self) -> None:
        _check_length(self.max_seq_length)
        if not 0 <= self.stride < self.max_seq_length - 2:
            raise ValueError(f"stride must be in [0, max_seq_length - 2), got {self.stride}")


NEGATIVE_SOURCES: tuple[str, ...] = ("embeddings", "bm25")
"""Rankings hard negatives may come from (RerankOptions.negatives_from)."""


@dataclass
class RerankOptions:
    """Reranker data: pair length, how many negatives each query is trained against, and where they come from.

    A query's training unit is its positive passage and `negatives` negatives (so `batch_size` counts queries, each
    of 1 + `negatives` pairs). From SQuAD JSON the negatives are mined (bert_model/finetuning/negatives.py); a
    pairs file (JSON lines `{"query", "positive", "negatives": [...]}`) brings its own."""

    max_seq_length: int = _max_seq_length(256)
    negatives: int = field(default=7, metadata=cli("Negatives per query in training (its unit: 1 + this many pairs)."))
    """Negative passages per query in training; a query with fewer candidates is topped up from other articles."""
    eval_candidates: int = field(default=20, metadata=cli("Candidates per eval query (its gold one included)."))
    """Candidate list of each evaluation query: its gold passage and the hardest negatives, this many in all."""
    negatives_from: str = field(
        default="embeddings,bm25",
        metadata=cli("SQuAD: rank an article's other paragraphs by 'embeddings', 'bm25' or both (interleaved)."),
    )
    """Comma-separated rankings of an article's other paragraphs that hard negatives are taken from, interleaved:
    the embedding model's cosine (`embeddings`) and BM25 over the article's paragraphs (`bm25`)."""
    embedding_model: str = field(default="minilm", metadata=cli("Sentence encoder that ranks SQuAD negatives."))
    """The sentence encoder (mean pooling, unit vectors) whose ranking gives the `embeddings` negatives: the first
    stage the reranker will sit behind."""

    def __post_init__(self) -> None:
        _check_length(self.max_seq_length)
        if self.negatives < 1:
            raise ValueError(f"negatives must be at least 1, got {self.negatives}")
        if self.eval_candidates < 2:
            raise ValueError(f"eval_candidates must be at least 2 (gold and a negative), got {self.eval_candidates}")
        sources = self.sources
        if not sources or set(sources) - set(NEGATIVE_SOURCES):
            raise ValueError(f"negatives_from must name some of {list(NEGATIVE_SOURCES)}, got {self.negatives_from!r}")

    @property
    def sources(self) -> list[str]:
        """The negative sources, in interleaving order."""
        return [name.strip() for name in self.negatives_from.split(",") if name.strip()]


TaskOptions = ClassifyOptions | QAOptions | NEROptions | RerankOptions


@dataclass
class FinetuneRun:
    """Everything one `bertserve finetune` run needs."""

    task: str
    model: str
    train: str
    out: str
    eval: str | None = None
    training: TrainingOptions = field(default_factory=TrainingOptions)
    task_options: TaskOptions = field(default_factory=ClassifyOptions)

    def __post_init__(self) -> None:
        if self.task not in TASK_NAMES:
            raise ValueError(f"task must be one of {TASK_NAMES}, got {self.task!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "model": self.model,
            "train": self.train,
            "eval": self.eval,
            "out": self.out,
            "training": self.training.to_dict(),
            "task_options": asdict(self.task_options),
        }


def _check_length(max_seq_length: int) -> None:
    if not 8 <= max_seq_length <= 512:
        raise ValueError(f"max_seq_length must be in [8, 512], got {max_seq_length}")
