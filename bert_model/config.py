"""BertConfig: the hyper-parameters of a BERT-family model, read from and written to Hugging Face `config.json`.

Field names follow Hugging Face's `BertConfig` so that checkpoint folders round-trip. Presets follow the
sizes in Devlin et al. (2019), Table 1 and Turc et al. (2019), "Well-Read Students Learn Better"
(tiny / mini / small / medium). The module is torch-free.

The BERT family shares one encoder; `FAMILIES` says how each `model_type` configures it, after the papers and
Hugging Face's modeling code: RoBERTa (Liu et al., 2019) and XLM-RoBERTa count positions past the padding index;
DistilBERT (Sanh et al., 2019) has no token types and no pooler; ELECTRA (Clark et al., 2020) may embed narrower
than its hidden size and project up; ALBERT (Lan et al., 2020) always projects its factorised embeddings and
shares one layer across the depth. DistilBERT's and ALBERT's own config.json key names are translated on read
and written back on save.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

SUPPORTED_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "tanh")
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")
DEFAULT_LAYER_NORM_EPS = 1e-12
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


@dataclass(frozen=True)
class Family:
    """How one `model_type` configures the shared encoder, its heads and its config.json."""

    class_prefix: str
    """Start of its `transformers` class names (`Roberta` + `ForMaskedLM`)."""
    positions_after_padding: bool = False
    """Position ids start at pad_token_id + 1 and skip padding tokens (RoBERTa, XLM-RoBERTa)."""
    has_token_types: bool = True
    """Whether the embeddings add a token-type (segment) embedding."""
    has_pooler: bool = True
    """Whether the base model has the tanh pooler over the first token."""
    classifier_activation: str | None = None
    """Sequence classification: None = pooler -> dropout -> linear (BERT); else the first token's state ->
    dropout -> dense -> this activation -> dropout -> out_proj."""
    classifier_input_dropout: bool = True
    """Whether that head starts with dropout (DistilBERT's pre_classifier reads the state directly)."""
    lm_activation: str | None = None
    """Activation of the masked-LM transform; None = hidden_act."""
    embedding_projection: str = "never"
    """`never`, `if_narrower` (ELECTRA: when embedding_size != hidden_size) or `always` (ALBERT)."""
    shares_layers: bool = False
    """One transformer layer applied num_hidden_layers times (ALBERT)."""
    own_keys: tuple[str, ...] = ()
    """BertConfig fields only this family's config.json has."""
    absent_keys: tuple[str, ...] = ()
    """BertConfig fields its config.json lacks (fixed by the family)."""
    renamed_keys: dict[str, str] = field(default_factory=dict)
    """BertConfig field -> its config.json key, where the names differ."""
    read_defaults: dict[str, Any] = field(default_factory=dict)
    """Field values implied by the family when its config.json does not carry them."""


_ROBERTA = Family("Roberta", positions_after_padding=True, classifier_activation="tanh", lm_activation="gelu")
FAMILIES: dict[str, Family] = {
    "albert": Family(
        "Albert",
        embedding_projection="always",
        shares_layers=True,
        own_keys=("embedding_size", "num_hidden_groups", "inner_group_num"),
        renamed_keys={"classifier_dropout": "classifier_dropout_prob"},
    ),
    "bert": Family("Bert"),
    "distilbert": Family(
        "DistilBert",
        has_token_types=False,
        has_pooler=False,
        classifier_activation="relu",
        classifier_input_dropout=False,
        own_keys=("sinusoidal_pos_embds",),
        absent_keys=("type_vocab_size", "layer_norm_eps", "position_embedding_type"),
        renamed_keys={
            "hidden_size": "dim",
            "num_hidden_layers": "n_layers",
            "num_attention_heads": "n_heads",
            "intermediate_size": "hidden_dim",
            "hidden_act": "activation",
            "hidden_dropout_prob": "dropout",
            "attention_probs_dropout_prob": "attention_dropout",
            "classifier_dropout": "seq_classif_dropout",
        },
        read_defaults={"type_vocab_size": 0},
    ),
    "electra": Family(
        "Electra",
        has_pooler=False,
        classifier_activation="gelu",
        lm_activation="gelu",
        embedding_projection="if_narrower",
        own_keys=("embedding_size",),
    ),
    "roberta": _ROBERTA,
    "xlm-roberta": dataclasses.replace(_ROBERTA, class_prefix="XLMRoberta"),
}
"""The supported model_types; the heads and checkpoint layouts are keyed by the same names."""
SUPPORTED_MODEL_TYPES = tuple(sorted(FAMILIES))
_FAMILY_KEYS = {key for family in FAMILIES.values() for key in family.own_keys}


def check_model_type(model_type: object) -> str:
    """`model_type` if it is a supported family, else ValueError with the one message every loader gives."""
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise ValueError(f"config.json has model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    return model_type


@dataclass
class BertConfig:
    """Hyper-parameters of a BERT-family encoder and its task heads (defaults: BERT-base, uncased)."""

    model_type: str = "bert"
    """The family (a key of FAMILIES): how embeddings, layers and heads are arranged and named."""
    vocab_size: int = 30522
    """Number of WordPiece tokens in the vocabulary."""
    hidden_size: int = 768
    """Width of every hidden state."""
    embedding_size: int | None = None
    """Width of the token, position and type embeddings (ELECTRA, ALBERT), projected up to hidden_size when it
    differs (always for ALBERT); None means hidden_size."""
    num_hidden_layers: int = 12
    """Number of transformer layers the encoder applies (ALBERT: applications of its one shared layer)."""
    num_hidden_groups: int = 1
    """ALBERT: groups of shared layers; only 1 is supported."""
    inner_group_num: int = 1
    """ALBERT: layers inside a group; only 1 is supported."""
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
    """Number of segment (token type) ids: 2 for sentence A / sentence B, 1 for RoBERTa, 0 (none) for DistilBERT."""
    initializer_range: float = 0.02
    """Standard deviation of the truncated-normal-like initialisation of weights."""
    layer_norm_eps: float = DEFAULT_LAYER_NORM_EPS
    """Epsilon of every LayerNorm."""
    pad_token_id: int = 0
    """Id of [PAD]; its word embedding is initialised to zero. RoBERTa's positions count from it."""
    position_embedding_type: str = "absolute"
    """Only learned absolute position embeddings are supported."""
    sinusoidal_pos_embds: bool = False
    """DistilBERT: position embeddings initialised to fixed sinusoids (checkpoints carry them as weights)."""
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
        check_model_type(self.model_type)
        self._validate_sizes()
        self._validate_choices()
        self._validate_family()

    def _validate_sizes(self) -> None:
        positive = (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "num_hidden_groups",
            "inner_group_num",
        )
        for name in positive:
            _check_positive(name, getattr(self, name))
        if self.embedding_size is not None:
            _check_positive("embedding_size", self.embedding_size)
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads}); try num_attention_heads="
                f"{_nearest_divisor(self.hidden_size, self.num_attention_heads)}"
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"BertConfig.{name} must be in [0, 1), got {getattr(self, name)!r}")

    def _validate_choices(self) -> None:
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

    def _validate_family(self) -> None:
        family, kind = self.family, self.model_type
        if family.has_token_types:
            _check_positive("type_vocab_size", self.type_vocab_size)
        elif self.type_vocab_size != 0:
            raise ValueError(
                f"model_type {kind!r} has no token types: type_vocab_size must be 0, got {self.type_vocab_size}"
            )
        if family.embedding_projection == "never" and self.embedding_width != self.hidden_size:
            raise ValueError(
                f"model_type {kind!r} has no embedding projection: embedding_size ({self.embedding_size}) must be "
                f"None or hidden_size ({self.hidden_size})"
            )
        if (self.num_hidden_groups, self.inner_group_num) != (1, 1):  # ALBERT's; other families leave them at 1
            raise ValueError(
                f"num_hidden_groups={self.num_hidden_groups}, inner_group_num={self.inner_group_num} is not supported: "
                "only one shared group of one layer (1, 1), as in every released ALBERT"
            )
        if self.sinusoidal_pos_embds and "sinusoidal_pos_embds" not in family.own_keys:
            raise ValueError(f"sinusoidal_pos_embds is a DistilBERT setting, not one of model_type {kind!r}")
        if family.positions_after_padding and self.max_position_embeddings <= self.pad_token_id + 1:
            raise ValueError(
                f"max_position_embeddings ({self.max_position_embeddings}) leaves no position after the padding index "
                f"(model_type {kind!r} counts positions from pad_token_id + 1 = {self.pad_token_id + 1})"
            )
        if "layer_norm_eps" in family.absent_keys and self.layer_norm_eps != DEFAULT_LAYER_NORM_EPS:
            raise ValueError(
                f"model_type {kind!r} fixes layer_norm_eps at {DEFAULT_LAYER_NORM_EPS}, got {self.layer_norm_eps}"
            )

    # ---- derived values -------------------------------------------------------------------------------
    @property
    def family(self) -> Family:
        """How this model_type arranges the shared encoder and heads."""
        return FAMILIES[self.model_type]

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def embedding_width(self) -> int:
        """Width of the embeddings: embedding_size, or hidden_size when unset."""
        return self.embedding_size if self.embedding_size is not None else self.hidden_size

    @property
    def projects_embeddings(self) -> bool:
        """Whether a linear layer maps the embeddings to hidden_size before the first layer."""
        projection = self.family.embedding_projection
        return projection == "always" or (projection == "if_narrower" and self.embedding_width != self.hidden_size)

    @property
    def position_offset(self) -> int:
        """The position id of the first token: pad_token_id + 1 for RoBERTa-style positions, else 0."""
        return self.pad_token_id + 1 if self.family.positions_after_padding else 0

    @property
    def max_sequence_length(self) -> int:
        """Longest input in tokens, special tokens included: the position table less its offset."""
        return self.max_position_embeddings - self.position_offset

    def architecture(self, head: str) -> str:
        """The `transformers` class name of this family with a head suffix (`Model`, `ForMaskedLM`, ...)."""
        return self.family.class_prefix + head

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
        """The Hugging Face `config.json` content, in this family's own key names (`transformers.AutoConfig`
        reads it as the same family)."""
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
        family = self.family
        for key in (_FAMILY_KEYS - set(family.own_keys)) | set(family.absent_keys):
            data.pop(key)
        if "embedding_size" in family.own_keys:
            data["embedding_size"] = self.embedding_width
        if "classifier_dropout" in family.renamed_keys and self.classifier_dropout is None:
            data["classifier_dropout"] = self.hidden_dropout_prob  # their config classes take a number, not None
        data = {family.renamed_keys.get(key, key): value for key, value in data.items()}
        if architecture:
            data["architectures"] = [architecture]
        data.update(extra)
        return data

    @classmethod
    def from_hf_dict(cls, data: dict[str, Any]) -> BertConfig:
        """Build from a Hugging Face `config.json` dict of a supported family; unknown keys are kept in `extra`."""
        model_type = check_model_type(data.get("model_type", "bert"))
        family = FAMILIES[model_type]
        our_name = {theirs: ours for ours, theirs in family.renamed_keys.items()}
        known = {f.name for f in fields(cls)} - {"extra"}
        values: dict[str, Any] = {**family.read_defaults, "model_type": model_type}
        extra: dict[str, Any] = {}
        for key, value in data.items():
            name = our_name.get(key, key)
            if name in known:
                values[name] = value
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


def _check_positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"BertConfig.{name} must be a positive integer, got {value!r}")


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
