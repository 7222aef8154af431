"""The architecture's dependency rules, checked on every file and every import (command-line adapters and imports
inside function bodies included).

The rooms, bottom up (an arrow: may import):

    bert_model   the model, tokenization, checkpoints, pretraining, fine-tuning, torch-free task logic
    bundles      → bert_model            the bundle contract, variant choice, runtimes, hardware
    export       → bert_model, bundles
    service      → bert_model (torch-free parts), bundles, proto
    loadtests    → bert_model (torch-free parts), bundles, proto; the service only over the wire
    bertserve    → every stage           the one command line; no stage imports it
    docgen       → everything            the docs' generated pages

Inside the service: the front doors (`http_api`, `grpc_api`) call the `engine`; the engine runs `backends`; every
room may use `operations` (logs, metrics, threads) and the shared `errors` / `settings`; nothing below imports a
front door, and the front doors do not import each other (`service.serve` starts them side by side).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OURS = {"bert_model", "bundles", "export", "service", "loadtests", "bertserve", "docgen", "proto"}
ALLOWED: dict[str, set[str]] = {
    "bert_model": {"bert_model"},
    "bundles": {"bundles", "bert_model"},
    "export": {"export", "bert_model", "bundles"},
    "service": {"service", "bert_model", "bundles", "proto"},
    "loadtests": {"loadtests", "bert_model", "bundles", "proto"},
    "bertserve": OURS - {"docgen"},
    "docgen": OURS,
}
RUNTIMES = {"onnxruntime", "openvino"}
TORCH_FREE_BERT_MODEL = ("bert_model.tasks", "bert_model.tokenization", "bert_model.registry", "bert_model.config")
"""What of the model room the service and the load tests may use: no torch behind any of it."""
SERVICE_ROOMS: dict[str, set[str]] = {
    "service.operations": {"service.operations", "service.errors", "service.error_messages"},
    "service.backends": {"service.backends", "service.operations", "service.errors"},
    "service.engine": {
        "service.engine",
        "service.backends",
        "service.operations",
        "service.errors",
        "service.settings",
    },
    "service.http_api": {
        "service.http_api",
        "service.engine",
        "service.operations",
        "service.errors",
        "service.error_messages",
        "service.settings",
    },
    "service.grpc_api": {
        "service.grpc_api",
        "service.engine",
        "service.operations",
        "service.errors",
        "service.error_messages",
        "service.settings",
    },
}


def imported_modules(path: Path) -> Iterator[str]:
    """Every module named by an absolute import in `path`, at any depth (lazy imports in functions too)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)  # `from package import module`


def files_of(package: str) -> list[Path]:
    return sorted((REPO / package.replace(".", "/")).rglob("*.py"))


def imported_top_levels(package: str) -> set[str]:
    """Top-level packages imported by the files of `package`."""
    return {name.split(".")[0] for path in files_of(package) for name in imported_modules(path)}


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_each_room_imports_only_the_rooms_below_it(room: str) -> None:
    assert imported_top_levels(room) & OURS <= ALLOWED[room]


def test_no_module_of_the_model_room_imports_a_runtime() -> None:
    """Opening ONNX Runtime or OpenVINO is the bundle room's job (`bundles.runtimes`)."""
    offenders = {
        str(path.relative_to(REPO)): name
        for path in files_of("bert_model")
        for name in imported_modules(path)
        if name.split(".")[0] in RUNTIMES
    }
    assert offenders == {}


TORCH_PEERS = {"loadtests/peers/naive_server.py"}
"""The naive peer: a load-test target that serves one request at a time through PyTorch, on the host only."""


@pytest.mark.parametrize("package", ["service", "loadtests", "bundles"])
def test_serving_side_packages_use_only_the_torch_free_parts_of_the_model_room(package: str) -> None:
    used = {
        name
        for path in files_of(package)
        if str(path.relative_to(REPO)) not in TORCH_PEERS
        for name in imported_modules(path)
        if name.startswith("bert_model.") or name.split(".")[0] in ("torch", "export")
    }
    assert all(name.startswith(TORCH_FREE_BERT_MODEL) for name in used), sorted(used)


def test_the_load_tests_reach_the_service_only_over_the_wire() -> None:
    assert "service" not in imported_top_levels("loadtests")


def service_room(module: str) -> str:
    """`service.engine.batcher` → `service.engine`; a top-level module (`service.errors`) is its own room."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_the_service_rooms_import_downwards_only() -> None:
    offenders = []
    for room, allowed in SERVICE_ROOMS.items():
        for path in files_of(room):
            for name in imported_modules(path):
                if name.startswith("service.") and service_room(name) not in allowed:
                    offenders.append(f"{path.relative_to(REPO)} imports {name}")
    assert offenders == []


def test_the_front_doors_are_siblings() -> None:
    """Neither front door starts the other: `service.serve` starts both over one engine."""
    for door, other in (("service.http_api", "service.grpc_api"), ("service.grpc_api", "service.http_api")):
        assert not any(name.startswith(other) for path in files_of(door) for name in imported_modules(path)), (
            f"{door} imports {other}"
        )


def torch_free_modules() -> list[str]:
    names = ["bert_model.tasks", "bert_model.tokenization", "bert_model.config", "bert_model.registry"]
    names += [f"bert_model.tasks.{p.stem}" for p in sorted((REPO / "bert_model" / "tasks").glob("*.py"))]
    names += [f"bundles.{p.stem}" for p in sorted((REPO / "bundles").glob("*.py"))]
    names += [f"bertserve.commands.{p.stem}" for p in sorted((REPO / "bertserve" / "commands").glob("*.py"))]
    return [name.removesuffix(".__init__") for name in names] + ["bertserve.cli", "bertserve.cli_errors"]


def test_torch_free_modules_import_without_torch() -> None:
    code = "import sys\nsys.modules['torch'] = None\n" + "".join(f"import {m}\n" for m in torch_free_modules())
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_bundle_room_imports_without_onnx_or_a_runtime() -> None:
    """Every stage reads bundles (the serving image has no onnx); a runtime is imported when a variant opens."""
    blocked = "".join(f"sys.modules[{name!r}] = None\n" for name in ("torch", "onnx", "onnxruntime", "openvino"))
    modules = ", ".join(f"bundles.{p.stem}" for p in sorted((REPO / "bundles").glob("*.py")) if p.stem != "__init__")
    code = f"import sys\n{blocked}import {modules}\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (module-level and lazy imports alike)."""
    files = {module_name(path): path for path in files_of(package)}
    return {name: {m for m in imported_modules(path) if m in files and m != name} for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` as [a, b, ..., a], or None (depth-first search, three colours)."""
    done: set[str] = set()
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in stack:
            return [*stack[stack.index(node) :], node]
        if node in done:
            return None
        stack.append(node)
        for target in sorted(graph[node]):
            cycle = visit(target)
            if cycle:
                return cycle
        stack.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        cycle = visit(start)
        if cycle:
            return cycle
    return None


@pytest.mark.parametrize("package", ["bert_model", "bundles", "service"])
def test_modules_import_each_other_without_cycles(package: str) -> None:
    graph = import_graph(package)
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_cycle_finder_finds_a_lazy_import_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
