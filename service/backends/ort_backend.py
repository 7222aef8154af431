"""In-process backend: ONNX Runtime (or OpenVINO for OpenVINO variants); runs batches off the event loop.

Which variant serves is `bundles.variant_choice`'s decision (a forced one, the GPU variant when CUDA is
there, else the first of this CPU family's order that this process can run: without the optional `openvino`
extra, an ONNX Runtime one). `start_fastest_cpu_variant` (`--variant auto` on a CPU) instead times that module's
candidates on this machine and serves the fastest (`service.backends.variant_timing`).
The variant is opened by `bundles.runtimes.open_variant` with the service's thread and stream settings, as
the export's accuracy guard opens it; this module runs its batches on worker threads and keeps a lone batch of an
OpenVINO variant on the latency copy apart from the batches on its streams.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bert_model.tokenization import BertTokenizer
from bundles.hardware import CpuInfo, read_cpu_info
from bundles.runtimes import OPENVINO_PROVIDER, OpenedVariant, RuntimeSettings, open_variant
from bundles.spec import BundleManifest
from bundles.variant_choice import choose_variant, timing_candidates
from service.backends.variant_timing import FILLER_TEXT, VariantChoice, choose_fastest, timing_feed, timing_shapes
from service.errors import BackendBroken, BackendError, BackendUnavailable
from service.operations.threads import INFER, thread_setup

log = logging.getLogger(__name__)


async def start_fastest_cpu_variant(
    bundle_dir: str | Path,
    manifest: BundleManifest,
    tokenizer: BertTokenizer,
    serving_length: int,
    *,
    max_batch_size: int,
    max_batch_tokens: int,
    budget_s: float,
    **options: Any,
) -> tuple[OrtBackend, VariantChoice]:
    """Time the guarded CPU variants this process can run and return the fastest, started (`options`: the
    OrtBackend thread settings); logs the table as one line. Raises ValueError when none can be served."""
    # a server that never batches may time variants whose answers depend on their batchmates
    names, skipped = timing_candidates(manifest, batched=max_batch_size > 1)
    shapes = timing_shapes(manifest.task, serving_length, max_batch_size, max_batch_tokens)
    filler = tokenizer.backend.encode(FILLER_TEXT, add_special_tokens=False).ids
    feeds = {shape.label: timing_feed(shape, tokenizer.cls_id, tokenizer.sep_id, filler) for shape in shapes}

    def make(name: str) -> OrtBackend:
        return OrtBackend(bundle_dir, manifest, device="cpu", variant=name, **options)

    backend, choice = await choose_fastest(names, make, feeds, budget_s, skipped=skipped)
    log.info("variant chosen by timing", extra={"model": manifest.name, "variant": choice.variant, **choice.describe()})
    assert isinstance(backend, OrtBackend)
    return backend, choice


OPENVINO_WIDTH_MULTIPLE = 16
"""Batch width multiple OpenVINO variants may prefer on CPUs with VNNI or AMX: their kernels can run a width that
is a multiple of 16 faster than the widths just below it (`python -m bertserve.benchmarks.widths`,
docs/benchmarks.md "Batch widths"). Whether they do depends on the CPU and the graph, so the engine times it at
warm-up (`service.engine.call_cost.measure_width_multiple`) and keeps it only where it pays. ONNX Runtime's CPU
kernels pay for every padded column, so its variants pad to the longest row."""


def openvino_width_multiple(cpu: CpuInfo) -> int:
    """The multiple an OpenVINO variant proposes: `OPENVINO_WIDTH_MULTIPLE` on CPUs with VNNI or AMX, 1 (the longest
    row, nothing to time) on those without: there OpenVINO's kernels pay for the padded columns as ONNX Runtime's
    do."""
    return 1 if cpu.matrix_family == "no VNNI" else OPENVINO_WIDTH_MULTIPLE


class OrtBackend:
    """One bundle variant on ONNX Runtime or OpenVINO, in this process."""

    kind = "ort"
    batches_itself = False

    def __init__(
        self,
        bundle_dir: str | Path,
        manifest: BundleManifest,
        *,
        device: str = "auto",
        variant: str | None = None,
        workers: int | None = None,
        batched: bool = True,
        **runtime: Any,
    ) -> None:
        """`runtime`: the `RuntimeSettings` fields (threads, spinning, OpenVINO streams), default the service's;
        `workers`: threads running calls (default: the batches the variant computes at once); `batched`: whether
        calls carry several requests' rows (when not, a batch-dependent variant may be chosen)."""
        self.bundle_dir = Path(bundle_dir)
        self.manifest = manifest
        self.variant = choose_variant(manifest, device, variant, batched=batched)
        self.provider = manifest.variants[self.variant].provider
        self.output_names = list(manifest.output_names)
        self.settings = RuntimeSettings(**runtime)
        self.kind = "openvino" if self.provider == OPENVINO_PROVIDER else "ort"
        self.width_multiple = openvino_width_multiple(read_cpu_info()) if self.kind == "openvino" else 1
        self._lone_copy = self.settings.lone_copy(self.provider)
        self._executor = ThreadPoolExecutor(
            max_workers=workers or self.concurrency,
            thread_name_prefix=f"ort-{manifest.name}",
            initializer=thread_setup(INFER),  # the runtime's pools, started from these threads, inherit the name
        )
        self._runtime: OpenedVariant | None = None
        self._closed = False
        self._calls = 0  # backend calls in flight (counted on the event loop)
        self._lone_done: asyncio.Event | None = None  # set when the running lone call ends
        self.lone_calls = 0
        """Calls that ran alone on the latency copy."""

    @property
    def concurrency(self) -> int:
        """Batches this backend computes at once: an OpenVINO variant's streams, else 1."""
        return self.settings.concurrency(self.provider)

    def _load(self) -> None:
        spec = self.manifest.variants[self.variant]
        self._runtime = open_variant(self.bundle_dir / spec.file, spec, self.output_names, self.settings)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._load)
        log.info("loaded %s variant %s on %s", self.manifest.name, self.variant, self.provider)

    def _run(
        self, inputs: dict[str, np.ndarray], lone: bool = False, extra: Sequence[str] = ()
    ) -> dict[str, np.ndarray]:
        runtime = self._runtime
        if runtime is None:
            raise BackendUnavailable(f"model {self.manifest.name!r} is not loaded")
        return runtime.run(inputs, alone=lone, extra=extra)

    async def time_call(self, inputs: dict[str, np.ndarray]) -> float:
        """Seconds one forward of `inputs` takes in the worker thread (what `--variant auto` compares)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._timed_run, inputs)

    def _timed_run(self, inputs: dict[str, np.ndarray]) -> float:
        start = time.perf_counter()
        self._run(inputs, lone=True)  # a timing call runs alone
        return time.perf_counter() - start

    async def infer(self, inputs: dict[str, np.ndarray], extra_outputs: Sequence[str] = ()) -> dict[str, np.ndarray]:
        """Run one batch (on a stream of the compiled graph; after the running lone call, if one runs)."""
        return await self._infer(inputs, False, extra_outputs)

    async def infer_alone(
        self, inputs: dict[str, np.ndarray], extra_outputs: Sequence[str] = ()
    ) -> dict[str, np.ndarray]:
        """Run a batch that nothing else competes with: on the latency copy (all cores) when there is one and no
        call is in flight, else as `infer`."""
        return await self._infer(inputs, True, extra_outputs)

    async def _infer(self, inputs: dict[str, np.ndarray], alone: bool, extra: Sequence[str]) -> dict[str, np.ndarray]:
        # Calls that start while a lone call runs wait for it, so the copy's threads and a stream's never share
        # the cores; `_calls` and `_lone_done` are only touched on the event loop.
        if self._closed:
            raise BackendBroken(f"the backend of model {self.manifest.name!r} is closed")
        loop = asyncio.get_running_loop()
        lone = alone and self._lone_copy and self._calls == 0
        self._calls += 1
        done = None
        try:
            if lone:
                done = self._lone_done = asyncio.Event()
                self.lone_calls += 1
            else:
                while self._lone_done is not None:
                    await self._lone_done.wait()
            return await loop.run_in_executor(self._executor, self._run, inputs, lone, extra)
        except (BackendError, BackendUnavailable):
            raise
        except Exception as error:  # onnxruntime raises its own exception types (Fail, InvalidArgument, ...)
            raise BackendError(
                f"ONNX Runtime failed on a batch of shape {inputs['input_ids'].shape}: {error}"
            ) from error
        finally:
            self._calls -= 1
            if done is not None:
                self._lone_done = None
                done.set()

    async def close(self) -> None:
        """Release the runtime once the calls still running end; the wait (and the release) runs in a thread, so
        the event loop goes on serving the other models and the shutdown meanwhile."""
        self._closed = True
        await asyncio.to_thread(self._release)

    def _release(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        if self._runtime is not None:
            self._runtime.close()
        self._runtime = None
