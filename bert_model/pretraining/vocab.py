"""Train a WordPiece vocabulary on a corpus with the Hugging Face `tokenizers` library (never hand-written).

The pipeline is BERT's (Devlin et al. 2019, appendix A.2; Wu et al. 2016 for WordPiece): BertNormalizer
(lower-casing by default) -> BertPreTokenizer -> WordPiece with the `##` continuation prefix. The five special
tokens come first, so [PAD] has id 0 like every BERT config expects. The result is saved as a tokenizer folder
(vocab.txt, tokenizer.json, tokenizer_config.json) that `BertTokenizer.from_pretrained` loads.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from tokenizers import Tokenizer, normalizers, pre_tokenizers
from tokenizers.models import WordPiece
from tokenizers.trainers import WordPieceTrainer

from bert_model.pretraining.corpus import CorpusFormat, iter_documents
from bert_model.tokenization import SPECIAL_TOKENS, BertTokenizer, build_wordpiece

MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + 1


def train_wordpiece(
    corpus: Sequence[str | Path],
    vocab_size: int,
    *,
    lowercase: bool = True,
    min_frequency: int = 2,
    corpus_format: CorpusFormat = "auto",
    model_max_length: int = 512,
) -> BertTokenizer:
    """A BERT tokenizer whose WordPiece vocabulary (at most `vocab_size` tokens) is learned from `corpus`."""
    if not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"vocabulary size must be an integer of at least {MIN_VOCAB_SIZE}, got {vocab_size!r}")
    if min_frequency < 1:
        raise ValueError(f"min_frequency must be at least 1, got {min_frequency}")
    sentences = _sentences(corpus, corpus_format)
    first = next(sentences, None)
    if first is None:
        raise ValueError(f"the corpus {[str(p) for p in corpus]} holds no text to learn a vocabulary from")
    trainer_tokenizer = Tokenizer(WordPiece(unk_token="[UNK]"))
    trainer_tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )
    trainer_tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        continuing_subword_prefix="##",
        show_progress=False,
    )
    trainer_tokenizer.train_from_iterator(_chain(first, sentences), trainer=trainer)
    vocab = trainer_tokenizer.get_vocab()
    return BertTokenizer(build_wordpiece(vocab, lowercase), lowercase, model_max_length)


def _sentences(corpus: Sequence[str | Path], corpus_format: CorpusFormat) -> Iterator[str]:
    for document in iter_documents(corpus, corpus_format):
        yield from document.sentences


def _chain(first: str, rest: Iterator[str]) -> Iterator[str]:
    yield first
    yield from rest
