"""The naive peer's helpers: plain checkpoints used as they are, composite folders converted once and cached."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from loadtests.naive_server import _plain, hf_checkpoint, main


def test_numpy_scalars_become_json_numbers() -> None:
    value = _plain([{"score": np.float32(0.5), "start": np.int64(3), "word": "x"}])
    assert json.dumps(value) == '[{"score": 0.5, "start": 3, "word": "x"}]'


def test_plain_checkpoint_is_used_as_it_is(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    checkpoint, _ = tiny
    assert hf_checkpoint(str(checkpoint), "classify", tmp_path) == checkpoint.resolve()
    assert not any(tmp_path.iterdir())


def test_composite_folder_is_converted_and_cached(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    checkpoint, _ = tiny
    composite = tmp_path / "composite"
    shutil.copytree(checkpoint, composite)
    config = json.loads((composite / "config.json").read_text())
    (composite / "config.json").write_text(json.dumps({**config, "bertserve": {"note": "not a plain checkpoint"}}))
    cache = tmp_path / "cache"
    converted = hf_checkpoint(str(composite), "classify", cache)
    assert converted == cache / "composite"
    assert {"config.json", "model.safetensors", "vocab.txt", "source.json"} <= {p.name for p in converted.iterdir()}
    mtime = (converted / "model.safetensors").stat().st_mtime_ns
    assert hf_checkpoint(str(composite), "classify", cache) == converted
    assert (converted / "model.safetensors").stat().st_mtime_ns == mtime  # reused
    (composite / "vocab.txt").write_text((composite / "vocab.txt").read_text() + "\n")  # the source changed
    hf_checkpoint(str(composite), "classify", cache)
    assert (
        json.loads((converted / "source.json").read_text())["files"]["vocab.txt"][0]
        == (composite / "vocab.txt").stat().st_size
    )


def test_arguments_are_checked() -> None:
    with pytest.raises(SystemExit):
        main(["--model", "summarize=x"])
    with pytest.raises(SystemExit):
        main([])
