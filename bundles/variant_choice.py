"""Which variant of a bundle serves: the one module that decides it.

A bundle is exported once and may be served on any machine, so the choice is made where it is served, from the
serving CPU (`bundles.hardware`) and the runtimes this process can load (`bundles.runtimes`):

1. a forced variant (`--variant NAME`): it must be in the bundle, and its runtime must load here; one that is not
   batch invariant serves with a warning;
2. on a GPU (CUDA in this ONNX Runtime, and the device `auto` or `cuda`): the bundle's GPU variant;
3. else the first variant of this CPU family's order (`CPU_ORDERS`) that the bundle holds and whose runtime this
   process can run (without OpenVINO, the first ONNX Runtime one).
In 2 and 3, and for a batching server, only batch-invariant variants (`batch_dependence`): an answer must not
depend on the requests computed beside it. The export judges each variant (export/invariance.py, the manifest's
`VariantSpec.batch_invariant`); a manifest written before that judgment says nothing, and then an int8 variant is
taken as batch-dependent (the int8 variants of those exports included ONNX Runtime's dynamic one, which quantizes
with one scale per batch) and a float one as invariant (each row's arithmetic is its own): re-exporting judges them.

`--variant auto` times the same CPU variants in the same order and breaks ties by it (`timing_candidates`).
Variants no order names (a bundle written by hand) come after the named ones, in the manifest's order.

CPU families, by what their int8 matrix multiplies run on (docs/benchmarks.md, "Model benchmark", has the figures):
- `vnni`: AVX-512 VNNI, AVX-VNNI or AMX. OpenVINO's int8 kernels lead there, the statically calibrated graph first:
  it served more answers per second than openvino-int8 in alternated load tests on an AMX CPU and leads
  `make bench` on AMD Zen 4.
  Without OpenVINO, ONNX Runtime's int8 with fixed activation scales (cpu-int8-static), which runs the same
  kernels as its dynamic int8 (cpu-int8) and is batch invariant.
- `avx2`: x86 with AVX2 and no VNNI (AMD Zen 3, Intel before Ice Lake). ONNX Runtime's int8 kernels are the fastest
  there by a wide margin: the statically calibrated graph (cpu-int8-static), about as fast as the dynamic one
  (cpu-int8), which is batch-dependent; OpenVINO's variants follow in their measured order.
A CPU of neither family (no AVX2, or not x86) takes the `vnni` order: nothing was measured there.
Torch-free and onnx-free.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping

from bundles.hardware import CpuInfo, read_cpu_info
from bundles.runtimes import CPU_RUNTIMES, CUDA_PROVIDER, can_run
from bundles.spec import BundleManifest, VariantSpec

log = logging.getLogger(__name__)

VNNI = "vnni"
AVX2 = "avx2"
CPU_ORDERS: Mapping[str, tuple[str, ...]] = {
    VNNI: ("openvino-int8-static", "openvino-int8", "openvino-bf16", "cpu-int8-static", "cpu-int8", "cpu-fp32"),
    AVX2: ("cpu-int8-static", "cpu-int8", "openvino-bf16", "openvino-int8", "openvino-int8-static", "cpu-fp32"),
}
"""CPU family -> the CPU variants, preferred first (see the module docstring)."""
GPU_ORDER: tuple[str, ...] = ("gpu-fp16",)
"""The GPU variants, preferred first."""
DEVICES = ("auto", "cpu", "cuda")

CanRun = Callable[[str], bool]
"""provider -> whether the runtime that serves the variant can run it."""


def cpu_family(cpu: CpuInfo | None = None) -> str:
    """`vnni` or `avx2` (a key of CPU_ORDERS) for `cpu`, default this machine's."""
    info = cpu if cpu is not None else this_cpu()
    if info.matrix_family == "no VNNI" and info.has("avx2"):
        return AVX2
    return VNNI


@functools.cache
def this_cpu() -> CpuInfo:
    return read_cpu_info()


def cpu_order(manifest: BundleManifest, family: str | None = None) -> list[str]:
    """The bundle's CPU variants (ONNX Runtime CPU or OpenVINO), preferred first on `family` (default: this CPU's);
    variants no order names come last, in the manifest's order."""
    order = CPU_ORDERS[family or cpu_family()]
    cpu = [name for name, spec in manifest.variants.items() if spec.provider in CPU_RUNTIMES]
    return [name for name in order if name in cpu] + [name for name in cpu if name not in order]


