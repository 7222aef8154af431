"""The BERT encoder: embeddings -> bidirectional transformer layers -> pooler, for the whole BERT family.

Reference: Devlin et al. (2019), "BERT", section 3 and figure 2 (input = token + segment + position
embeddings). Submodule names follow Hugging Face's `modeling_bert` so that checkpoint import is a loop of
shape-checked copies (see checkpoint.py; weights.py maps the other families' names onto these). The families
are configurations of this one encoder (`BertConfig.family`): RoBERTa's positions start past the padding index
and skip padding, DistilBERT has no token types and no pooler, ELECTRA and ALBERT embed at `embedding_size` and
project to the hidden size, ALBERT applies one shared layer `num_hidden_layers` times.
Shapes: B = batch, S = sequence length, E = embedding size, H = hidden size, N = attention heads, D = H / N.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from bert_model.checkpoint import PreTrainedMixin
from bert_model.config import BertConfig


def activation(name: str) -> nn.Module:
    """The activation module that config.hidden_act names."""
    table: dict[str, nn.Module] = {
        "gelu": nn.GELU(),
        "gelu_new": nn.GELU(approximate="tanh"),
        "gelu_pytorch_tanh": nn.GELU(approximate="tanh"),
        "relu": nn.ReLU(),
        "silu": nn.SiLU(),
        "tanh": nn.Tanh(),
    }
    return table[name]


def extended_attention_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, S) 1/0 mask -> (B, 1, 1, S) additive mask: 0 where attended, dtype-min where padded."""
    mask = attention_mask[:, None, None, :].to(dtype)
    return (1.0 - mask) * torch.finfo(dtype).min


def sinusoidal_table(positions: int, width: int) -> torch.Tensor:
    """(P, E) table: sin(p / 10000^(2i/E)) in even columns 2i, cos of the same angle in odd columns 2i + 1."""
    exponents = 2 * torch.floor(torch.arange(width, dtype=torch.float64) / 2) / width  # (E,)
    angles = torch.arange(positions, dtype=torch.float64)[:, None] / torch.pow(10000.0, exponents)  # (P, E)
    table = torch.empty_like(angles)
    table[:, 0::2] = torch.sin(angles[:, 0::2])
    table[:, 1::2] = torch.cos(angles[:, 1::2])
    return table.float()


@dataclass
class BertModelOutput:
    last_hidden_state: torch.Tensor
    """(B, S, H) the final layer's hidden states."""
    pooler_output: torch.Tensor | None
    """(B, H) tanh(dense([CLS])), or None when the model has no pooler."""


class BertEmbeddings(nn.Module):
    """Word + token-type + position embeddings, then LayerNorm and dropout: (B, S) ids -> (B, S, E).

    Positions count 0, 1, ... (BERT), or from pad_token_id + 1 over the non-padding tokens with padding at
    pad_token_id (RoBERTa): computed from `input_ids != pad_token_id` inside forward, so that an exported graph
    computes them too. Without token types (DistilBERT) `token_type_ids` is ignored.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        width = config.embedding_width
        self.word_embeddings = nn.Embedding(config.vocab_size, width, padding_idx=config.pad_token_id)
        position_padding = config.pad_token_id if config.family.positions_after_padding else None
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, width, padding_idx=position_padding)
        self.token_type_embeddings = (
            nn.Embedding(config.type_vocab_size, width) if config.family.has_token_types else None
        )
        self.LayerNorm = nn.LayerNorm(width, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.padding_idx = position_padding
        self.sinusoidal = config.sinusoidal_pos_embds

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        embeddings = self.word_embeddings(input_ids)  # (B, S, E)
        if self.token_type_embeddings is not None:
            embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        embeddings = embeddings + self.position_embeddings(self.position_ids(input_ids))
        return self.dropout(self.LayerNorm(embeddings))

    def init_fixed_weights(self) -> None:
        """DistilBERT's sinusoidal positions (Vaswani et al., 2017, section 3.5) when the config asks for them."""
        if self.sinusoidal:
            with torch.no_grad():
                self.position_embeddings.weight.copy_(sinusoidal_table(*self.position_embeddings.weight.shape))

    def position_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(1, S) positions 0..S-1, or (B, S) RoBERTa positions: pad + 1, pad + 2, ... on tokens, pad on padding."""
        if self.padding_idx is None:
            return torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)  # (1, S)
        is_token = input_ids.ne(self.padding_idx).long()  # (B, S)
        return torch.cumsum(is_token, dim=1) * is_token + self.padding_idx  # (B, S)


class BertSelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention (SDPA kernel, or an explicit eager graph for export)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_prob = config.attention_probs_dropout_prob
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)
        self.implementation = config.attn_implementation

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq_len, _ = x.shape
        return x.view(batch, seq_len, self.num_heads, self.head_dim).transpose(1, 2)  # (B, N, S, D)

    def forward(self, hidden_states: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        batch, seq_len, hidden = hidden_states.shape
        query = self._split_heads(self.query(hidden_states))
        key = self._split_heads(self.key(hidden_states))
        value = self._split_heads(self.value(hidden_states))
        if self.implementation == "eager":
            context = self._eager(query, key, value, additive_mask)
        else:
            context = F.scaled_dot_product_attention(
                query,
                key,
                value,
                attn_mask=additive_mask.to(query.dtype),
                dropout_p=self.dropout_prob if self.training else 0.0,
            )  # (B, N, S, D)
        return context.transpose(1, 2).reshape(batch, seq_len, hidden)  # (B, S, H)

    def _eager(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, additive_mask: torch.Tensor
    ) -> torch.Tensor:
        # The same op sequence as Hugging Face's eager BERT attention, which ONNX Runtime's optimizer fuses.
        scores = torch.matmul(query, key.transpose(-1, -2)) * self.scaling  # (B, N, S, S)
        scores = scores + additive_mask
        probs = self.dropout(torch.softmax(scores, dim=-1))
        return torch.matmul(probs, value)  # (B, N, S, D)


class BertSelfOutput(nn.Module):
    """Projection of the attention context, dropout, residual add and LayerNorm."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, hidden_states: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(hidden_states, additive_mask), hidden_states)


