"""The server's own worker threads as the operating system sees them: their names, so that per-thread CPU
(`/proc/<pid>/task/*/comm`, `top -H`, `py-spy`) tells the event loop, tokenization and backend calls apart, and the
scheduling priority of the pool that does bulk work.

Python 3.11 names its threads only for Python (`threading.Thread.name`); the kernel keeps the name the thread
inherited from its creator. `name_this_thread` sets the kernel's name (Linux `prctl(PR_SET_NAME)`, at most 15
bytes) and is a no-op elsewhere. Threads a runtime starts from a named thread (ONNX Runtime's and OpenVINO's
worker pools) inherit its name, so they count with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
from collections.abc import Callable
from functools import cache

TOKENIZE = "bs-tokenize"
"""Tokenization and post-processing of large requests (`service.engine.admission.BoundedExecutor`)."""
BULK_NICE = 5
"""The nice value of the threads that tokenize and post-process large requests (long texts, many inputs): on a
small CPU they compete with the runtime and the event loop for the cores, and a sentence's answer should not wait
on a megabyte of someone else's text. Nice 5 gives such a thread about a third of the CPU share of a nice-0 one when
both want a core (Linux CFS weights 1024 vs 335); with the cores idle it runs at full speed."""
INFER = "bs-infer"
"""Backend calls and the runtime pools they start (`service.backends.ort_backend.OrtBackend`)."""
TOKENIZERS_PARALLELISM = "TOKENIZERS_PARALLELISM"
"""The tokenizers library's switch of its own thread pool (rayon), read at each `encode_batch`."""


def tokenize_on_the_calling_thread() -> None:
    """Have the tokenizers library encode a batch on the thread that calls it, unless `TOKENIZERS_PARALLELISM` is
    set already. By default it splits every `encode_batch` over a pool of its own, one thread per core, whose
    workers spin a while on every batch waiting for more: in a server whose runtime keeps the cores busy that is CPU
    taken from the runtime (measured on the Speed page, docs/benchmarks.md). The service tokenizes requests side by
    side on its own threads instead (the event loop for small requests, the bounded pool for large ones)."""
    os.environ.setdefault(TOKENIZERS_PARALLELISM, "false")


PR_SET_NAME = 15
MAX_NAME_BYTES = 15


@cache
def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:  # the process's own symbols, libc's among them: no library search (find_library runs ldconfig -p)
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    prctl: Callable[..., int] = libc.prctl
    return prctl


def name_this_thread(name: str) -> None:
    """Give the calling thread the kernel name `name` (cut to 15 bytes); silently nothing where unsupported."""
    prctl = _prctl()
    if prctl is not None:
        prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:MAX_NAME_BYTES]), 0, 0, 0)


def lower_this_thread(nice: int) -> None:
    """Raise the calling thread's nice value to `nice` (Linux: per thread); nothing where unsupported."""
    if nice > 0 and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


def thread_setup(name: str, nice: int = 0) -> Callable[[], None]:
    """A `ThreadPoolExecutor(initializer=...)` that names each worker thread `name` and sets its nice value."""

    def setup() -> None:
        name_this_thread(name)
        lower_this_thread(nice)

    return setup
