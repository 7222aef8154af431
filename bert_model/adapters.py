"""LoRA adapters and "base model + adapter + head" composite folders.

Reference: Hu et al. (2021), "LoRA: Low-Rank Adaptation of Large Language Models", section 4.1: a frozen weight
W0 gets a trainable low-rank update, h = W0 x + (alpha / r) B A x, with A Gaussian-like (Kaiming uniform here,
as in the authors' `loralib`) and B zero at the start, so training starts from the pretrained function. After
training the update merges into the weight, W = W0 + (alpha / r) B A, so export and serving see a plain BERT.

A composite folder stays small by storing only what training changed:

    config.json          the task model's config; `"bertserve": {"base_model": NAME_OR_PATH, "adapter": {...}}`
    adapter.safetensors  LoRA factors `<module>.lora_A` / `.lora_B`; `delta.<param>` = trained - base for other
                         trained base parameters (LayerNorm, biases, pooler); new head parameters as values
    vocab.txt, tokenizer_config.json

`load_composite_state` (called by `bert_model.checkpoint.load_checkpoint_state`) rebuilds the full state dict:
base weights + merged LoRA updates + deltas + head. Factors and deltas may be stored in float16: they are
combined with the float32 base in float32. Every name in the adapter file is ours (Hugging Face BERT's), whatever
the family: the base's own tensors (`roberta.*`, `distilbert.transformer.*`, ...) are renamed to ours before they
are compared with, or combined with, what training changed; config.json names the family's architecture.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from bert_model.config import META_KEY, BertConfig
from bert_model.registry import resolve_model_path
from bert_model.weights import read_state_dict, to_our_names

ADAPTER_FILE = "adapter.safetensors"
DELTA_PREFIX = "delta."
LORA_SUFFIXES = (".lora_A", ".lora_B")
HEAD_MODULES = ("classifier", "qa_outputs")
"""Task heads: always fully trained (and stored as values)."""
# The family and the dimensions that must agree between a composite's config and its base model's config.
_SHAPE_FIELDS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "embedding_width",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
)


@dataclass
class LoRAConfig:
    """Which linear layers of the encoder get adapters, and what else is trained besides them."""

    rank: int = 16
    """r: rank of the update B A."""
    alpha: float = 32.0
    """The update is scaled by alpha / rank."""
    dropout: float = 0.05
    """Dropout on the adapter's input (training only)."""
    target_modules: tuple[str, ...] = ("query", "key", "value", "dense")
    """Encoder linear layers to adapt, by name or dotted suffix (`dense` = attention output, intermediate and
    output projections; `attention.output.dense` = only the first)."""
    train_layernorm: bool = True
    """Also train every LayerNorm's weight and bias (stored as deltas)."""
    train_bias: bool = True
    """Also train the biases of the encoder's linear layers (stored as deltas)."""
    extra_modules: tuple[str, ...] = ()
    """Further modules trained in full (e.g. `bert.pooler` for classification), stored as deltas; a name the model
    does not have trains nothing."""

    def __post_init__(self) -> None:
        self.target_modules = tuple(self.target_modules)
        self.extra_modules = tuple(self.extra_modules)
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise ValueError(f"LoRA rank must be a positive integer, got {self.rank!r}")
        if self.alpha <= 0:
            raise ValueError(f"LoRA alpha must be positive, got {self.alpha!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoRA dropout must be in [0, 1), got {self.dropout!r}")
        if not self.target_modules:
            raise ValueError("LoRA needs at least one target module")

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["target_modules"] = list(self.target_modules)
        data["extra_modules"] = list(self.extra_modules)
        return data


class LoRALinear(nn.Linear):
    """A linear layer with a frozen weight and a trainable low-rank update: W0 x + b + s B A dropout(x)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0) -> None:
        super().__init__(base.in_features, base.out_features, bias=base.bias is not None, device="meta")
        self.weight = base.weight  # shared: the state-dict names stay `<module>.weight` / `.bias`
        self.bias = base.bias
        self.rank, self.scaling = rank, alpha / rank
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, dtype=base.weight.dtype))  # (r, in)
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, dtype=base.weight.dtype))  # (out, r)
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.lora_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update = F.linear(F.linear(self.lora_dropout(x), self.lora_A), self.lora_B)  # (..., out)
        return F.linear(x, self.weight, self.bias) + update * self.scaling

    def delta_weight(self) -> torch.Tensor:
        """s B A, the (out, in) update of the weight."""
        return (self.lora_B.float() @ self.lora_A.float()) * self.scaling

    def merged(self) -> nn.Linear:
        """A plain nn.Linear with the update folded into its weight."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None)
        with torch.no_grad():
            linear.weight.copy_(self.weight.float() + self.delta_weight())
            if self.bias is not None:
                linear.bias.copy_(self.bias)
        return linear.to(self.weight.dtype)


