"""CPU identification from /proc/cpuinfo texts of the two machine families this project runs on."""

from __future__ import annotations

from bundles.hardware import read_cpu_info

# Shortened /proc/cpuinfo of an Intel Xeon with AMX (Emerald Rapids, family 6 model 207) and of an AMD EPYC
# Zen 4 (Genoa, family 25 model 17: AVX-512 VNNI and BF16, no AMX); the lines read are kept verbatim.
AMX_XEON = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 207
model name\t: INTEL(R) XEON(R) PLATINUM 8580
stepping\t: 2
cpu MHz\t\t: 2000.000
flags\t\t: fpu vme sse sse2 avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl avx_vnni avx512_bf16 \
avx512vbmi avx512_vbmi2 avx512_vnni avx512_bitalg avx512_vpopcntdq amx_bf16 avx512_fp16 amx_tile amx_int8

processor\t: 1
vendor_id\t: GenuineIntel
cpu MHz\t\t: 2000.000
"""
EPYC_ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 9454 48-Core Processor
cpu MHz\t\t: 2750.000
flags\t\t: fpu vme sse sse2 avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 avx512vbmi \
avx512_vbmi2 avx512_vnni avx512_bitalg avx512_vpopcntdq
"""


def test_an_amx_xeon_is_named_with_its_matrix_features() -> None:
    cpu = read_cpu_info(AMX_XEON, cores=2)
    assert (cpu.model_name, cpu.vendor, cpu.family, cpu.model, cpu.cores) == (
        "INTEL(R) XEON(R) PLATINUM 8580",
        "GenuineIntel",
        6,
        207,
        2,
    )
    assert cpu.mhz == 2000.0 and cpu.microarchitecture == "Emerald Rapids" and cpu.matrix_family == "AMX"
    assert cpu.features() == {
        "amx_int8": True,
        "amx_bf16": True,
        "avx512_vnni": True,
        "avx512_bf16": True,
        "avx512f": True,
        "avx_vnni": True,
    }
    summary = cpu.summary()
    assert summary.startswith("INTEL(R) XEON(R) PLATINUM 8580 (Emerald Rapids), 2 cores at 2.00 GHz; AMX;")
    assert "amx_int8" in summary


def test_an_epyc_zen4_has_vnni_and_bf16_but_no_amx() -> None:
    cpu = read_cpu_info(EPYC_ZEN4, cores=4)
    assert cpu.microarchitecture == "Zen 4" and cpu.matrix_family == "AVX-512 VNNI (no AMX)"
    features = cpu.features()
    assert features["avx512_vnni"] and features["avx512_bf16"] and features["avx512f"]
    assert not features["amx_int8"] and not features["amx_bf16"] and not features["avx_vnni"]
    described = cpu.describe()
    assert described["flags"] == ["avx512_bf16", "avx512_vnni", "avx512f"]
    assert described["model_name"] == "AMD EPYC 9454 48-Core Processor" and described["cores"] == 4


def test_an_unreadable_cpuinfo_still_describes_the_process() -> None:
    cpu = read_cpu_info("", cores=1)
    assert cpu.model_name == "" and cpu.matrix_family == "no VNNI" and cpu.summary().startswith("unknown CPU")
