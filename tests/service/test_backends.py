"""Variant choice and the in-process backends (ONNX Runtime, OpenVINO) on a tiny bundle, without a server."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from bert_model.tasks.features import Feature
from bundles.hardware import read_cpu_info
from bundles.runtimes import OpenVinoVariant
from bundles.spec import BundleManifest
from bundles.variant_choice import choose_variant
from service.backends.ort_backend import OrtBackend, openvino_width_multiple
from tests.bundles.test_hardware import AMX_XEON, EPYC_ZEN4
from tests.service.tiny_bundles import with_openvino_variant


def test_the_backend_serves_the_variant_the_choice_names(tiny_bundles: dict[str, Path], tmp_path: Path) -> None:
    """Without a forced variant the backend serves `variant_choice`'s pick for this machine; a forced one is checked
    there too."""
    folder = with_openvino_variant(tiny_bundles["classify"], tmp_path)
    bundle = BundleManifest.read(folder)
    backend = OrtBackend(folder, bundle, device="cpu")
    assert (backend.variant, backend.provider) == ("cpu-fp32", "CPUExecutionProvider")  # openvino-fp32: no order
    assert backend.variant == choose_variant(bundle, "cpu")
    with pytest.raises(ValueError, match="has no variant 'nope': its variants are cpu-fp32, openvino-fp32"):
        OrtBackend(folder, bundle, variant="nope")


@pytest.mark.parametrize("task", ["classify", "ner"])
def test_openvino_and_onnxruntime_agree(tiny_bundles: dict[str, Path], tmp_path: Path, task: str) -> None:
    pytest.importorskip("openvino", reason="the optional openvino extra is not installed")
    folder = with_openvino_variant(tiny_bundles[task], tmp_path)
    bundle = BundleManifest.read(folder)
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 5000, size=(3, 17)).astype(np.int64)
    inputs = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}

    async def run(variant: str) -> tuple[str, dict[str, np.ndarray]]:
        backend = OrtBackend(folder, bundle, variant=variant)
        await backend.start()
        try:
            return backend.kind, await backend.infer(inputs)
        finally:
            await backend.close()

    kind_ov, openvino = asyncio.run(run("openvino-fp32"))
    kind_ort, onnxruntime = asyncio.run(run("cpu-fp32"))
    assert (kind_ov, kind_ort) == ("openvino", "ort")
    for name, value in onnxruntime.items():
        np.testing.assert_allclose(openvino[name], value, atol=2e-2)  # OpenVINO computes in bf16 on AMX CPUs


def test_openvino_streams_give_the_same_answers(tiny_bundles: dict[str, Path], tmp_path: Path) -> None:
    """--openvino-streams 2: the compiled model has two streams, and two calls in flight (two worker threads,
    one infer request each) give the answers one stream gives."""
    pytest.importorskip("openvino", reason="the optional openvino extra is not installed")
    folder = with_openvino_variant(tiny_bundles["classify"], tmp_path)
    bundle = BundleManifest.read(folder)
    rng = np.random.default_rng(1)
    feeds = []
    for length in (9, 23):
        ids = rng.integers(1000, 5000, size=(2, length)).astype(np.int64)
        feeds.append({"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)})

    async def run(streams: int) -> tuple[int, list[dict[str, np.ndarray]]]:
        backend = OrtBackend(folder, bundle, variant="openvino-fp32", workers=streams, openvino_streams=streams)
        await backend.start()
        try:
            answers = await asyncio.gather(*(backend.infer(feed) for feed in feeds))
            assert isinstance(backend._runtime, OpenVinoVariant)
            return int(backend._runtime.compiled.get_property("NUM_STREAMS")), answers
        finally:
            await backend.close()

    (one, single), (two, double) = asyncio.run(run(1)), asyncio.run(run(2))
    assert (one, two) == (1, 2)
    for left, right in zip(single, double, strict=True):
        np.testing.assert_allclose(left["logits"], right["logits"], atol=1e-5)


FIRST_CALLS_AT_ONCE = """
import sys, threading
from pathlib import Path
import numpy as np
from bundles.runtimes import open_variant
from bundles.spec import BundleManifest
folder = Path(sys.argv[1])
manifest = BundleManifest.read(folder)
spec = manifest.variants["openvino-fp32"]
variant = open_variant(folder / spec.file, spec, manifest.output_names)
ids = np.ones((4, 16), dtype=np.int64)
feed = {"input_ids": ids, "attention_mask": ids, "token_type_ids": np.zeros_like(ids)}
start = threading.Barrier(8)
def call():
    start.wait()
    variant.run(feed)
