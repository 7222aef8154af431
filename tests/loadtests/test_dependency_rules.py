"""The runner never loads locust (gevent patches) nor torch (tests/test_dependency_rules.py checks that the load
tests reach the service only over the wire)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOADTESTS = REPO / "loadtests"


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_runner_and_cli_import_no_locust_torch_or_service() -> None:
    code = (
        "import sys; import bertserve.cli as c; c.build_app(); import loadtests.runner, bertserve.commands.loadtest; "
        "print(sorted(m for m in ('locust', 'gevent', 'torch', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
