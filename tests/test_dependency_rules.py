"""The architecture's dependency rules, checked: the torch-free modules never import torch, bert_model imports
nothing else of ours, export imports only bert_model, and the modules of bert_model import each other without
cycles. Every file counts, command-line adapters included, and so does every import, also one inside a function
body."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TORCH_FREE = [
    "bert_model",
    "bert_model.cli_errors",
    "bert_model.config",
    "bert_model.finetuning.cli",
    "bert_model.finetuning.options",
    "bert_model.finetuning.retrieval_eval",
    "bert_model.hardware",
    "bert_model.loopback",
    "bert_model.registry",
    "bert_model.tokenization",
    "bertserve.benchmarks.cli",
    "bertserve.benchmarks.report",
]


def torch_free_modules() -> list[str]:
    tasks = sorted(p.stem for p in (REPO / "bert_model" / "tasks").glob("*.py") if p.stem != "__init__")
    return [*TORCH_FREE, "bert_model.tasks", *(f"bert_model.tasks.{name}" for name in tasks)]


def test_torch_free_modules_import_without_torch() -> None:
    modules = torch_free_modules()
    code = "import sys\nsys.modules['torch'] = None\n" + "".join(f"import {m}\n" for m in modules)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_variant_choice_and_the_runtimes_import_without_onnx_or_a_runtime() -> None:
    """Every stage asks them (the serving image has no onnx; the runtimes are imported when a variant opens)."""
    blocked = "".join(f"sys.modules[{name!r}] = None\n" for name in ("torch", "onnx", "onnxruntime", "openvino"))
    code = "import sys\n" + blocked + "import bert_model.tasks.variant_choice, bert_model.tasks.runtimes\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr


def imported_modules(path: Path) -> Iterator[str]:
    """Every module named by an absolute import in `path`, at any depth (lazy imports in functions too)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)  # `from package import module`


def imported_top_levels(package: str) -> set[str]:
    """Top-level packages imported by the files of `package`."""
    return {name.split(".")[0] for path in (REPO / package).rglob("*.py") for name in imported_modules(path)}


OURS = {"bert_model", "export", "service", "loadtests", "bertserve", "proto"}


def test_bert_model_imports_nothing_else_of_ours() -> None:
    assert imported_top_levels("bert_model") & OURS == {"bert_model"}


def test_export_imports_only_bert_model() -> None:
    assert imported_top_levels("export") & OURS <= {"export", "bert_model"}


def test_stages_import_nothing_of_the_package_that_composes_them() -> None:
    """`bertserve` composes the stages (and may import every one of them); no stage imports it back."""
    for package in ("bert_model", "export", "service", "loadtests"):
        assert "bertserve" not in imported_top_levels(package), package


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (module-level and lazy imports alike)."""
    files = {module_name(path): path for path in (REPO / package).rglob("*.py")}
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


def test_bert_model_modules_import_each_other_without_cycles() -> None:
    graph = import_graph("bert_model")
    assert "bert_model.weights" in graph["bert_model.checkpoint"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_cycle_finder_finds_a_lazy_import_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def bert_model_modules_imported_by(package: str) -> set[str]:
    modules: set[str] = set()
    for path in (REPO / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bert_model"):
                modules.add(node.module)
    return modules


def test_service_uses_only_the_torch_free_parts_of_bert_model() -> None:
    allowed = (
        "bert_model.tasks",
        "bert_model.tokenization",
        "bert_model.registry",
        "bert_model.hardware",
        "bert_model.cli_errors",
    )
    imported = bert_model_modules_imported_by("service")
    assert imported, "the service imports its task logic from bert_model.tasks"
    assert all(module.startswith(allowed) for module in imported), imported
    assert not imported_top_levels("service") & {"export", "loadtests", "torch"}
