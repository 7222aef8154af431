"""The runtime settings of an opened variant: OpenVINO's compile properties per stream count, and what a variant
computes at once."""

from __future__ import annotations

import pytest

from bundles.runtimes import CPU_PROVIDER, OPENVINO_PROVIDER, RuntimeSettings, openvino_configs

BF16 = {"INFERENCE_PRECISION_HINT": "bf16"}


def test_openvino_compiles_for_latency_on_one_stream_and_for_throughput_with_a_latency_copy_on_more() -> None:
    assert openvino_configs(BF16, RuntimeSettings(openvino_streams=1)) == (
        {"PERFORMANCE_HINT": "LATENCY", **BF16},
        None,
    )
    streams, lone = openvino_configs(BF16, RuntimeSettings())  # the service's defaults: 2 streams, a latency copy
    assert streams == {"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": "2", **BF16}
    assert lone == {"PERFORMANCE_HINT": "LATENCY", **BF16}
    threads = RuntimeSettings(intra_op_threads=2, openvino_streams=3, openvino_lone_latency=False)
    assert openvino_configs({}, threads) == (
        {"PERFORMANCE_HINT": "THROUGHPUT", "INFERENCE_NUM_THREADS": 2, "NUM_STREAMS": "3"},
        None,
    )


def test_streams_and_the_latency_copy_belong_to_openvino_variants() -> None:
    settings = RuntimeSettings(openvino_streams=2)
    assert (settings.concurrency(OPENVINO_PROVIDER), settings.lone_copy(OPENVINO_PROVIDER)) == (2, True)
    assert (settings.concurrency(CPU_PROVIDER), settings.lone_copy(CPU_PROVIDER)) == (1, False)
    assert not RuntimeSettings(openvino_streams=1).lone_copy(OPENVINO_PROVIDER)
    with pytest.raises(ValueError, match="streams >= 1"):
        RuntimeSettings(openvino_streams=0)
