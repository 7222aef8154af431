"""Which variant serves: the CPU family's order, the runtimes this process has, a forced variant, CUDA, batch
invariance; and what `--variant auto` times, in which order."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import pytest

from bundles.hardware import CpuInfo
from bundles.runtimes import CPU_PROVIDER as CPU
from bundles.runtimes import CUDA_PROVIDER as CUDA
from bundles.runtimes import OPENVINO_PROVIDER as OPENVINO
from bundles.spec import BundleManifest, VariantSpec
from bundles.variant_choice import (
    AVX2,
    CPU_ORDERS,
    VNNI,
    batch_dependence,
    choose_variant,
    cpu_family,
    cpu_order,
    times_cpu_variants,
    timing_candidates,
)

GUARDED = {"judgment": "task-agreement"}
EVERY_VARIANT = {
    "cpu-fp32": (CPU, "fp32"),
    "cpu-int8": (CPU, "int8"),
    "cpu-int8-static": (CPU, "int8"),
    "gpu-fp16": (CUDA, "fp16"),
    "openvino-int8": (OPENVINO, "int8"),
    "openvino-bf16": (OPENVINO, "bf16"),
    "openvino-int8-static": (OPENVINO, "int8"),
}


def manifest(variants: dict[str, tuple[str, str]], **fields: object) -> BundleManifest:
    """A manifest of `variants`, each guarded and judged batch invariant at export."""
    specs = {
        name: VariantSpec(f"{name}.onnx", kind, precision, dict(GUARDED), batch_invariant=True)
        for name, (kind, precision) in variants.items()
    }
    return BundleManifest(name="m", task="classify", max_seq_length=64, labels=["a", "b"], variants=specs, **fields)  # type: ignore[arg-type]


def cpu(*flags: str, vendor: str = "AuthenticAMD") -> CpuInfo:
    return CpuInfo("a CPU", vendor, 25, 1, 2, 2450.0, frozenset(flags))


def runs(*providers: str) -> Callable[[str], bool]:
    return lambda provider: provider in providers


def test_the_cpu_family_follows_the_int8_instructions() -> None:
    assert cpu_family(cpu("avx2", "fma")) == AVX2  # AMD Zen 3: AVX2, no VNNI
    assert cpu_family(cpu("avx2", "avx512f", "avx512_vnni")) == VNNI  # AMD Zen 4
    assert cpu_family(cpu("avx2", "avx_vnni", vendor="GenuineIntel")) == VNNI  # AVX-VNNI without AVX-512
    assert cpu_family(cpu("avx2", "avx512_vnni", "amx_int8", vendor="GenuineIntel")) == VNNI
    assert cpu_family(cpu("sse4_2")) == VNNI  # unmeasured: the VNNI order
    assert cpu_family() in CPU_ORDERS  # this machine


def test_each_family_serves_its_fastest_variant_and_falls_back_without_openvino() -> None:
    bundle = manifest(EVERY_VARIANT)
    everything, plain = runs(CPU, OPENVINO), runs(CPU)
    assert choose_variant(bundle, can_run=everything, family=VNNI) == "openvino-int8-static"
    assert choose_variant(bundle, can_run=plain, family=VNNI) == "cpu-int8-static"
    assert choose_variant(bundle, can_run=everything, family=AVX2) == "cpu-int8-static"
    assert choose_variant(bundle, can_run=plain, family=AVX2) == "cpu-int8-static"
    ort_int8 = ("cpu-int8", "cpu-int8-static")  # refused by their guards
    without_int8 = manifest({k: v for k, v in EVERY_VARIANT.items() if k not in ort_int8})
    assert choose_variant(without_int8, can_run=everything, family=AVX2) == "openvino-bf16"
    assert choose_variant(without_int8, can_run=plain, family=AVX2) == "cpu-fp32"
    assert cpu_order(bundle, AVX2) == list(CPU_ORDERS[AVX2])  # the GPU variant is no CPU variant


def test_cuda_serves_the_gpu_variant_unless_the_cpu_is_asked_for() -> None:
    bundle = manifest(EVERY_VARIANT)
    with_cuda = runs(CPU, CUDA)
    assert choose_variant(bundle, can_run=with_cuda, family=VNNI) == "gpu-fp16"
    assert choose_variant(bundle, "cuda", can_run=with_cuda, family=VNNI) == "gpu-fp16"
    assert choose_variant(bundle, "cpu", can_run=with_cuda, family=VNNI) == "cpu-int8-static"
    no_gpu_graph = manifest({"cpu-fp32": EVERY_VARIANT["cpu-fp32"]})
    assert choose_variant(no_gpu_graph, "cuda", can_run=with_cuda) == "cpu-fp32"
    with pytest.raises(ValueError, match="device cuda was asked for, but this process has no CUDAExecutionProvider"):
        choose_variant(bundle, "cuda", can_run=runs(CPU))
    assert times_cpu_variants("auto", runs(CPU)) and not times_cpu_variants("auto", with_cuda)
    assert times_cpu_variants("cpu", with_cuda) and not times_cpu_variants("cuda", runs(CPU))


def test_a_forced_variant_must_be_in_the_bundle_and_runnable_here() -> None:
    bundle = manifest(EVERY_VARIANT)
    assert choose_variant(bundle, forced="cpu-fp32", can_run=runs(CPU), family=VNNI) == "cpu-fp32"
    with pytest.raises(ValueError, match="bundle 'm' has no variant 'nope': its variants are cpu-fp32, cpu-int8, cpu-"):
        choose_variant(bundle, forced="nope")
    with pytest.raises(ValueError, match="'gpu-fp16' of bundle 'm' needs CUDAExecutionProvider, which this process"):
        choose_variant(bundle, forced="gpu-fp16", can_run=runs(CPU))
    gpu_only = manifest({"gpu-fp16": EVERY_VARIANT["gpu-fp16"]})
    with pytest.raises(ValueError, match="bundle 'm' has no variant this process can run on auto: its variants are"):
        choose_variant(gpu_only, can_run=runs(CPU, OPENVINO))
    with pytest.raises(ValueError, match="device 'tpu'"):
        choose_variant(bundle, "tpu")


def test_variants_no_order_names_come_last_in_the_manifests_order() -> None:
    bundle = manifest({"cpu-zeta": (CPU, "int8"), "cpu-fp32": (CPU, "fp32"), "cpu-alpha": (CPU, "int8")})
    assert cpu_order(bundle, VNNI) == ["cpu-fp32", "cpu-zeta", "cpu-alpha"]
    assert choose_variant(manifest({"cpu-zeta": (CPU, "int8")}), can_run=runs(CPU)) == "cpu-zeta"


def test_auto_times_the_guarded_runnable_cpu_variants_in_the_familys_order() -> None:
    bundle = manifest(EVERY_VARIANT, source={"refused_variants": {"openvino-bf16": "label agreement 98.1% < 99%"}})
    bundle.variants["openvino-int8"].parity = {"max_abs_diff": 0.7}  # no judgment: not guarded
    names, skipped = timing_candidates(bundle, can_run=runs(CPU), family=VNNI)
    assert names == ["cpu-int8-static", "cpu-int8", "cpu-fp32"]
    assert skipped == {
        "openvino-int8-static": "needs OpenVINO, which this process cannot import",
        "openvino-int8": "no accuracy-guard judgment in the manifest (not guarded at export)",
        "openvino-bf16": "refused by its accuracy guard at export: label agreement 98.1% < 99%",
    }  # GPU graphs are no CPU candidates at all
    names, _ = timing_candidates(bundle, can_run=runs(CPU, OPENVINO), family=AVX2)
    assert names == ["cpu-int8-static", "cpu-int8", "openvino-int8-static", "cpu-fp32"]  # ties go to the earlier


def judged_dependent(bundle: BundleManifest, name: str, max_abs_diff: float = 0.31) -> None:
    """Mark `name` as judged not batch invariant at export, as export/invariance.py writes it."""
    bundle.variants[name].batch_invariant = False
    bundle.variants[name].batch_invariance = {
        "max_abs_diff": max_abs_diff,
        "tolerance": 0.01,
        "worst_shape": "same length",
    }


def test_a_variant_judged_batch_dependent_never_serves_batches_by_default_or_in_auto() -> None:
    bundle = manifest(EVERY_VARIANT)
    judged_dependent(bundle, "cpu-int8-static")
    judged_dependent(bundle, "openvino-int8-static")
    assert choose_variant(bundle, can_run=runs(CPU), family=AVX2) == "cpu-int8"
    assert choose_variant(bundle, can_run=runs(CPU, OPENVINO), family=VNNI) == "openvino-int8"
    judged_dependent(bundle, "cpu-int8")
    assert choose_variant(bundle, can_run=runs(CPU), family=AVX2) == "cpu-fp32"
    assert choose_variant(bundle, can_run=runs(CPU), family=AVX2, batched=False) == "cpu-int8-static"
    names, skipped = timing_candidates(bundle, can_run=runs(CPU), family=AVX2)
    assert names == ["cpu-fp32"]
    assert skipped["cpu-int8"] == (
        "not batch invariant at export: max |diff| 0.31 between inputs alone and batched (same length; limit 0.01 "
        "for int8): a request's answer would depend on its batchmates"
    )
    assert timing_candidates(bundle, can_run=runs(CPU), family=AVX2, batched=False)[0][:2] == [
        "cpu-int8-static",
        "cpu-int8",
    ]


def test_the_gpu_variant_judged_batch_dependent_gives_way_to_the_cpu() -> None:
    bundle = manifest(EVERY_VARIANT)
    judged_dependent(bundle, "gpu-fp16")
    assert choose_variant(bundle, can_run=runs(CPU, CUDA), family=AVX2) == "cpu-int8-static"


def test_a_forced_batch_dependent_variant_serves_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    bundle = manifest(EVERY_VARIANT)
    judged_dependent(bundle, "cpu-int8")
    with caplog.at_level(logging.WARNING, logger="bundles.variant_choice"):
        assert choose_variant(bundle, forced="cpu-int8", can_run=runs(CPU)) == "cpu-int8"
    assert "cpu-int8 of bundle m serves as forced, but a request's answer may depend on" in caplog.text
    assert "(not batch invariant at export: max |diff| 0.31" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bundles.variant_choice"):
        choose_variant(bundle, forced="cpu-int8", can_run=runs(CPU), batched=False)
        choose_variant(bundle, forced="cpu-int8-static", can_run=runs(CPU))
    assert not caplog.records


def test_a_bundle_without_a_batch_invariant_variant_is_refused_naming_why() -> None:
    bundle = manifest({"cpu-int8": (CPU, "int8")})
    judged_dependent(bundle, "cpu-int8")
    with pytest.raises(ValueError, match=r"can run on auto that may serve batches \(cpu-int8: not batch invariant"):
        choose_variant(bundle, can_run=runs(CPU))
    assert choose_variant(bundle, can_run=runs(CPU), batched=False) == "cpu-int8"


def test_a_manifest_written_before_the_judgment_loads_and_its_int8_variants_count_as_batch_dependent(
    tmp_path: Path,
) -> None:
    """Old manifests have no batch_invariant field: they load, and their int8 variants (ONNX Runtime's dynamic one
    among them then) are not served batched; float ones are, as each of their rows is computed on its own."""
    bundle = manifest(EVERY_VARIANT)
    data = asdict(bundle)
    for spec in data["variants"].values():
        del spec["batch_invariant"], spec["batch_invariance"]
        (tmp_path / spec["file"]).write_bytes(b"")
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    old = BundleManifest.read(tmp_path)
    assert {spec.batch_invariant for spec in old.variants.values()} == {None}
    assert all(spec.batch_invariance == {} for spec in old.variants.values())
    assert batch_dependence(old.variants["cpu-int8"]) == (
        "no batch-invariance judgment in the manifest, taken as batch-dependent for int8 (re-export the bundle)"
    )
    assert batch_dependence(old.variants["cpu-fp32"]) is None
    assert batch_dependence(old.variants["gpu-fp16"]) is None
    assert choose_variant(old, can_run=runs(CPU), family=AVX2) == "cpu-fp32"
    assert choose_variant(old, can_run=runs(CPU, OPENVINO), family=AVX2) == "openvino-bf16"
    assert choose_variant(old, can_run=runs(CPU, CUDA), family=AVX2) == "gpu-fp16"