class BertIntermediate(nn.Module):
    """First feed-forward projection, H -> intermediate_size, with the activation."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = activation(config.hidden_act)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.intermediate_act_fn(self.dense(hidden_states))


class BertOutput(nn.Module):
    """Second feed-forward projection back to H, dropout, residual add and LayerNorm."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + residual)


class BertLayer(nn.Module):
    """One post-LayerNorm transformer layer: attention block, then feed-forward block."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, hidden_states: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        attended = self.attention(hidden_states, additive_mask)
        return self.output(self.intermediate(attended), attended)


class BertEncoder(nn.Module):
    """`num_hidden_layers` transformer layers: distinct ones, or ALBERT's one shared layer applied each time."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        distinct = 1 if config.family.shares_layers else config.num_hidden_layers
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(distinct))
        self.num_hidden_layers = config.num_hidden_layers

    def forward(self, hidden_states: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        for depth in range(self.num_hidden_layers):
            hidden_states = self.layer[depth % len(self.layer)](hidden_states, additive_mask)
        return hidden_states


class BertPooler(nn.Module):
    """tanh(dense(h_[CLS])): the sentence representation used by NSP and classification."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(hidden_states[:, 0]))  # (B, H)


class BertModel(PreTrainedMixin, nn.Module):
    """The bare encoder of any family. `forward(input_ids, attention_mask=None, token_type_ids=None)`."""

    architecture_suffix: ClassVar[str] = "Model"

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.embeddings_project = (
            nn.Linear(config.embedding_width, config.hidden_size) if config.projects_embeddings else None
        )
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer and config.family.has_pooler else None
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> BertModelOutput:
        check_inputs(self.config, input_ids, attention_mask, token_type_ids)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        embeddings = self.embeddings(input_ids, token_type_ids)  # (B, S, E)
        if self.embeddings_project is not None:
            embeddings = self.embeddings_project(embeddings)  # (B, S, H)
        additive_mask = extended_attention_mask(attention_mask, embeddings.dtype)  # (B, 1, 1, S)
        hidden_states = self.encoder(embeddings, additive_mask)
        pooled = self.pooler(hidden_states) if self.pooler is not None else None
        return BertModelOutput(last_hidden_state=hidden_states, pooler_output=pooled)

    def set_attn_implementation(self, implementation: str) -> None:
        """Switch every layer between `sdpa` and `eager` attention (weights unchanged)."""
        self.config = self.config.replace(attn_implementation=implementation)
        for module in self.modules():
            if isinstance(module, BertSelfAttention):
                module.implementation = implementation


def check_inputs(
    config: BertConfig,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    token_type_ids: torch.Tensor | None,
) -> None:
    """Raise ValueError on inputs the model cannot take (shape, length, id range)."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must have shape (batch, sequence), got {tuple(input_ids.shape)}")
    seq_len = input_ids.shape[1]
    if seq_len > config.max_sequence_length:
        raise ValueError(
            f"input has {seq_len} tokens but the model accepts at most {config.max_sequence_length}: truncate the input"
        )
    for name, tensor in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
        if tensor is not None and tensor.shape != input_ids.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, input_ids has {tuple(input_ids.shape)}")
    if torch.jit.is_tracing() or torch.compiler.is_compiling():
        return
    if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= config.vocab_size):
        raise ValueError(f"input_ids must lie in [0, {config.vocab_size}); got ids outside that range")
    if not config.family.has_token_types or token_type_ids is None or not token_type_ids.numel():
        return  # a family without token types ignores them
    if int(token_type_ids.max()) >= config.type_vocab_size:
        raise ValueError(f"token_type_ids must be < type_vocab_size ({config.type_vocab_size})")
