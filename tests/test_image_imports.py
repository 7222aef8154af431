"""The images' build-time import check, run on the development venv: every module that `bertserve serve`,
`python -m service.operations.healthcheck` and `bertserve loadtest` can import loads with torch, onnx and the
packages the image does not install made unimportable."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.service.server import REPO

CHECK = REPO / "docker" / "import_check.py"


@pytest.mark.parametrize("image", ["api", "loadtest"])
def test_entrypoints_import_without_torch_and_onnx(image: str) -> None:
    result = subprocess.run([sys.executable, str(CHECK), image], capture_output=True, text=True, cwd=REPO, timeout=180)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "every entrypoint module imports" in result.stdout


@pytest.mark.parametrize("package_name", ["onnx", "httpx"])
def test_the_check_fails_on_a_module_that_needs_a_package_the_image_lacks(tmp_path, package_name: str) -> None:
    """A serving module that imports onnx (training only) or httpx (dev and load-test extras only) at module level
    is reported, although the development venv has both (the defect the check exists for)."""
    package = tmp_path / "service"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "needs_it.py").write_text(f"import {package_name}\n")
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r}); sys.path.insert(1, {str(REPO)!r}); "
        f"sys.argv = ['import_check', 'api']; exec(open({str(CHECK)!r}).read())"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=180)
    assert result.returncode == 1
    assert "service.needs_it" in result.stderr and package_name in result.stderr