def batch_dependence(spec: VariantSpec) -> str | None:
    """Why variant `spec` must not serve batches (a request's answer would depend on its batchmates), or None."""
    if spec.batch_invariant is False:
        figures = spec.batch_invariance
        if "max_abs_diff" not in figures:
            return "not batch invariant at export"
        where = f"{figures['worst_shape']}; " if figures.get("worst_shape") else ""
        return (
            f"not batch invariant at export: max |diff| {figures['max_abs_diff']:.3g} between inputs alone and batched "
            f"({where}limit {figures.get('tolerance', 0.0):g} for {spec.precision})"
        )
    if spec.batch_invariant is None and spec.precision == "int8":
        return "no batch-invariance judgment in the manifest, taken as batch-dependent for int8 (re-export the bundle)"
    return None


def choose_variant(
    manifest: BundleManifest,
    device: str = "auto",
    forced: str | None = None,
    *,
    can_run: CanRun = can_run,
    family: str | None = None,
    runtime: str = "this process",
    batched: bool = True,
) -> str:
    """The variant that serves `manifest` on `device` (see the module docstring); raises ValueError naming the
    choices when none can. `can_run` says which providers `runtime` (named in the errors) runs; `batched`: whether
    the server computes several requests' inputs in one call (then only batch-invariant variants are chosen)."""
    if device not in DEVICES:
        raise ValueError(f"device {device!r} is not one of {DEVICES}")
    if forced is not None:
        return _forced(manifest, forced, can_run, runtime, batched)
    if device == "cuda" and not can_run(CUDA_PROVIDER):
        raise ValueError(f"device cuda was asked for, but {runtime} has no {CUDA_PROVIDER}")
    refused = _batch_dependent(manifest) if batched else {}
    candidates = [name for name in GPU_ORDER if name in manifest.variants] if device != "cpu" else []
    candidates = candidates if can_run(CUDA_PROVIDER) else []
    candidates += cpu_order(manifest, family)
    for name in candidates:
        if name not in refused and can_run(manifest.variants[name].provider):
            return name
    message = f"bundle {manifest.name!r} has no variant {runtime} can run on {device}"
    if refused:
        why = "; ".join(f"{name}: {reason}" for name, reason in refused.items())
        message += f" that may serve batches ({why}; force one with --variant NAME, or turn batching off)"
    raise ValueError(f"{message}: its variants are {_listed(manifest)}")


def _batch_dependent(manifest: BundleManifest) -> dict[str, str]:
    """Variant -> why it must not serve batches, for the bundle's variants that must not."""
    found = {name: batch_dependence(spec) for name, spec in manifest.variants.items()}
    return {name: why for name, why in found.items() if why is not None}


def _forced(manifest: BundleManifest, forced: str, can_run: CanRun, runtime: str, batched: bool) -> str:
    if forced not in manifest.variants:
        raise ValueError(f"bundle {manifest.name!r} has no variant {forced!r}: its variants are {_listed(manifest)}")
    provider = manifest.variants[forced].provider
    if not can_run(provider):
        raise ValueError(f"variant {forced!r} of bundle {manifest.name!r} needs {provider}, which {runtime} cannot run")
    why = batch_dependence(manifest.variants[forced]) if batched else None
    if why is not None:
        log.warning(
            "variant %s of bundle %s serves as forced, but a request's answer may depend on the requests batched with "
            "it (%s): serve a batch-invariant variant, or turn batching off",
            forced,
            manifest.name,
            why,
        )
    return forced


def _listed(manifest: BundleManifest) -> str:
    return ", ".join(sorted(manifest.variants))


def times_cpu_variants(device: str, can_run: CanRun = can_run) -> bool:
    """Whether `--variant auto` times CPU variants: it serves on the CPU (on a GPU the GPU variant serves)."""
    return device == "cpu" or (device == "auto" and not can_run(CUDA_PROVIDER))


def timing_candidates(
    manifest: BundleManifest, *, can_run: CanRun = can_run, family: str | None = None, batched: bool = True
) -> tuple[list[str], dict[str, str]]:
    """What `--variant auto` times: the CPU variants that passed their accuracy guard at export (their parity
    figures carry its `judgment`; one named in `source.refused_variants` never does), that may serve batches (when
    `batched`: see `batch_dependence`) and that this process runs, in this CPU's order (which breaks ties); and
    variant -> why each other CPU variant is left out."""
    refused = manifest.source.get("refused_variants") or {}
    chosen: list[str] = []
    skipped: dict[str, str] = {}
    for name in cpu_order(manifest, family):
        spec = manifest.variants[name]
        dependence = batch_dependence(spec) if batched else None
        if name in refused:
            skipped[name] = f"refused by its accuracy guard at export: {refused[name]}"
        elif "judgment" not in spec.parity:
            skipped[name] = "no accuracy-guard judgment in the manifest (not guarded at export)"
        elif dependence is not None:
            skipped[name] = f"{dependence}: a request's answer would depend on its batchmates"
        elif not can_run(spec.provider):
            skipped[name] = f"needs {spec.provider}, which this process cannot import"
        else:
            chosen.append(name)
    return chosen, skipped