# ---- applying, freezing, merging --------------------------------------------------------------------------
def matches(name: str, targets: Iterable[str]) -> bool:
    """Whether module `name` is one of `targets` (exact name or dotted suffix)."""
    return any(name == t or name.endswith("." + t) for t in targets)


def apply_lora(model: nn.Module, config: LoRAConfig) -> list[str]:
    """Replace the targeted encoder linears of `model` by LoRALinear, freeze the rest; returns the names.

    Trainable afterwards: the LoRA factors, the heads (`classifier`, `qa_outputs`), `config.extra_modules`,
    and LayerNorms / encoder biases as the config says.
    """
    replaced = []
    for name, module in list(model.named_modules()):
        if ".encoder." not in f".{name}" or not isinstance(module, nn.Linear) or isinstance(module, LoRALinear):
            continue
        if matches(name, config.target_modules):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            adapted = LoRALinear(module, config.rank, config.alpha, config.dropout)
            setattr(parent, child, adapted.train(module.training))
            replaced.append(name)
    if not replaced:
        raise ValueError(f"no encoder linear layer matches the LoRA targets {list(config.target_modules)}")
    mark_trainable(model, config)
    return replaced


def mark_trainable(model: nn.Module, config: LoRAConfig) -> None:
    """Freeze every parameter except those a LoRA run trains (see `apply_lora`)."""
    trained_modules = (*HEAD_MODULES, *config.extra_modules)
    for name, parameter in model.named_parameters():
        module_name, _, leaf = name.rpartition(".")
        parameter.requires_grad = (
            leaf in ("lora_A", "lora_B")
            or any(module_name == m or module_name.startswith(m + ".") for m in trained_modules)
            or (config.train_layernorm and "LayerNorm" in module_name)
            or (config.train_bias and leaf == "bias" and ".encoder." in f".{module_name}")
        )


def merge_lora(model: nn.Module) -> int:
    """Fold every LoRA update into its weight, in place (for export); returns how many layers were merged."""
    count = 0
    for name, module in list(model.named_modules()):
        if isinstance(module, LoRALinear):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, module.merged().train(module.training))
            count += 1
    return count


def trainable_parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# ---- composite folders ----------------------------------------------------------------------------------
def save_composite(
    model: nn.Module,
    folder: str | Path,
    base_model: str,
    base_state: dict[str, torch.Tensor],
    lora: LoRAConfig | None,
    dtype: torch.dtype = torch.float16,
    extra_meta: dict[str, Any] | None = None,
) -> Path:
    """Write config.json + adapter.safetensors: only what differs from `base_state` (the base's weights).

    The model may still hold LoRALinear layers (their factors are stored) or be merged/fully trained (then only
    trainable, non-encoder-matrix parameters are stored as deltas, which is what keeps the folder small).
    """
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    tensors = composite_tensors(model, base_state, dtype)
    config: BertConfig = model.config  # type: ignore[assignment]
    meta = {
        "base_model": base_model,
        "adapter": {"file": ADAPTER_FILE, "lora": lora.to_dict() if lora else None},
        "dtype": str(dtype).removeprefix("torch."),
        **(extra_meta or {}),
    }
    config = config.replace(extra={**config.extra, META_KEY: meta})
    config.save(target, architecture=getattr(model, "architecture", type(model).__name__))
    save_file(tensors, str(target / ADAPTER_FILE), metadata={"format": "pt", "base_model": base_model})
    return target


def composite_tensors(
    model: nn.Module, base_state: dict[str, torch.Tensor], dtype: torch.dtype = torch.float16
) -> dict[str, torch.Tensor]:
    """LoRA factors, deltas of trained base parameters and values of new ones, cast to `dtype`. `base_state` is
    under our names (`base_state_dict`), with or without the `bert.` prefix."""
    base = {_bare(k): v for k, v in base_state.items()}
    tensors: dict[str, torch.Tensor] = {}
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        value = parameter.detach().float()
        if name.endswith(LORA_SUFFIXES):
            tensors[name] = value.to(dtype).contiguous()
        elif _bare(name) in base:
            tensors[DELTA_PREFIX + name] = (value - base[_bare(name)].float()).to(dtype).contiguous()
        else:
            tensors[name] = value.to(dtype).contiguous()
    if not tensors:
        raise ValueError("the model has no trainable parameters to store")
    return tensors


