"""In-process backend: ONNX Runtime (or OpenVINO for OpenVINO variants); runs batches off the event loop.

Which variant serves is `bert_model.tasks.variant_choice`'s decision (a forced one, the GPU variant when CUDA is
there, else the first of this CPU family's order that this process can run: without the optional `openvino`
extra, an ONNX Runtime one). `start_fastest_cpu_variant` (`--variant auto` on a CPU) instead times that module's
candidates on this machine and serves the fastest (`service.variant_timing`).
On CUDA, inputs and outputs go through IO binding (outputs allocated by ORT on the device, copied back once)
so fp16 graphs with fp32 I/O run without extra host copies of intermediates.
Thread settings (intra-/inter-op) are exposed because a CPU server shares cores with its own event loop.
Reference: https://onnxruntime.ai/docs/performance/tune-performance/ , .../api/python/api_summary.html#iobinding
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from bert_model.tasks.runtimes import CPU_PROVIDER, CUDA_PROVIDER, OPENVINO_PROVIDER
from bert_model.tasks.spec import INPUT_NAMES, BundleManifest
from bert_model.tasks.variant_choice import choose_variant, timing_candidates
from bert_model.tokenization import BertTokenizer
from service.errors import BackendBroken, BackendError, BackendUnavailable
from service.variant_timing import FILLER_TEXT, VariantChoice, choose_fastest, timing_feed, timing_shapes

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
    names, skipped = timing_candidates(manifest)
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
"""Batch width multiple for OpenVINO variants: its CPU kernels run a width that is a multiple of 16 faster than the
widths just below it, so padding up to the next multiple pays (1.09-1.14x on batches of real SST-2 sentences, about
even on QA windows: `python -m bertserve.benchmarks.widths`, docs/benchmarks.md "Batch widths"). ONNX Runtime's
CPU kernels pay for every padded column, so its variants pad to the longest row."""


class OrtBackend:
    """One ONNX Runtime session over one bundle variant."""

    kind = "ort"
    batches_itself = False

    def __init__(
        self,
        bundle_dir: str | Path,
        manifest: BundleManifest,
        *,
        device: str = "auto",
        variant: str | None = None,
        intra_op_threads: int = 0,
        inter_op_threads: int = 0,
        workers: int | None = None,
        spinning: bool = False,
        openvino_streams: int = 1,
        openvino_lone_latency: bool = True,
    ) -> None:
        self.bundle_dir = Path(bundle_dir)
        self.manifest = manifest
        self.variant = choose_variant(manifest, device, variant)
        self.provider = manifest.variants[self.variant].provider
        self.output_names = list(manifest.output_names)
        self._intra = intra_op_threads
        self._inter = inter_op_threads
        self._spinning = spinning
        self.kind = "openvino" if self.provider == OPENVINO_PROVIDER else "ort"
        self._streams = openvino_streams if self.kind == "openvino" else 1
        self.width_multiple = OPENVINO_WIDTH_MULTIPLE if self.kind == "openvino" else 1
        self._lone_latency = openvino_lone_latency and self._streams > 1
        self._executor = ThreadPoolExecutor(
            max_workers=workers or self.concurrency, thread_name_prefix=f"ort-{manifest.name}"
        )
        self._session: ort.InferenceSession | None = None
        self._compiled: Any = None  # an OpenVINO CompiledModel for OpenVINO variants
        self._compiled_lone: Any = None  # the same graph compiled for latency, for batches that run alone
        self._local = threading.local()
        self._output_ports: dict[str, Any] = {}
        self._lone_output_ports: dict[str, Any] = {}
        self._input_names: list[str] = []
        self._closed = False
        self._calls = 0  # backend calls in flight (counted on the event loop)
        self._lone_done: asyncio.Event | None = None  # set when the running lone call ends
        self.lone_calls = 0
        """Calls that ran alone on the latency copy."""

    @property
    def concurrency(self) -> int:
        """Batches this backend computes at once: an OpenVINO variant's streams, else 1."""
        return self._streams

    def _load(self) -> None:
        if self.provider == OPENVINO_PROVIDER:
            self._compile_openvino()
        else:
            self._session = self._create_session()

    def _compile_openvino(self) -> None:
        import openvino as ov

        spec = self.manifest.variants[self.variant]
        latency: dict[str, object] = {"PERFORMANCE_HINT": "LATENCY"}
        if self._intra:
            latency["INFERENCE_NUM_THREADS"] = self._intra
        latency.update(spec.runtime_options)
        config = latency
        if self._streams > 1:  # several batches at once, each on its share of the cores
            config = {**latency, "PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": str(self._streams)}
        core = ov.Core()
        model = core.read_model(str(self.bundle_dir / spec.file))
        compiled = core.compile_model(model, "CPU", config)
        if self._lone_latency:
            self._compiled_lone = core.compile_model(model, "CPU", latency)
        inputs = {node.get_any_name() for node in compiled.inputs}
        self._input_names = [name for name in INPUT_NAMES if name in inputs]
        self._output_ports = self._contract_ports(compiled, spec.file)
        self._compiled = compiled
        if self._compiled_lone is not None:
            self._lone_output_ports = self._contract_ports(self._compiled_lone, spec.file)

    def _contract_ports(self, compiled: Any, file: str) -> dict[str, Any]:
        """The compiled model's output port of each contract output name (a tensor may carry several names)."""
        ports = {name: port for port in compiled.outputs for name in port.get_names()}
        absent = [name for name in self.output_names if name not in ports]
        if absent:
            raise ValueError(f"{file} lacks the outputs {absent} of a {self.manifest.task} bundle")
        return {name: ports[name] for name in self.output_names}

    def _run_openvino(self, feed: dict[str, np.ndarray], lone: bool) -> dict[str, np.ndarray]:
        name = "lone_request" if lone else "request"
        request = getattr(self._local, name, None)
        if request is None:  # one infer request per worker thread (and copy)
            compiled = self._compiled_lone if lone else self._compiled
            request = compiled.create_infer_request()
            setattr(self._local, name, request)
        result = request.infer(feed)
        ports = self._lone_output_ports if lone else self._output_ports
        return {name: np.array(result[port]) for name, port in ports.items()}

    def _create_session(self) -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.intra_op_num_threads = self._intra
        options.inter_op_num_threads = self._inter
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # spinning workers burn the cores that the event loop and tokenization need between calls
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if self._spinning else "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "1" if self._spinning else "0")
        options.log_severity_level = 3
        providers = [CUDA_PROVIDER, CPU_PROVIDER] if self.provider == CUDA_PROVIDER else [CPU_PROVIDER]
        path = self.bundle_dir / self.manifest.variants[self.variant].file
        session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
        graph_inputs = {node.name for node in session.get_inputs()}
        missing = [name for name in ("input_ids", "attention_mask") if name not in graph_inputs]
        if missing:
            raise ValueError(f"{path} lacks the inputs {missing}; a bundle graph takes {INPUT_NAMES}")
        outputs = {node.name for node in session.get_outputs()}
        absent = [name for name in self.output_names if name not in outputs]
        if absent:
            raise ValueError(f"{path} lacks the outputs {absent} of a {self.manifest.task} bundle")
        self._input_names = [name for name in INPUT_NAMES if name in graph_inputs]
        return session

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._load)
        log.info("loaded %s variant %s on %s", self.manifest.name, self.variant, self.provider)

    def _run(self, inputs: dict[str, np.ndarray], lone: bool = False) -> dict[str, np.ndarray]:
        feed = {name: np.ascontiguousarray(inputs[name], dtype=np.int64) for name in self._input_names}
        if self._compiled is not None:
            return self._run_openvino(feed, lone and self._compiled_lone is not None)
        session = self._session
        if session is None:
            raise BackendUnavailable(f"model {self.manifest.name!r} is not loaded")
        if self.provider == CUDA_PROVIDER:
            return self._run_io_binding(session, feed)
        values = session.run(self.output_names, feed)
        return dict(zip(self.output_names, values, strict=True))

    def _run_io_binding(self, session: ort.InferenceSession, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        binding = session.io_binding()
        for name, array in feed.items():
            binding.bind_cpu_input(name, array)
        for name in self.output_names:
            binding.bind_output(name, "cuda")
        session.run_with_iobinding(binding)
        values = binding.copy_outputs_to_cpu()
        return {
            name: np.asarray(value, dtype=np.float32) for name, value in zip(self.output_names, values, strict=True)
        }

    async def time_call(self, inputs: dict[str, np.ndarray]) -> float:
        """Seconds one forward of `inputs` takes in the worker thread (what `--variant auto` compares)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._timed_run, inputs)

    def _timed_run(self, inputs: dict[str, np.ndarray]) -> float:
        start = time.perf_counter()
        self._run(inputs, lone=True)  # a timing call runs alone
        return time.perf_counter() - start

    async def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch (on a stream of the compiled graph; after the running lone call, if one runs)."""
        return await self._infer(inputs, alone=False)

    async def infer_alone(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run a batch that nothing else competes with: on the latency copy (all cores) when there is one and no
        call is in flight, else as `infer`."""
        return await self._infer(inputs, alone=True)

    async def _infer(self, inputs: dict[str, np.ndarray], alone: bool) -> dict[str, np.ndarray]:
        # Calls that start while a lone call runs wait for it, so the copy's threads and a stream's never share
        # the cores; `_calls` and `_lone_done` are only touched on the event loop.
        if self._closed:
            raise BackendBroken(f"the backend of model {self.manifest.name!r} is closed")
        loop = asyncio.get_running_loop()
        lone = alone and self._compiled_lone is not None and self._calls == 0
        self._calls += 1
        done = None
        try:
            if lone:
                done = self._lone_done = asyncio.Event()
                self.lone_calls += 1
            else:
                while self._lone_done is not None:
                    await self._lone_done.wait()
            return await loop.run_in_executor(self._executor, self._run, inputs, lone)
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
        self._session = None
        self._compiled = None
        self._compiled_lone = None
