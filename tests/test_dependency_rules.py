"""The architecture's dependency rules, checked: the torch-free modules never import torch, and bert_model
imports nothing else of ours."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TORCH_FREE = ["bert_model", "bert_model.config", "bert_model.registry", "bert_model.tokenization"]


def torch_free_modules() -> list[str]:
    tasks = sorted(p.stem for p in (REPO / "bert_model" / "tasks").glob("*.py") if p.stem != "__init__")
    return [*TORCH_FREE, "bert_model.tasks", *(f"bert_model.tasks.{name}" for name in tasks)]


def test_torch_free_modules_import_without_torch() -> None:
    modules = torch_free_modules()
    code = "import sys\nsys.modules['torch'] = None\n" + "".join(f"import {m}\n" for m in modules)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr


def imported_top_levels(package: str) -> set[str]:
    """Top-level packages imported by `package`, except its `cli.py` adapters (see below)."""
    names: set[str] = set()
    for path in (REPO / package).rglob("*.py"):
        if path.name == "cli.py":
            continue  # a stage's CLI adapter belongs to the `bertserve` command and may use bertserve.errors
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return names


OURS = {"bert_model", "export", "service", "loadtests", "bertserve", "proto"}


def test_bert_model_imports_nothing_else_of_ours() -> None:
    assert imported_top_levels("bert_model") & OURS == {"bert_model"}


def test_export_imports_only_bert_model() -> None:
    assert imported_top_levels("export") & OURS <= {"export", "bert_model"}


def test_cli_adapters_import_only_the_error_helper_of_bertserve() -> None:
    for path in REPO.glob("*/**/cli.py"):
        if path.parts[-2] == "bertserve" or ".venv" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bertserve"):
                assert node.module == "bertserve.errors", f"{path} imports {node.module}"


def bert_model_modules_imported_by(package: str) -> set[str]:
    modules: set[str] = set()
    for path in (REPO / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bert_model"):
                modules.add(node.module)
    return modules


def test_service_uses_only_the_torch_free_parts_of_bert_model() -> None:
    allowed = ("bert_model.tasks", "bert_model.tokenization", "bert_model.registry")
    imported = bert_model_modules_imported_by("service")
    assert imported, "the service imports its task logic from bert_model.tasks"
    assert all(module.startswith(allowed) for module in imported), imported
    assert not imported_top_levels("service") & {"export", "loadtests", "torch"}
