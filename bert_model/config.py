"""BertConfig: the hyper-parameters of a BERT model, read from and written to Hugging Face `config.json`.

Field names follow Hugging Face's `BertConfig` so that checkpoint folders round-trip. Presets follow the
sizes in Devlin et al. (2019), Table 1 and Turc et al. (2019), "Well-Read Students Learn Better"
(tiny / mini / small / medium). The module is torch-free.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

SUPPORTED_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "tanh")
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")
META_KEY = "bertserve"
"""Key of config.json under which this project stores its own metadata (kept in `BertConfig.extra`): the task
settings of a fine-tuned model (`task`), and the base model and adapter of a composite folder (`base_model`,
`adapter`)."""

# Keys of a Hugging Face config.json that carry no meaning for our model and are dropped on read.
_IGNORED_HF_KEYS = {
    "_name_or_path",
    "transformers_version",
    "gradient_checkpointing",
    "use_cache",
    "model_type",
    "architectures",
    "torch_dtype",
    "dtype",
    "output_past",
    "directionality",
    "pooler_fc_size",
    "pooler_num_attention_heads",
    "pooler_num_fc_layers",
    "pooler_size_per_head",
    "pooler_type",
    "is_decoder",
    "add_cross_attention",
    "chunk_size_feed_forward",
}


@dataclass
class BertConfig:
    """Hyper-parameters of a BERT encoder and its task heads (defaults: BERT-base, uncased)."""

    vocab_size: int = 30522
    """Number of WordPiece tokens in the vocabulary."""
    hidden_size: int = 768
    """Width of every hidden state (the embedding size too)."""
    num_hidden_layers: int = 12
    """Number of transformer layers in the encoder."""
    num_attention_heads: int = 12
    """Attention heads per layer; must divide `hidden_size`."""
    intermediate_size: int = 3072
    """Width of the feed-forward layer inside each transformer layer."""
    hidden_act: str = "gelu"
    """Activation of the feed-forward layer and of the MLM transform (exact erf GELU by default)."""
    hidden_dropout_prob: float = 0.1
    """Dropout on embeddings and on every residual branch."""
    attention_probs_dropout_prob: float = 0.1
    """Dropout on the attention probabilities."""
    max_position_embeddings: int = 512
    """Longest sequence (in tokens, [CLS]/[SEP] included) the model accepts."""
    type_vocab_size: int = 2
    """Number of segment (token type) ids: 2 for sentence A / sentence B."""
    initializer_range: float = 0.02
    """Standard deviation of the truncated-normal-like initialisation of weights."""
    layer_norm_eps: float = 1e-12
    """Epsilon of every LayerNorm."""
    pad_token_id: int = 0
    """Id of [PAD]; its word embedding is initialised to zero."""
    position_embedding_type: str = "absolute"
    """Only learned absolute position embeddings are supported."""
    classifier_dropout: float | None = None
    """Dropout before classification heads; `None` means `hidden_dropout_prob`."""
    id2label: dict[int, str] = field(default_factory=dict)
    """Label names of a classification / token-classification head, by class index."""
    problem_type: str | None = None
    """Loss of sequence classification, as in Hugging Face: `regression` (MSE), `single_label_classification`
    (cross-entropy over class ids), `multi_label_classification` (binary cross-entropy per label, on 0/1 float
    labels); None infers it: regression for one output, else from the labels' dtype (integer: single-label)."""
    attn_implementation: str = "sdpa"
    """`sdpa` (torch scaled_dot_product_attention) or `eager` (explicit matmul-softmax, used for export)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Keys of config.json that we do not interpret (e.g. `bertserve` adapter metadata); kept on save."""

    def __post_init__(self) -> None:
        self.id2label = {int(k): str(v) for k, v in self.id2label.items()}
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first setting that cannot build a model."""
        positive = (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"BertConfig.{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads}); try num_attention_heads="
                f"{_nearest_divisor(self.hidden_size, self.num_attention_heads)}"
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"BertConfig.{name} must be in [0, 1), got {getattr(self, name)!r}")
        choices: dict[str, tuple[str | None, ...]] = {
            "hidden_act": SUPPORTED_ACTIVATIONS,
            "attn_implementation": ATTENTION_IMPLEMENTATIONS,
            "problem_type": (None, *PROBLEM_TYPES),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} {getattr(self, name)!r} is not one of {allowed}")
        if self.position_embedding_type != "absolute":
            raise ValueError(
                f"position_embedding_type {self.position_embedding_type!r} is not supported (only 'absolute')"
            )
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"pad_token_id {self.pad_token_id} is outside the vocabulary ({self.vocab_size})")

    # ---- derived values -------------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def num_labels(self) -> int:
        return len(self.id2label)

    @property
    def label2id(self) -> dict[str, int]:
        return {label: index for index, label in self.id2label.items()}

    def with_labels(self, labels: list[str]) -> BertConfig:
        """A copy of this config whose heads predict `labels` (in that index order)."""
        if len(set(labels)) != len(labels):
            raise ValueError(f"labels must be unique, got {labels}")
        return self.replace(id2label=dict(enumerate(labels)))

    def replace(self, **changes: Any) -> BertConfig:
        """A validated copy with some fields changed."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ValueError(f"unknown BertConfig field(s): {sorted(unknown)}")
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return BertConfig(**values)

    # ---- presets -------------------------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> BertConfig:
        """One of the named sizes: tiny, mini, small, medium, base, large."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        values: dict[str, Any] = dict(PRESETS[name])
        values.update(overrides)
        return cls(**values)

    # ---- Hugging Face config.json round trip ----------------------------------------------------------
    def to_hf_dict(self, architecture: str | None = None) -> dict[str, Any]:
        """The Hugging Face `config.json` content (loads with `transformers.BertConfig`)."""
        data = asdict(self)
        extra = data.pop("extra")
        data.pop("attn_implementation")
        id2label = data.pop("id2label")
        if id2label:
            data["id2label"] = {str(k): v for k, v in id2label.items()}
            data["label2id"] = {v: k for k, v in id2label.items()}
            data["num_labels"] = len(id2label)
        if data["problem_type"] is None:
            data.pop("problem_type")
        data["model_type"] = "bert"
        if architecture:
            data["architectures"] = [architecture]
        data.update(extra)
        return data

    @classmethod
    def from_hf_dict(cls, data: dict[str, Any]) -> BertConfig:
        """Build from a Hugging Face `config.json` dict; unknown keys are kept in `extra`."""
        model_type = data.get("model_type", "bert")
        if model_type != "bert":
            raise ValueError(f"config.json has model_type {model_type!r}; only 'bert' checkpoints are supported")
        known = {f.name for f in fields(cls)} - {"extra"}
        values: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in data.items():
            if key in known:
                values[key] = value
            elif key in {"label2id", "num_labels"} or key in _IGNORED_HF_KEYS:
                continue
            else:
                extra[key] = value
        if "id2label" not in values and isinstance(data.get("num_labels"), int):
            values["id2label"] = {i: f"LABEL_{i}" for i in range(data["num_labels"])}
        return cls(**values, extra=extra)

    def save(self, path: str | Path, architecture: str | None = None) -> Path:
        """Write `config.json` into folder `path` (or to `path` if it ends in .json)."""
        target = Path(path)
        if target.suffix != ".json":
            target.mkdir(parents=True, exist_ok=True)
            target = target / "config.json"
        target.write_text(json.dumps(self.to_hf_dict(architecture), indent=2, sort_keys=True) + "\n")
        return target

    @classmethod
    def load(cls, path: str | Path) -> BertConfig:
        """Read `config.json` from a folder or a file path."""
        source = Path(path)
        if source.is_dir():
            source = source / "config.json"
        if not source.is_file():
            raise FileNotFoundError(f"no config.json at {source}")
        try:
            data = json.loads(source.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{source} is not valid JSON: {error}") from error
        if not isinstance(data, dict):
            raise ValueError(f"{source} must hold a JSON object, got {type(data).__name__}")
        return cls.from_hf_dict(data)


def _nearest_divisor(number: int, near: int) -> int:
    divisors = [d for d in range(1, number + 1) if number % d == 0]
    return min(divisors, key=lambda d: (abs(d - near), d))


PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 512},
    "mini": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024},
    "small": {
        "hidden_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "intermediate_size": 2048,
    },
    "medium": {
        "hidden_size": 512,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "intermediate_size": 2048,
    },
    "base": {},
    "large": {
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "intermediate_size": 4096,
    },
}
