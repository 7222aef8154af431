"""The HTTP protocol's transport wrapper: a response head goes out with the write that follows it, in one call;
a head nothing follows goes out at the end of the event loop's turn; closing sends it first, aborting drops it."""

from __future__ import annotations

import asyncio
from typing import Any

from service.http_api.connections import _CoalescingTransport

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


class _Recorder:
    """The transport underneath: records what reaches it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", bytes(data)))

    def writelines(self, lines: list[bytes]) -> None:
        self.calls.append(("writelines", b"".join(bytes(line) for line in lines)))

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


def test_a_head_goes_out_with_the_body_that_follows_it_in_one_call() -> None:
    async def main() -> list[tuple[str, Any]]:
        inner = _Recorder()
        outer = _CoalescingTransport(inner, asyncio.get_running_loop())  # type: ignore[arg-type]
        outer.write(HEAD)
        assert inner.calls == []  # held for the body
        assert outer.get_write_buffer_size() == len(HEAD)
        outer.write(bytearray(b"{}"))
        assert inner.calls == [("writelines", HEAD + b"{}")]  # at once, not at the end of the turn
        outer.write(b"")
        outer.write(b"more")  # not a head: straight through
        await _turn()
        return inner.calls

    calls = asyncio.run(main())
    assert calls == [("writelines", HEAD + b"{}"), ("write", b"more")]


def test_a_head_nothing_follows_goes_out_at_the_end_of_the_turn() -> None:
    async def main() -> list[tuple[str, Any]]:
        inner = _Recorder()
        outer = _CoalescingTransport(inner, asyncio.get_running_loop())  # type: ignore[arg-type]
        outer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await _turn()
        return inner.calls

    assert asyncio.run(main()) == [("write", b"HTTP/1.1 100 Continue\r\n\r\n")]


def test_close_sends_a_held_head_first_and_abort_drops_it() -> None:
    async def main() -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
        loop = asyncio.get_running_loop()
        closed, aborted = _Recorder(), _Recorder()
        first = _CoalescingTransport(closed, loop)  # type: ignore[arg-type]
        first.write(HEAD)
        first.close()
        second = _CoalescingTransport(aborted, loop)  # type: ignore[arg-type]
        second.write(HEAD)
        second.abort()
        await _turn()  # the scheduled sends find nothing left
        return closed.calls, aborted.calls

    closed, aborted = asyncio.run(main())
    assert closed == [("write", HEAD), ("close", None)]
    assert aborted == [("abort", None)]


def test_write_eof_sends_first_and_the_rest_is_the_transports_own() -> None:
    async def main() -> tuple[list[tuple[str, Any]], str]:
        inner = _Recorder()
        outer = _CoalescingTransport(inner, asyncio.get_running_loop())  # type: ignore[arg-type]
        outer.writelines([HEAD])
        outer.write_eof()
        return inner.calls, outer.get_extra_info("peername")

    calls, info = asyncio.run(main())
    assert calls == [("write", HEAD), ("write_eof", None)]
    assert info == "info:peername"
