"""The HTTP protocol's transport wrapper: what one turn of the event loop writes goes out in one call, in order;
closing sends it first, aborting drops it."""

from __future__ import annotations

import asyncio
from typing import Any

from service.http_api.connections import _CoalescingTransport


class _Recorder:
    """The transport underneath: records what reaches it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", data))

    def writelines(self, lines: list[bytes]) -> None:
        self.calls.append(("writelines", b"".join(lines)))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.calls.append(("close", None))
        self.closing = True

    def abort(self) -> None:
        self.calls.append(("abort", None))
        self.closing = True

    def write_eof(self) -> None:
        self.calls.append(("write_eof", None))

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


async def _turn() -> None:
    await asyncio.sleep(0)


def test_the_writes_of_one_turn_reach_the_transport_in_one_call_in_order() -> None:
    async def main() -> list[tuple[str, Any]]:
        inner = _Recorder()
        outer = _CoalescingTransport(inner, asyncio.get_running_loop())  # type: ignore[arg-type]
        outer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        outer.write(bytearray(b"{}"))
        outer.write(b"")
        assert inner.calls == []  # nothing sent before the turn ends
        assert outer.get_write_buffer_size() == 40
        await _turn()
        outer.write(b"next")
        await _turn()
        return inner.calls

    calls = asyncio.run(main())
    assert calls == [("writelines", b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"), ("write", b"next")]


def test_close_sends_what_is_gathered_first_and_abort_drops_it() -> None:
    async def main() -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
        loop = asyncio.get_running_loop()
        closed, aborted = _Recorder(), _Recorder()
        first = _CoalescingTransport(closed, loop)  # type: ignore[arg-type]
        first.write(b"answer")
        first.close()
        second = _CoalescingTransport(aborted, loop)  # type: ignore[arg-type]
        second.write(b"lost")
        second.abort()
        await _turn()  # the scheduled sends find nothing left
        return closed.calls, aborted.calls

    closed, aborted = asyncio.run(main())
    assert closed == [("write", b"answer"), ("close", None)]
    assert aborted == [("abort", None)]


def test_write_eof_sends_first_and_the_rest_is_the_transports_own() -> None:
    async def main() -> tuple[list[tuple[str, Any]], str]:
        inner = _Recorder()
        outer = _CoalescingTransport(inner, asyncio.get_running_loop())  # type: ignore[arg-type]
        outer.writelines([b"a", b"b"])
        outer.write_eof()
        return inner.calls, outer.get_extra_info("peername")

    calls, info = asyncio.run(main())
    assert calls == [("writelines", b"ab"), ("write_eof", None)]
    assert info == "info:peername"
