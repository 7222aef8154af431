"""Precision follows the CPU: bf16 autocast only where bf16 is native (AVX512_BF16 or AMX), else fp32 and one
warning line, in fine-tuning as in pretraining (both ask `bert_model.training.resolve_bf16`)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from bert_model import training
from bert_model.finetuning.options import ClassifyOptions, FinetuneRun, TrainingOptions
from bert_model.finetuning.run import finetune

WARNING = "bf16 requested but this CPU has no native bf16 (AVX512_BF16/AMX): training in fp32"


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(training, "_WARNED", set())


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "bert_model.training"]


@pytest.mark.parametrize(
    ("flags", "native"),
    [({"avx2", "fma"}, False), ({"avx512f", "avx512_vnni"}, False), ({"avx512_bf16"}, True), ({"amx_bf16"}, True)],
)
def test_native_bf16_is_read_from_the_cpu_flags(flags: set[str], native: bool) -> None:
    assert training.native_bf16(flags) is native


def test_a_request_falls_back_to_fp32_with_one_warning(fresh_warnings: None, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="bert_model.training"):
        assert training.resolve_bf16(True, flags={"avx2"}) is False
        assert training.resolve_bf16(True, flags={"avx2"}) is False
        assert training.resolve_bf16(True, flags={"amx_bf16", "amx_tile"}) is True
        assert training.resolve_bf16(False, flags={"amx_bf16"}) is False
        assert training.resolve_bf16(True, "cuda", flags={"avx2"}) is True  # the accelerator decides there
        assert training.resolve_bf16(True, flags={"avx2"}, activity="rank 1", announce=False) is False
    assert _messages(caplog) == [WARNING]
    with caplog.at_level(logging.WARNING, logger="bert_model.training"):
        training.resolve_bf16(True, flags={"avx2"}, activity="evaluating")
    assert _messages(caplog)[-1].endswith(": evaluating in fp32")


def test_cpu_flags_come_from_torch_or_proc_cpuinfo(tmp_path: Path) -> None:
    assert training.cpu_flags()  # torch's cpuinfo (or /proc/cpuinfo) names some feature on any CPU
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512_bf16 amx_tile\nbogomips\t: 1\n")
    assert training._proc_cpuinfo_flags(cpuinfo) == {"fpu", "sse2", "avx2", "avx512_bf16", "amx_tile"}
    assert training._proc_cpuinfo_flags(tmp_path / "missing") == frozenset()


@pytest.mark.parametrize(("flags", "precision"), [({"avx2"}, "fp32"), ({"amx_bf16"}, "bf16-autocast")])
def test_finetune_uses_and_records_the_precision_the_cpu_allows(
    flags: set[str],
    precision: str,
    tiny_base: Path,
    sentiment_files: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fresh_warnings: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(training, "cpu_flags", lambda: frozenset(flags))
    train, dev = (str(path) for path in sentiment_files)
    options = ClassifyOptions(max_seq_length=32, label_map={"0": "negative", "1": "positive"})
    run = FinetuneRun("classify", str(tiny_base), train, str(tmp_path), dev, TrainingOptions(max_steps=2, bf16=True))
    run.task_options = options
    with caplog.at_level(logging.WARNING, logger="bert_model.training"):
        summary = finetune(run)
    assert summary["precision"] == precision and summary["run"]["training"]["bf16"] is True
    assert _messages(caplog) == ([WARNING] if precision == "fp32" else [])
