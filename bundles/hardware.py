"""Which CPU this process runs on: model name, cores, and the matrix features that decide int8 / bf16 speed.

Read from Linux's /proc/cpuinfo (the `vendor_id`, `cpu family`, `model`, `model name`, `cpu MHz` and `flags`
lines of the first processor) and the cores this process may run on (sched_getaffinity). Torch-free: the
model benchmark (export) and the service benchmark both record it, so every figure says which machine made it.

The features that matter for BERT inference (flag names as the Linux kernel spells them):
- `amx_int8`, `amx_bf16` (with `amx_tile`): Intel AMX tile matrix multiply (Sapphire Rapids and later Xeons);
- `avx512_vnni`: int8 dot products in AVX-512 registers (VPDPBUSD);
- `avx512_bf16`: bf16 dot products in AVX-512 registers (VDPBF16PS);
- `avx512f`: AVX-512 itself.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FEATURE_FLAGS = ("amx_int8", "amx_bf16", "avx512_vnni", "avx512_bf16", "avx512f", "avx_vnni")
"""The /proc/cpuinfo flags recorded with every benchmark, in this order."""

INTEL_MODELS = {143: "Sapphire Rapids", 207: "Emerald Rapids", 173: "Granite Rapids", 106: "Ice Lake-SP"}
"""Intel family-6 server model numbers -> code name (a VM's model name often says only "Intel Xeon")."""


@dataclass(frozen=True)
class CpuInfo:
    model_name: str
    vendor: str
    family: int
    model: int
    cores: int
    """Cores (logical CPUs) this process may run on."""
    mhz: float
    """The clock /proc/cpuinfo reports for the first CPU (nominal on most servers and VMs; turbo not counted)."""
    flags: frozenset[str] = field(default_factory=frozenset)

    def has(self, flag: str) -> bool:
        return flag in self.flags

    @property
    def microarchitecture(self) -> str:
        """A code name where the family/model numbers say it (`Zen 4`, `Sapphire Rapids`), else ""."""
        if self.vendor == "AuthenticAMD":
            if self.family == 26:
                return "Zen 5"
            if self.family == 25:  # Zen 3 and Zen 4 share the family; only Zen 4 has AVX-512
                return "Zen 4" if self.has("avx512f") else "Zen 3"
        if self.vendor == "GenuineIntel" and self.family == 6:
            return INTEL_MODELS.get(self.model, "")
        return ""

    @property
    def matrix_family(self) -> str:
        """The int8 / bf16 class of the machine: `AMX`, `AVX-512 VNNI (no AMX)`, `AVX-VNNI` or `no VNNI`."""
        if self.has("amx_int8"):
            return "AMX"
        if self.has("avx512_vnni"):
            return "AVX-512 VNNI (no AMX)"
        if self.has("avx_vnni"):
            return "AVX-VNNI"
        return "no VNNI"

    def features(self) -> dict[str, bool]:
        return {flag: self.has(flag) for flag in FEATURE_FLAGS}

    def describe(self) -> dict[str, Any]:
        """JSON-ready: every field, the feature booleans, the code name and the matrix family."""
        data = asdict(self)
        data["flags"] = sorted(self.flags & set(FEATURE_FLAGS))
        data.update(
            features=self.features(), microarchitecture=self.microarchitecture, matrix_family=self.matrix_family
        )
        return data

    def summary(self) -> str:
        """One line: `Intel(R) Xeon(R) Processor (Emerald Rapids), 2 cores at 2.10 GHz; AMX; amx_int8 ...`."""
        arch = f" ({self.microarchitecture})" if self.microarchitecture else ""
        present = [flag for flag in FEATURE_FLAGS if self.has(flag)]
        return (
            f"{self.model_name or 'unknown CPU'}{arch}, {self.cores} cores at {self.mhz / 1000:.2f} GHz; "
            f"{self.matrix_family}; features: {', '.join(present) or 'none of ' + ', '.join(FEATURE_FLAGS)}"
        )


def read_cpu_info(cpuinfo: str | None = None, cores: int | None = None) -> CpuInfo:
    """This machine's CPU, or the one `cpuinfo` (a /proc/cpuinfo text) describes."""
    text = cpuinfo if cpuinfo is not None else _read("/proc/cpuinfo")
    return CpuInfo(
        model_name=_field(text, "model name"),
        vendor=_field(text, "vendor_id"),
        family=_int(_field(text, "cpu family")),
        model=_int(_field(text, "model")),
        cores=cores or usable_cores(),
        mhz=float(_field(text, "cpu MHz") or 0.0),
        flags=frozenset(_field(text, "flags").split()),
    )


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _field(text: str, name: str) -> str:
    """The value of the first `name : value` line (the first processor's)."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return ""


def _int(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        return 0
