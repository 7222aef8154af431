"""`bertserve info`: the installed entry point on a built-in name, a folder, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bert_model.modeling import BertModel

BERTSERVE = Path(sys.executable).parent / "bertserve"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BERTSERVE), *args], capture_output=True, text=True, timeout=120)


def test_info_minilm_json() -> None:
    result = run("info", "minilm", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    expected = sum(p.numel() for p in BertModel.from_pretrained("minilm").parameters())
    assert summary["parameters"] == expected == 22_713_216
    assert summary["config"]["hidden_size"] == 384 and summary["config"]["num_hidden_layers"] == 6
    assert summary["vocabulary"]["size"] == 30522 and summary["vocabulary"]["lowercase"] is True
    assert summary["vocabulary"]["special_tokens"]["[CLS]"] == 101


def test_info_tables() -> None:
    result = run("info", "minilm")
    assert result.returncode == 0, result.stderr
    assert "parameters: 22,713,216" in result.stdout and "hidden_size" in result.stdout


def test_info_bad_inputs(tmp_path) -> None:
    result = run("info", "no-such-model")
    assert result.returncode == 2
    assert "neither a model folder nor a built-in model name" in result.stderr
    assert "Traceback" not in result.stderr
    result = run("info", str(tmp_path))
    assert result.returncode == 2 and "no config.json" in result.stderr