threads = [threading.Thread(target=call) for _ in range(8)]
[thread.start() for thread in threads]
[thread.join() for thread in threads]
print("answered")
"""


def test_the_first_calls_of_an_openvino_variant_from_many_threads_at_once_all_return(
    tiny_bundles: dict[str, Path], tmp_path: Path
) -> None:
    """OpenVINO's binding sets up its numpy statics on a first call; first calls from two threads at once could
    deadlock there (a server hung at warm-up; without the first calls made when the variant opens, 3 of 10 fresh
    processes of this script hung while another process kept a core busy, 0 of 20 with them)."""
    pytest.importorskip("openvino", reason="the optional openvino extra is not installed")
    import subprocess
    import sys

    folder = with_openvino_variant(tiny_bundles["classify"], tmp_path)
    for _ in range(4):  # a fresh process each: the statics are set up once per process
        done = subprocess.run(
            [sys.executable, "-c", FIRST_CALLS_AT_ONCE, str(folder)], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0 and done.stdout.strip() == "answered", done.stderr[-2000:]


def test_a_lone_batch_runs_on_the_latency_copy_and_others_on_streams(
    tiny_bundles: dict[str, Path], tmp_path: Path
) -> None:
    """Streams 2 with the latency copy: `infer_alone` with nothing in flight takes the copy (one stream, all cores);
    calls that start while it runs wait for it and then share the streams; `infer_alone` while a stream call runs
    and plain `infer` take a stream; every answer equals the copy-less backend's."""
    pytest.importorskip("openvino", reason="the optional openvino extra is not installed")
    folder = with_openvino_variant(tiny_bundles["classify"], tmp_path)
    bundle = BundleManifest.read(folder)
    rng = np.random.default_rng(2)
    feeds = []
    for length in (7, 12, 19, 30, 41):
        ids = rng.integers(1000, 5000, size=(2, length)).astype(np.int64)
        feeds.append({"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)})

    async def run(lone_latency: bool) -> tuple[list[int], list[dict[str, np.ndarray]]]:
        backend = OrtBackend(
            folder, bundle, variant="openvino-fp32", openvino_streams=2, openvino_lone_latency=lone_latency
        )
        await backend.start()
        try:
            assert backend.concurrency == 2 and backend._executor._max_workers == 2
            answers = [await backend.infer_alone(feeds[0]), await backend.infer(feeds[1])]
            counts = [backend.lone_calls]  # 1: the first call only
            answers += await asyncio.gather(
                backend.infer_alone(feeds[2]), backend.infer(feeds[3]), backend.infer(feeds[4])
            )
            counts.append(backend.lone_calls)  # 2: the lone one started first, the others waited for it
            answers += await asyncio.gather(backend.infer(feeds[0]), backend.infer_alone(feeds[1]))
            counts.append(backend.lone_calls)  # still 2: a stream call was in flight
            assert backend._calls == 0 and backend._lone_done is None
            runtime = backend._runtime
            assert isinstance(runtime, OpenVinoVariant)
            counts.append(int(runtime.compiled.get_property("NUM_STREAMS")))
            if runtime.compiled_lone is not None:
                counts.append(int(runtime.compiled_lone.get_property("NUM_STREAMS")))
            return counts, answers
        finally:
            await backend.close()

    with_copy, answers = asyncio.run(run(True))
    assert with_copy == [1, 2, 2, 2, 1]  # lone calls after each step; streams 2, the copy 1
    without, plain = asyncio.run(run(False))
    assert without == [0, 0, 0, 2]
    for left, right in zip(answers, plain, strict=True):
        np.testing.assert_allclose(left["logits"], right["logits"], atol=1e-5)


def test_openvino_batches_are_padded_to_multiples_of_16_with_unchanged_answers(
    tiny_bundles: dict[str, Path], tmp_path: Path
) -> None:
    """An OpenVINO variant asks for this CPU's width multiple (16 with VNNI or AMX, else the longest row); through
    the batcher, the NER model's per-token logits of rows of 9 and 23 tokens, padded to 32, equal those padded to 23."""
    pytest.importorskip("openvino", reason="the optional openvino extra is not installed")
    from service.engine.batcher import BatchConfig, Batcher

    folder = with_openvino_variant(tiny_bundles["ner"], tmp_path)
    bundle = BundleManifest.read(folder)
    rng = np.random.default_rng(2)

    features = [Feature(0, list(rng.integers(1000, 5000, size=n)), [0] * n) for n in (9, 23)]

    async def run(variant: str, multiple: int | None) -> tuple[int, list[tuple[int, int]], list[np.ndarray]]:
        backend = OrtBackend(folder, bundle, variant=variant)
        widths: list[tuple[int, int]] = []

        async def infer(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            widths.append(inputs["input_ids"].shape)
            return await backend.infer(inputs)

        config = BatchConfig(
            max_batch_size=8,
            width_multiple=multiple or backend.width_multiple,
            max_width=bundle.max_seq_length,
        )
        batcher = Batcher("ner", infer, config, output_names=bundle.output_names, sequence_outputs=bundle.output_names)
        await backend.start()
        await batcher.start()
        try:
            result = await batcher.submit(features, time.perf_counter() + 30)
            return backend.width_multiple, widths, [row["logits"] for row in result.outputs]
        finally:
            await batcher.close()
            await backend.close()

    multiple, widths, _ = asyncio.run(run("openvino-fp32", None))
    assert multiple == openvino_width_multiple(read_cpu_info())  # this machine's rule
    _, widths, rounded = asyncio.run(run("openvino-fp32", 16))
    assert widths == [(2, 32)]
    _, widths, exact = asyncio.run(run("openvino-fp32", 1))
    assert widths == [(2, 23)]
    for row, (left, right) in enumerate(zip(rounded, exact, strict=True)):
        assert left.shape[0] == len(features[row].input_ids)
        np.testing.assert_allclose(left, right, atol=1e-4)
    onnxruntime_multiple, widths, _ = asyncio.run(run("cpu-fp32", None))
    assert (onnxruntime_multiple, widths) == (1, [(2, 23)])


def test_onnx_runtime_variants_run_one_batch_at_a_time(tiny_bundles: dict[str, Path]) -> None:
    folder = tiny_bundles["classify"]
    backend = OrtBackend(folder, BundleManifest.read(folder), variant="cpu-fp32", openvino_streams=2)
    assert backend.concurrency == 1 and backend._executor._max_workers == 1
    asyncio.run(backend.close())


def test_backend_errors_are_domain_errors(tiny_bundles: dict[str, Path]) -> None:
    from service.errors import BackendError

    folder = tiny_bundles["classify"]
    bundle = BundleManifest.read(folder)

    async def go() -> None:
        backend = OrtBackend(folder, bundle)
        await backend.start()
        try:
            with pytest.raises(BackendError, match="ONNX Runtime failed"):
                bad = np.full((1, 4), 10**9, dtype=np.int64)  # ids far outside the vocabulary
                await backend.infer({"input_ids": bad, "attention_mask": np.ones_like(bad), "token_type_ids": bad})
        finally:
            await backend.close()

    asyncio.run(go())


def test_openvino_pads_to_16_only_where_its_kernels_gain_from_it() -> None:
    zen3 = EPYC_ZEN4.replace(" avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 avx512vbmi", "").replace(
        "avx512_vbmi2 avx512_vnni avx512_bitalg avx512_vpopcntdq", ""
    )
    assert read_cpu_info(zen3).matrix_family == "no VNNI"
    widths = {text: openvino_width_multiple(read_cpu_info(text)) for text in (AMX_XEON, EPYC_ZEN4, zen3)}
    assert widths == {AMX_XEON: 16, EPYC_ZEN4: 16, zen3: 1}
