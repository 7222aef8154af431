"""A fresh model whose first layer starts out reading the neighbouring tokens (`--attention-init local`).

Why: a BERT trained from scratch sits on a plateau, predicting masked tokens from the unigram distribution, until
its attention finds the neighbouring tokens, where most of masked LM's signal is; starting layer 0 on them takes
that search out of a short run (docs/pretraining.md has the measurements).

What: only the starting weights change; the architecture is BERT's and the checkpoint loads in Hugging Face.
1. Positions get their own subspace: the first `head_dim` hidden dimensions of the (learned) position table start
   as sinusoids of `head_dim / 2` frequencies spaced linearly from 2.8 radians per position (below pi, so that
   adjacent positions are told apart) down to 0.05 (one period over the 128-token window), and the word and
   segment embeddings start at zero there (they keep BERT's N(0, 0.02) elsewhere). After the embedding
   LayerNorm a position is then readable without noise from the token at it.
2. In layer 0, head h of the first four starts with W_q projecting onto those dimensions and W_k = R(o_h) W_q,
   where R(o) rotates each frequency's (sin, cos) pair by o positions: the logit q_i . k_j is
   sum_f cos(w_f (i + o_h - j)), largest at j = i + o_h. The heads attend to the tokens at offsets -1, +1, -2, +2
   (more than 99.9% of their weight on real text at the start); their values, output projection and every
   other weight keep BERT's initialisation, and all of it is trained.

This is in the spirit of Trockman & Kolter (2023, "Mimetic Initialization of Self-Attention Layers"), whose
W_k = W_q start (`--attention-init mimetic`) makes heads attend to similar tokens, and of the fixed local
attention heads that trained models show (Clark et al. 2019, "What Does BERT Look At?": previous / next-token
heads).
"""

from __future__ import annotations

import math

import torch

from bert_model.heads import BertForPreTraining
from bert_model.modeling import BertLayer

LOCAL_OFFSETS = (-1, 1, -2, 2)
"""Relative positions that the first heads of layer 0 start attending to (previous, next, two back, two ahead)."""
HIGHEST_FREQUENCY = 2.8
"""Radians per position of the fastest sinusoid: below pi (one sample per position), so that it does not alias."""
LOWEST_FREQUENCY = 0.05
"""Radians per position of the slowest sinusoid: one period over about 126 positions."""
POSITION_SHARE = 1 / 3
"""Share of the embedding's variance that the position sinusoids start with (words and segments: the rest)."""
SHARPNESS = 1.5
"""Scale of W_q and W_k on the position dimensions: the attention logit of the target offset is about
SHARPNESS^2 * head_dim / 2 * (position amplitude after LayerNorm)^2 / sqrt(head_dim) above a distant token's."""


@torch.no_grad()
def local_attention_(model: BertForPreTraining, offsets: tuple[int, ...] = LOCAL_OFFSETS) -> None:
    """Lay out positions in their own subspace and point layer 0's first heads at fixed relative offsets (see the
    module docstring). Needs a fresh model with at least two heads (one head's width holds the positions)."""
    config = model.config
    hidden, heads = config.hidden_size, config.num_attention_heads
    head_dim = hidden // heads
    if heads < 2 or head_dim < 2:
        raise ValueError(
            f"attention_init 'local' needs at least 2 attention heads of 2+ dimensions "
            f"(this model: {heads} of {head_dim}): one head's width holds the positions"
        )
    embeddings = model.bert.embeddings
    frequencies = torch.linspace(HIGHEST_FREQUENCY, LOWEST_FREQUENCY, head_dim // 2, dtype=torch.float64)
    positions = torch.arange(config.max_position_embeddings, dtype=torch.float64)[:, None] * frequencies
    std = config.initializer_range
    # Variance budget: the word embedding's (hidden - head_dim) dims at std^2 each, the sinusoids (amplitude a,
    # mean square a^2 / 2 over head_dim dims) POSITION_SHARE of the total.
    word_variance = (hidden - head_dim) * std**2
    amplitude = math.sqrt(POSITION_SHARE / (1 - POSITION_SHARE) * word_variance * 2 / head_dim)
    table = torch.zeros(config.max_position_embeddings, hidden, dtype=torch.float64)
    table[:, 0:head_dim:2] = torch.sin(positions)
    table[:, 1:head_dim:2] = torch.cos(positions)
    embeddings.position_embeddings.weight.copy_(table * amplitude)
    embeddings.word_embeddings.weight[:, :head_dim] = 0.0
    assert embeddings.token_type_embeddings is not None  # pretraining builds BERT, which has token types
    embeddings.token_type_embeddings.weight[:, :head_dim] = 0.0

    first_layer = model.bert.encoder.layer[0]
    assert isinstance(first_layer, BertLayer)
    attention = first_layer.attention.self
    for head, offset in enumerate(offsets[:heads]):
        query, key = _offset_projections(frequencies, offset, hidden)
        rows = slice(head * head_dim, (head + 1) * head_dim)
        attention.query.weight[rows] = (SHARPNESS * query).to(attention.query.weight.dtype)
        attention.key.weight[rows] = (SHARPNESS * key).to(attention.key.weight.dtype)
        attention.query.bias[rows] = 0.0
        attention.key.bias[rows] = 0.0


def _offset_projections(frequencies: torch.Tensor, offset: int, hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(head_dim, hidden) W_q reading the (sin wi, cos wi) pair of every frequency w, and W_k reading the same
    pairs shifted back by `offset` positions, (sin w(j - o), cos w(j - o)): then q_i . k_j = sum over w of
    cos(w(i - j + o)), largest at j = i + o."""
    pairs = frequencies.numel()
    query = torch.zeros(2 * pairs, hidden, dtype=torch.float64)
    key = torch.zeros(2 * pairs, hidden, dtype=torch.float64)
    for pair, frequency in enumerate(frequencies.tolist()):
        sin, cos = 2 * pair, 2 * pair + 1
        c, s = math.cos(frequency * offset), math.sin(frequency * offset)
        query[sin, sin] = query[cos, cos] = 1.0
        key[sin, sin], key[sin, cos] = c, -s
        key[cos, sin], key[cos, cos] = s, c
    return query, key
