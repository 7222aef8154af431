"""Real sentences from ../shared/data for parity tests: SST-2 sentences, SQuAD contexts and questions, CoNLL."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path


def sst2_sentences(data_dir: Path, limit: int | None = None) -> list[str]:
    with open(data_dir / "sst2" / "dev.half-a.tsv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [row["sentence"] for row in rows][:limit]


def squad_pairs(data_dir: Path, limit: int) -> list[tuple[str, str]]:
    """(question, context) pairs, one per paragraph, in file order."""
    data = json.loads((data_dir / "squad_v1.1" / "dev-v1.1.half-a.json").read_text(encoding="utf-8"))
    pairs = []
    for article in data["data"]:
        for paragraph in article["paragraphs"]:
            pairs.append((paragraph["qas"][0]["question"], paragraph["context"]))
            if len(pairs) == limit:
                return pairs
    return pairs


def conll_sentences(data_dir: Path, limit: int) -> list[str]:
    sentences: list[str] = []
    words: list[str] = []
    with gzip.open(data_dir / "conll2003" / "iob2" / "train.txt.gz", "rt", encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if not line or line.startswith("-DOCSTART-"):
                if words:
                    sentences.append(" ".join(words))
                    words = []
                    if len(sentences) == limit:
                        break
                continue
            words.append(line.split()[0])
    return sentences


# Accents, punctuation, control and unknown characters, CJK, emoji, combining marks, odd whitespace.
TRICKY = [
    "Café Zürich: naïve coöperation, façade — résumé!",
    "Ünïcödé ÄÖÜ ß Ø Œ ǅ ﬁ ligature",
    "emoji 😀🚀 and symbols ☃ ♥ ✓ ∑ ∞",
    "日本語のテキスト 中文 한국어",
    "tabs\tand\nnewlines  and\u00a0nbsp\u2003em-space",
    "control\u0000chars\u0007here\u200bzero-width",
    "don't can't won't it's O'Neill's",
    "e-mail: someone@example.com, url https://x.y/z?q=1&r=2",
    "numbers 3.14159 1,000,000 -42 +7 1e-5 $5 €10 £3",
    "combining e\u0301 a\u0300 n\u0303 vs é à ñ",
    '((nested [brackets] {braces})) <angle> "quotes" «guillemets»',
    "ALLCAPS MiXeD cAsE",
    "a" * 150 + " very long word",
    "Straße ΣΊΣΥΦΟΣ ελληνικά русский текст",
    "",
]
