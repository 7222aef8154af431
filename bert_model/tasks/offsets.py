"""Character offsets that keep grapheme clusters whole: a token's span never ends between a base character and the
marks that belong to it.

A tokenizer that strips accents (BERT uncased: NFD, then combining marks dropped) maps "Bogota" + U+0301 to the
token "bogota", whose offsets end before the accent; an emoji sequence can end in a variation selector or a skin
tone no token covers. An answer or an entity cut there would lose the last character's marks. `whole_clusters`
widens each span over what extends a cluster: combining marks (categories Mn, Mc, Me), variation
selectors, emoji modifiers and tags, and a zero-width joiner with the character it joins. This follows the
extending characters of Unicode's extended grapheme clusters (UAX #29: Extend, SpacingMark, ZWJ) without a
segmentation library. Each distinct character of a text is judged once, and a text without extending characters
(every ASCII text, most others) has its spans returned as they are. Torch-free.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

ZERO_WIDTH_JOINER = "\u200d"
MARK_CATEGORIES = frozenset({"Mn", "Mc", "Me"})
EXTENDING_RANGES = ((0xFE00, 0xFE0F), (0x1F3FB, 0x1F3FF), (0xE0020, 0xE007F), (0xE0100, 0xE01EF))
"""Variation selectors, emoji skin-tone modifiers, tag characters, variation selectors supplement."""


def extends_cluster(character: str) -> bool:
    """Whether `character` belongs to the grapheme cluster of the character before it."""
    if unicodedata.category(character) in MARK_CATEGORIES:
        return True
    point = ord(character)
    return any(low <= point <= high for low, high in EXTENDING_RANGES)


def cluster_end(text: str, end: int, extending: frozenset[str]) -> int:
    """`end` moved past the characters that extend the cluster ending at `end - 1` (`extending`: those of `text`)."""
    while end < len(text):
        if text[end] == ZERO_WIDTH_JOINER:
            end = min(end + 2, len(text))  # the joiner and the character it joins on
        elif text[end] in extending:
            end += 1
        else:
            break
    return end


def cluster_start(text: str, start: int, extending: frozenset[str]) -> int:
    """`start` moved back to the base character of the cluster it falls in (`extending`: those of `text`)."""
    while 0 < start < len(text) and (text[start] in extending or text[start - 1] == ZERO_WIDTH_JOINER):
        start -= 1
    return start


def extending_characters(text: str) -> frozenset[str]:
    """The characters of `text` that extend the cluster before them: judged once per distinct character, so that a
    per-token check is a set lookup."""
    if text.isascii():
        return frozenset()
    return frozenset(c for c in set(text) if extends_cluster(c))


def whole_clusters(text: str, offsets: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """`offsets` (character spans into `text`; (0, 0) for special tokens) with every non-empty span widened to
    whole grapheme clusters: its end past the marks of its last character, its start back to its first character's
    base (a tokenizer that keeps a mark as a token of its own starts one on it)."""
    extending = extending_characters(text)
    if not extending and ZERO_WIDTH_JOINER not in text:
        return [(int(s), int(e)) for s, e in offsets]
    return [
        (cluster_start(text, s, extending), cluster_end(text, e, extending)) if e > s else (int(s), int(e))
        for s, e in offsets
    ]
