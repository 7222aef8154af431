"""The model a pretraining run starts from: a fresh `BertForPreTraining` sized by a preset or config.json, or a
checkpoint to continue (domain-adaptive pretraining, Gururangan et al. 2020), checked against the data first.

A fresh model takes its vocabulary size and [PAD] id from the data's tokenizer. `--init` keeps the checkpoint's
encoder; heads absent from it (MiniLM ships none) start fresh, and the MLM decoder stays tied to the word
embeddings. In both cases the data's `max_seq_length` must fit the model's position embeddings, and the data's
vocabulary must be the model's. A fresh model may start its (learned) position embeddings from sinusoids
instead of noise (`position_init="sinusoidal"`, see `sinusoidal_positions_`), and its attention from W_k = W_q
(`attention_init="mimetic"`) or with layer 0 reading the neighbouring tokens (`attention_init="local"`, see
local_attention.py).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

from bert_model.config import PRESETS, BertConfig
from bert_model.heads import BertForPreTraining
from bert_model.modeling import BertSelfAttention
from bert_model.pretraining.local_attention import local_attention_
from bert_model.pretraining.shards import DataMeta
from bert_model.tokenization import BertTokenizer

logger = logging.getLogger(__name__)

POSITION_INITS = ("normal", "sinusoidal")
ATTENTION_INITS = ("normal", "mimetic", "local")
MIMETIC_SELF_LOGIT = 4.0
"""Attention logit that `mimetic_attention_` gives a token's query against its own key, on average."""


