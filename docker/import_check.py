"""Import every module an image's entrypoints can import, with torch, onnx and what the image lacks unimportable.

    python docker/import_check.py api        # `bertserve serve`, `python -m service.operations.healthcheck`
    python docker/import_check.py loadtest   # `bertserve loadtest` and the locust users it starts

The images run this at build time, so a dependency missing from the serving image fails the build, not the
container at its first request; tests/test_image_imports.py runs it on the development venv. The whole
`service` package is imported (its modules import one another lazily, e.g. the gRPC front door in the
lifespan), not only the entry modules. Exit status 1 names the module that failed and why.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import traceback

BLOCKED = ("torch", "onnx")
"""Training-only packages: the serving and load-test images do not have them."""

ABSENT = {
    "api": ("httpx", "locust", "matplotlib", "transformers", "seqeval", "nncf", "pytest"),
    "loadtest": ("transformers", "seqeval", "nncf", "pytest", "openvino"),
}
"""Packages of the other extras (dev, loadtest, train) that an image does not install: blocked too, so that the
check run on the development venv (which has them all) fails where the image's build would."""


def unimportable(image: str) -> tuple[str, ...]:
    """What `check` blocks for `image`: the training-only packages and the ones the image does not install."""
    return (*BLOCKED, *ABSENT[image])


SKIPPED = {
    "loadtests.peers.naive_server": "the naive peer serves through transformers and torch on the host only",
}

ENTRYPOINTS = {
    "api": ("service", "proto.gen.bert.v1.bert_pb2", "proto.gen.bert.v1.bert_pb2_grpc"),
    "loadtest": ("loadtests", "proto.gen.bert.v1.bert_pb2", "proto.gen.bert.v1.bert_pb2_grpc"),
}


def modules_of(name: str) -> list[str]:
    """`name` itself and, for a package, every module below it (except SKIPPED)."""
    module = importlib.import_module(name)
    found = [name]
    if hasattr(module, "__path__"):
        for info in pkgutil.walk_packages(module.__path__, prefix=f"{name}."):
            if info.name not in SKIPPED:
                found.append(info.name)
    return found


def check(image: str) -> list[str]:
    """Import the `bertserve` command (every subcommand registered) and the image's modules; the failures."""
    for blocked in unimportable(image):
        sys.modules[blocked] = None  # type: ignore[assignment]  # `import torch` now raises ImportError
    failures: list[str] = []
    try:
        from bertserve.cli import build_app

        build_app()
    except Exception:
        failures.append(f"bertserve.cli (build_app):\n{traceback.format_exc()}")
    for entry in ENTRYPOINTS[image]:
        try:
            names = modules_of(entry)
        except Exception:
            failures.append(f"{entry}:\n{traceback.format_exc()}")
            continue
        for name in names:
            try:
                importlib.import_module(name)
            except Exception:
                failures.append(f"{name}:\n{traceback.format_exc()}")
    return failures


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in ENTRYPOINTS:
        print(f"usage: python docker/import_check.py {{{','.join(ENTRYPOINTS)}}}", file=sys.stderr)
        return 2
    failures = check(argv[1])
    without = ", ".join(unimportable(argv[1]))
    for failure in failures:
        print(f"import check ({argv[1]} image, without {without}) failed: {failure}", file=sys.stderr)
    if not failures:
        print(f"import check ({argv[1]} image): every entrypoint module imports without {without}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
