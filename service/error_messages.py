"""Error messages cut to a size a front door can carry: messages quote what the caller sent (a model name, a
fill-mask target), so a long value would otherwise come back whole in the answer.

The size is counted in gRPC wire bytes (grpc-message is percent-encoded: 3 bytes per byte outside printable
ASCII), which bounds the UTF-8 size of the same text in a JSON body as well. A message that does not fit keeps its
start and its end (where the messages name what exists: 'loaded: ...') around the number of characters cut.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

CUT_MARK = " ... [{} characters cut] ... "


def clip_message(message: str, limit: int) -> str:
    """`message` unchanged when it fits in `limit` wire bytes, else its start and end around the count cut."""
    if len(message) * 12 <= limit or _fits(message, limit):
        return message
    room = limit - len(CUT_MARK) - 12
    head = _prefix_length(message, room * 2 // 3)
    tail = _prefix_length(message[::-1], room - room * 2 // 3)
    return message[:head] + CUT_MARK.format(len(message) - head - tail) + message[len(message) - tail :]


def _wire_bytes(character: str) -> int:
    """What `character` takes in a grpc-message (percent-encoded outside printable ASCII)."""
    if " " <= character <= "~" and character != "%":
        return 1
    return 3 * len(character.encode("utf-8", errors="replace"))


def _fits(message: str, limit: int) -> bool:
    total = 0
    for character in message:
        total += _wire_bytes(character)
        if total > limit:
            return False
    return True


def _prefix_length(message: str, budget: int) -> int:
    """How many leading characters of `message` fit in `budget` wire bytes."""
    for index, character in enumerate(message):
        budget -= _wire_bytes(character)
        if budget < 0:
            return index
    return len(message)


def describe_problems(problems: Sequence[Mapping[str, Any]], shown: int = 5) -> str:
    """One line naming the invalid fields of pydantic's validation `problems` and what each expected."""
    parts = []
    for problem in problems[:shown]:
        location = ".".join(str(part) for part in problem.get("loc", ()) if part != "body") or "body"
        parts.append(f"{location}: {problem.get('msg', 'invalid')}")
    more = f" (and {len(problems) - shown} more)" if len(problems) > shown else ""
    return "; ".join(parts) + more
