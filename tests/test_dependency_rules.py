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
    names: set[str] = set()
    for path in (REPO / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return names


def test_bert_model_imports_nothing_else_of_ours() -> None:
    ours = {"export", "service", "loadtests", "bertserve", "proto"}
    assert imported_top_levels("bert_model") & ours == set()