@torch.no_grad()
def sinusoidal_positions_(weight: torch.Tensor, std: float) -> torch.Tensor:
    """Overwrite a (positions, H) embedding with the sinusoids of Vaswani et al. (2017), section 3.5, scaled to
    root-mean-square `std` (the scale of BERT's other embeddings). The embedding stays learned; only its
    starting point changes: nearby positions start out similar, so attention to neighbouring tokens, which
    masked LM needs first, has a consistent gradient from the first step."""
    positions, hidden = weight.shape
    position = torch.arange(positions, dtype=torch.float64)[:, None]
    frequency = torch.exp(torch.arange(0, hidden, 2, dtype=torch.float64) * (-math.log(10000.0) / hidden))
    table = torch.zeros(positions, hidden, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency)[:, : hidden // 2]
    weight.copy_((table * std * math.sqrt(2.0)).to(weight.dtype))  # sin/cos have RMS 1/sqrt(2)
    return weight


@torch.no_grad()
def mimetic_attention_(model: BertForPreTraining, self_logit: float = MIMETIC_SELF_LOGIT) -> None:
    """Start every layer with W_k = W_q, so that q_i . k_j = (W x_i) . (W x_j) is a positive multiple of the
    similarity of x_i and x_j: the "mimetic" start of Trockman & Kolter (2023, "Mimetic Initialization of
    Self-Attention Layers"), W_q W_k^T near a multiple of the identity. Each token first attends to tokens like
    itself and, with sinusoidal positions, to its neighbours, which is where masked LM's signal is, instead of
    uniformly to all. Weights stay N(0, std), with the std chosen so that a token's logit against itself
    (x . x = hidden_size after LayerNorm) is `self_logit`."""
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    std = math.sqrt(self_logit * math.sqrt(head_dim) / (head_dim * config.hidden_size))
    for attention in model.modules():
        if isinstance(attention, BertSelfAttention):
            attention.query.weight.normal_(0.0, std)
            attention.key.weight.copy_(attention.query.weight)


@torch.no_grad()
def unigram_mlm_bias_(model: BertForPreTraining, counts: np.ndarray, special_ids: Iterable[int]) -> None:
    """Start the MLM decoder's bias at the log frequency of each token in the training text (add-one smoothed;
    special tokens, never a target, at the smallest value): the initial prediction is the unigram prior instead
    of uniform ("initialise the final layer's bias to the log prior", standard practice for imbalanced classes:
    Adam moves each bias by about the learning rate per step, and the log frequencies span more than 10 nats)."""
    bias = model.cls.predictions.bias
    if counts.shape != (bias.numel(),):
        raise ValueError(f"token counts cover {counts.shape[0]} ids but the vocabulary has {bias.numel()}")
    smoothed = counts.astype(np.float64) + 1.0
    log_prior = np.log(smoothed / smoothed.sum())
    specials = list(special_ids)
    log_prior[specials] = log_prior.min()
    bias.copy_(torch.from_numpy(log_prior - log_prior.mean()).to(bias.dtype))


def resolve_config(config: str, tokenizer: BertTokenizer) -> BertConfig:
    """A preset name or a config.json path; presets take the tokenizer's vocabulary size and [PAD] id."""
    if config in PRESETS:
        return BertConfig.preset(config, vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id)
    path = Path(config)
    if not path.exists():
        raise FileNotFoundError(f"--config {config!r} is neither a preset ({', '.join(PRESETS)}) nor a config file")
    loaded = BertConfig.load(path)
    if loaded.vocab_size != tokenizer.vocab_size:
        raise ValueError(
            f"{path} has vocab_size {loaded.vocab_size} but the data's tokenizer has {tokenizer.vocab_size} tokens"
        )
    return loaded


def build_model(
    meta: DataMeta,
    tokenizer: BertTokenizer,
    config: str | None = None,
    init: str | None = None,
    dropout: float | None = None,
    position_init: str = "normal",
    attention_init: str = "normal",
    token_counts: np.ndarray | None = None,
) -> BertForPreTraining:
    """A `BertForPreTraining` in train mode, fresh (`config`) or continued (`init`), checked against the data."""
    _check_starts(init, position_init, attention_init, token_counts)
    if init is not None:
        model = _continued(init, tokenizer)
    elif config is not None:
        model = BertForPreTraining(_with_dropout(resolve_config(config, tokenizer), dropout))
        _fresh_start_(model, meta, position_init, attention_init, token_counts)
    else:
        raise ValueError("give a config (preset or config.json) or an init checkpoint")
    if init is not None and dropout is not None:
        model = _redropout(model, dropout)
    check_compatible(model.config, meta)
    model.train()
    return model


def _check_starts(init: str | None, position_init: str, attention_init: str, token_counts: np.ndarray | None) -> None:
    if position_init not in POSITION_INITS:
        raise ValueError(f"position_init must be one of {POSITION_INITS}, got {position_init!r}")
    if attention_init not in ATTENTION_INITS:
        raise ValueError(f"attention_init must be one of {ATTENTION_INITS}, got {attention_init!r}")
    if attention_init == "local" and position_init != "normal":
        raise ValueError(
            "attention_init 'local' lays out the position embeddings itself: leave position_init at 'normal'"
        )
    if init is not None and (position_init != "normal" or attention_init != "normal" or token_counts is not None):
        raise ValueError(
            "position, attention and MLM-bias initialisations apply to models trained from scratch (--config), "
            "not to --init"
        )


def _fresh_start_(
    model: BertForPreTraining,
    meta: DataMeta,
    position_init: str,
    attention_init: str,
    token_counts: np.ndarray | None,
) -> None:
    """Apply the chosen starts to a freshly built model (BERT's initialisation where none is chosen)."""
    if position_init == "sinusoidal":
        sinusoidal_positions_(model.bert.embeddings.position_embeddings.weight, model.config.initializer_range)
    if attention_init == "mimetic":
        mimetic_attention_(model)
    elif attention_init == "local":
        local_attention_(model)
    if token_counts is not None:
        unigram_mlm_bias_(model, token_counts, meta.special_ids.values())


def check_compatible(config: BertConfig, meta: DataMeta) -> None:
    """The data must fit the model: sequence length within its positions, the same vocabulary size."""
    if meta.max_seq_length > config.max_position_embeddings:
        raise ValueError(
            f"the data's max_seq_length {meta.max_seq_length} is above the model's max_position_embeddings "
            f"{config.max_position_embeddings}: recreate the data with --max-seq-length "
            f"{config.max_position_embeddings} or less"
        )
    if meta.vocab_size != config.vocab_size:
        raise ValueError(f"the data has {meta.vocab_size} token ids but the model's vocabulary has {config.vocab_size}")


def _continued(init: str, tokenizer: BertTokenizer) -> BertForPreTraining:
    model = BertForPreTraining.from_pretrained(init)
    model_tokenizer = BertTokenizer.from_pretrained(init)
    if model_tokenizer.backend.get_vocab() != tokenizer.backend.get_vocab():
        raise ValueError(
            f"the data was tokenized with another vocabulary than {init!r}: rerun pretrain-data with --tokenizer {init}"
        )
    report = model.load_report
    if report is not None and report.missing_head_keys:
        logger.info("fresh pretraining heads (not in %s): %s", init, report.missing_head_keys)
    return model


def _with_dropout(config: BertConfig, dropout: float | None) -> BertConfig:
    if dropout is None:
        return config
    return config.replace(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)


def _redropout(model: BertForPreTraining, dropout: float) -> BertForPreTraining:
    fresh = BertForPreTraining(_with_dropout(model.config, dropout))
    fresh.load_state_dict(model.state_dict())
    fresh.load_report = model.load_report
    return fresh
