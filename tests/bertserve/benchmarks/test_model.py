"""`bertserve bench-model` through the CLI on a tiny bundle, the benchmark's FLOP and peak arithmetic, its report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bert_model.config import BertConfig
from bertserve.benchmarks.model import cpu_peak, forward_flops, machine_line
from bertserve.commands.bench import register

CPUINFO = "model name\t: Test CPU\ncpu MHz\t\t: 2500.000\nflags\t\t: fpu avx2 fma avx512f avx512_bf16 avx512_vnni\n"


@pytest.fixture()
def cli() -> tuple[CliRunner, object]:
    import typer

    app = typer.Typer()

    @app.callback()
    def root() -> None:
        """Test app."""

    register(app)
    return CliRunner(), app


def test_bench_model_on_a_bundle(cli: tuple, exported_bundle: Path, tmp_path: Path) -> None:
    runner, app = cli
    args = [str(exported_bundle), "--out", str(tmp_path), "--rounds", "1", "--variants", "cpu-int8"]
    result = runner.invoke(app, ["bench-model", *args, "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "bench-model.json").read_text())
    runners = {row["runner"] for row in report["rows"]}
    assert runners == {
        "PyTorch fp32 (ours)",
        "transformers fp32",
        "PyTorch bf16 autocast (ours)",
        "cpu-int8 (ONNX Runtime CPU)",
    }
    assert {(row["batch"], row["seq_len"]) for row in report["rows"]} == {(1, 128), (16, 128), (1, 384)}
    baseline = [r for r in report["rows"] if r["runner"] == "PyTorch fp32 (ours)"]
    assert all(r["speedup"] == 1.0 for r in baseline)
    assert "| PyTorch fp32 (ours) | 1 × 128 |" in (tmp_path / "bench-model.md").read_text()
    probes = report["meta"]["matmul_probe"]
    assert [p["when"] for p in probes] == ["before 1 × 128", "before 16 × 128", "before 1 × 384", "at the end"]
    for p in probes:
        assert p["fp32_gflops"] > 0 and p["bf16_gflops"] > 0
        assert p["bf16_over_fp32"] == pytest.approx(p["bf16_gflops"] / p["fp32_gflops"])
    markdown = (tmp_path / "bench-model.md").read_text()
    assert "Matrix-unit probe (4 times during the run" in markdown
    command = f"bertserve bench-model {' '.join(args)} --data-dir {tmp_path}"
    assert report["provenance"]["command"] == command
    assert markdown.startswith("Measured ") and markdown.splitlines()[0].endswith(f" by `{command}`.")


def test_forward_flops_matches_a_hand_count() -> None:
    config = BertConfig(hidden_size=4, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2)
    # projections: 2·B·S·(4·16 + 2·32) = 2·1·2·128 = 512; attention: 4·B·S²·H = 4·1·4·4 = 64
    assert forward_flops(config, batch=1, seq_len=2) == 576.0
    minilm = BertConfig(hidden_size=384, intermediate_size=1536, num_hidden_layers=6, num_attention_heads=12)
    assert forward_flops(minilm, 16, 128) == pytest.approx(45.9e9, rel=0.01)


def test_cpu_peak_from_cpuinfo_flags() -> None:
    peak = cpu_peak(CPUINFO, cores=2)
    assert peak.model_name == "Test CPU" and peak.ghz == 2.5
    assert peak.peak("fp32") == 2 * 2.5e9 * 64
    assert peak.peak("bf16") == 2 * peak.peak("fp32")
    assert peak.peak("int8") == 4 * peak.peak("fp32")
    assert cpu_peak("flags\t: fma avx2\ncpu MHz\t: 1000\n", cores=1).peak("int8") == 1e9 * 64


def test_cpu_peak_follows_amx_tiles_on_a_xeon() -> None:
    from tests.bundles.test_hardware import AMX_XEON

    peak = cpu_peak(AMX_XEON, cores=2)
    assert (peak.fp32_per_cycle, peak.bf16_per_cycle, peak.int8_per_cycle) == (64, 1024, 2048)
    assert peak.peak("int8") == 2 * 2.0e9 * 2048  # 8x what VNNI alone would give
    assert {"amx_int8", "amx_bf16", "amx_tile"} <= set(peak.flags) and peak.cpu["matrix_family"] == "AMX"
    line = machine_line(peak)
    assert "INTEL(R) XEON(R) PLATINUM 8580 (Emerald Rapids), 2 cores" in line and "AMX-INT8 tiles" in line


def test_cpu_peak_of_an_epyc_zen4_uses_its_256_bit_datapaths() -> None:
    from tests.bundles.test_hardware import EPYC_ZEN4

    peak = cpu_peak(EPYC_ZEN4, cores=2)
    assert (peak.fp32_per_cycle, peak.bf16_per_cycle, peak.int8_per_cycle) == (32, 64, 128)
    assert peak.peak("fp32") == 2 * 2.75e9 * 32
    assert peak.cpu["microarchitecture"] == "Zen 4" and "amx_int8" not in peak.flags
    assert "AVX-512 VNNI (no AMX)" in machine_line(peak)


def test_probe_sentence_gives_the_spread_of_the_matrix_unit_rates() -> None:
    from bertserve.benchmarks.model import probe_sentence

    probes = [
        {"when": "before 1 × 128", "fp32_gflops": 233.0, "bf16_gflops": 1110.0, "bf16_over_fp32": 1110 / 233},
        {"when": "at the end", "fp32_gflops": 240.0, "bf16_gflops": 880.0, "bf16_over_fp32": 880 / 240},
    ]
    sentence = probe_sentence(probes)
    assert "fp32 233–240 GFLOP/s, bf16 880–1110 GFLOP/s, bf16 / fp32 3.7–4.8×" in sentence
    assert probe_sentence([]) == ""


def test_bench_report_names_the_machine(tmp_path: Path) -> None:
    from bertserve.benchmarks.model import Row, save_report
    from bertserve.benchmarks.report import provenance
    from bundles.hardware import read_cpu_info
    from tests.bundles.test_hardware import EPYC_ZEN4

    row = Row("cpu-int8 (ONNX Runtime CPU)", 1, 128, 5.0, 200.0, 3.0, 500.0, 1.0, 0.5)
    origin = provenance("bertserve bench-model m", cpu=read_cpu_info(EPYC_ZEN4, cores=2))
    json_path, md_path = save_report([row], cpu_peak(EPYC_ZEN4, cores=2), {"model": "m"}, tmp_path, origin)
    assert (json_path.name, md_path.name) == ("bench-model.json", "bench-model.md")
    cpu = json.loads(json_path.read_text())["cpu"]
    assert cpu["model_name"] == "AMD EPYC 9454 48-Core Processor" and cpu["int8_per_cycle"] == 128
    assert cpu["cpu"]["features"]["avx512_vnni"] and not cpu["cpu"]["features"]["amx_int8"]
    text = md_path.read_text()
    assert "AMD EPYC 9454 48-Core Processor (Zen 4), 2 cores" in text.splitlines()[0]
    assert "On 2 cores at 2.75 GHz nominal: peak fp32 176 GFLOP/s, bf16 352, int8 704 GOP/s" in text
    assert "| cpu-int8 (ONNX Runtime CPU) | 1 × 128 | 5.0 |" in text