def load_composite_state(folder: str | Path, config: BertConfig) -> dict[str, torch.Tensor]:
    """The full float32 state dict of a composite folder: base + merged LoRA updates + deltas + head."""
    source = Path(folder)
    meta = config.extra.get(META_KEY) or {}
    base_name = meta.get("base_model")
    if not base_name:
        raise ValueError(f"{source}/config.json has no {META_KEY}.base_model: it is not a composite folder")
    base_folder = _base_folder(source, str(base_name))
    _check_base_config(base_folder, config, source)
    state = base_state_dict(base_folder)
    adapter = (meta.get("adapter") or {}).get("file", ADAPTER_FILE)
    stored = _read_adapter(source / adapter)
    lora = (meta.get("adapter") or {}).get("lora") or {}
    scaling = float(lora.get("alpha", 1.0)) / float(lora.get("rank", 1)) if lora else 1.0
    for key, value in stored.items():
        if key.endswith(".lora_A"):
            module = _bare(key.removesuffix(".lora_A"))
            factor_b = stored[key.removesuffix("_A") + "_B"].float()
            state[module + ".weight"] = state[module + ".weight"] + (factor_b @ value.float()) * scaling
        elif key.startswith(DELTA_PREFIX):
            name = _bare(key.removeprefix(DELTA_PREFIX))
            if name not in state:
                raise ValueError(f"{source}: delta for {name!r}, which the base model {base_name!r} lacks")
            state[name] = state[name] + value.float()
        elif not key.endswith(".lora_B"):
            state[_bare(key)] = value.float()
    return state


def base_state_dict(folder: Path, config: BertConfig | None = None) -> dict[str, torch.Tensor]:
    """The float32 weights of a base model folder under our names without the `bert.` prefix: a plain checkpoint
    of any family (read with the names of its own head, so that e.g. DistilBERT's `pre_classifier` is our
    `classifier.dense`), or a composite over its own base."""
    config = config or BertConfig.load(folder)
    meta = config.extra.get(META_KEY)
    if isinstance(meta, dict) and meta.get("base_model"):
        return load_composite_state(folder, config)
    state = to_our_names(read_state_dict(folder), config.model_type, _head_suffix(folder, config))
    return {_bare(k): v.float() for k, v in state.items()}


def _head_suffix(folder: Path, config: BertConfig) -> str:
    """The head part of the architecture config.json names (`ForMaskedLM`), `Model` when it names none."""
    architectures = json.loads((folder / "config.json").read_text()).get("architectures") or []
    prefix = config.family.class_prefix
    first = architectures[0] if isinstance(architectures, list) and architectures else None
    if isinstance(first, str) and first.startswith(prefix):
        return first.removeprefix(prefix)
    return "Model"


def _read_adapter(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise FileNotFoundError(f"composite model file {path} is missing")
    tensors = load_file(str(path))
    for key in tensors:
        if key.endswith(".lora_A") and key.removesuffix("_A") + "_B" not in tensors:
            raise ValueError(f"{path}: {key} has no matching lora_B")
    return tensors


def _base_folder(source: Path, base_name: str) -> Path:
    relative = source / base_name
    if relative.is_dir() and (relative / "config.json").is_file():
        return relative.resolve()
    folder = resolve_model_path(base_name)
    if folder == source.resolve():
        raise ValueError(f"{source}: a composite cannot be its own base model")
    return folder


def _check_base_config(base_folder: Path, config: BertConfig, source: Path) -> None:
    base = BertConfig.load(base_folder)
    for name in _SHAPE_FIELDS:
        if getattr(base, name) != getattr(config, name):
            mine, theirs = getattr(config, name), getattr(base, name)
            raise ValueError(f"{source}: {name} is {mine} but the base model {base_folder} has {theirs}")


def _bare(key: str) -> str:
    """Parameter name without the task models' `bert.` prefix (base checkpoints often lack it)."""
    return key.removeprefix("bert.")


def lora_config_from_args(
    rank: int, alpha: float, targets: Sequence[str], dropout: float = 0.05, **flags: Any
) -> LoRAConfig:
    """A LoRAConfig from command-line style values (targets may be comma-separated strings)."""
    names = tuple(t.strip() for item in targets for t in item.split(",") if t.strip())
    return LoRAConfig(rank=rank, alpha=alpha, dropout=dropout, target_modules=names, **flags)
