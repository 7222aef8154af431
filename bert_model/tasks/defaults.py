"""Task defaults, defined once: training, evaluation, the export's guards, serving (REST schemas, the gRPC mapping,
a bundle without its own settings) and the load tests' peers all read them from here.

QA windows follow Devlin et al. (2019) and Hugging Face's `run_qa.py`: 384-token windows sharing 128 context
tokens, questions cut to 64 tokens, answers of at most 30 tokens. NER windows share 32 tokens of a long text.
Aggregation strategies are Hugging Face's token-classification pipeline's. Torch-free.
"""

from __future__ import annotations

from typing import Literal, get_args

QA_MAX_SEQ_LENGTH = 384
"""Tokens per QA window, specials included."""
QA_DOC_STRIDE = 128
"""Context tokens shared by consecutive QA windows."""
QA_MAX_QUERY_LENGTH = 64
"""Question tokens kept (longer questions are cut)."""
QA_MAX_ANSWER_LENGTH = 15
"""Longest answer span, in tokens: what training evaluates with, what the default QA model is served with, and what a
bundle without its own setting is served with. Longer spans let more wrong long answers win over the short right
ones of SQuAD (docs/quality.md has the served F1 / EM of both lengths)."""
QA_TOP_K = 1
"""Answers per question."""

NER_MAX_SEQ_LENGTH = 128
"""Tokens per NER window, specials included."""
NER_STRIDE = 32
"""Tokens shared by consecutive windows of a long text."""

AggregationStrategy = Literal["none", "simple", "first", "average", "max"]
AGGREGATION_STRATEGIES: tuple[AggregationStrategy, ...] = get_args(AggregationStrategy)
"""How token predictions become entities (Hugging Face's `aggregation_strategy`), `none` = one entry per token."""
NER_AGGREGATION: AggregationStrategy = "simple"

CLASSIFY_TOP_K = 1
"""Labels per input."""
FILL_MASK_TOP_K = 5
"""Fills per mask token."""
