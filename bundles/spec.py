"""The serving contract between export (writes bundles) and the service (reads them).

A serving bundle is a folder:

    manifest.json          this module's `BundleManifest`, as JSON
    tokenizer/             vocab.txt, tokenizer.json, tokenizer_config.json (BertTokenizer.save)
    <variant>.onnx         one ONNX graph per precision variant (cpu-fp32, cpu-int8, gpu-fp16, ...)

Graph input/output names and dynamic axes are data, here, not strings scattered over export and service.
Torch-free and onnx-free.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Task = Literal["classify", "qa", "ner", "embed", "fill-mask", "rerank"]
TASKS: tuple[str, ...] = ("classify", "qa", "ner", "embed", "fill-mask", "rerank")
MANIFEST_FILE = "manifest.json"
TOKENIZER_DIR = "tokenizer"
FORMAT_VERSION = 2
"""The manifest layout this build writes and reads; a bundle of another version is refused with the command that
re-exports it. A manifest names no default variant: which one serves is decided where the bundle is served
(`bundles.variant_choice`)."""

INPUT_NAMES: tuple[str, ...] = ("input_ids", "attention_mask", "token_type_ids")
"""Every graph takes these int64 (batch_size, sequence_length) inputs, in this order."""

OUTPUT_NAMES: dict[str, tuple[str, ...]] = {
    "classify": ("logits",),  # (batch_size, num_labels)
    "qa": ("start_logits", "end_logits"),  # (batch_size, sequence_length) each
    "ner": ("logits",),  # (batch_size, sequence_length, num_labels)
    # (batch_size, hidden) each, then (batch_size, sequence_length, hidden): the encoder's last hidden state
    "embed": ("pooled_embedding", "normalized_embedding", "token_embeddings"),
    "fill-mask": ("mask_logits",),  # (batch_size, masked_positions, vocab_size): the masked-LM head's scores
    "rerank": ("logits",),  # (batch_size, 1): a cross-encoder's relevance score of each (query, passage) pair
}
"""Only what the answer needs leaves the graph. An embed graph pools its token states (task_settings `pooling`,
under the attention mask) and L2-normalizes the pooled vector: the normalized one answers requests that want unit
vectors, the pooled one those that ask for the raw vector (normalize=false) or a prefix of it (`dimensions`,
renormalized by the caller). A fill-mask graph runs the masked-LM head at the mask tokens only (input_ids == the
tokenizer's mask id): row b holds the logits of its mask tokens in position order, then filler rows up to the
batch's most masks (at least one), which carry no answer. An embed graph also puts out the token states it pooled
(`token_embeddings`), which answer the requests for every token's vector (TEI's `/embed_all`)."""

ON_REQUEST_OUTPUTS: dict[str, tuple[str, ...]] = {"embed": ("token_embeddings",)}
"""Outputs a runtime fetches only for the batches whose requests ask for them: a (B, S, H) copy per call would cost
every sentence-vector request. They came into the contract after bundles without them were exported: a manifest
may leave them out, and such a bundle serves everything else (a request that needs one is refused, saying to
re-export the bundle)."""

DYNAMIC_AXES: dict[str, dict[int, str]] = {
    "input_ids": {0: "batch_size", 1: "sequence_length"},
    "attention_mask": {0: "batch_size", 1: "sequence_length"},
    "token_type_ids": {0: "batch_size", 1: "sequence_length"},
    "logits@classify": {0: "batch_size"},
    "logits@rerank": {0: "batch_size"},
    "logits@ner": {0: "batch_size", 1: "sequence_length"},
    "start_logits": {0: "batch_size", 1: "sequence_length"},
    "end_logits": {0: "batch_size", 1: "sequence_length"},
    "pooled_embedding": {0: "batch_size"},
    "normalized_embedding": {0: "batch_size"},
    "token_embeddings": {0: "batch_size", 1: "sequence_length"},
    "mask_logits": {0: "batch_size", 1: "masked_positions"},
}
SEQUENCE_AXIS = "sequence_length"


def dynamic_axes(task: str) -> dict[str, dict[int, str]]:
    """The dynamic axes of every input and output of a `task` graph (torch.onnx.export's argument)."""
    axes = {name: DYNAMIC_AXES[name] for name in INPUT_NAMES}
    for name in OUTPUT_NAMES[task]:
        axes[name] = DYNAMIC_AXES.get(f"{name}@{task}", DYNAMIC_AXES.get(name, {0: "batch_size"}))
    return axes


def sequence_outputs(task: str) -> tuple[str, ...]:
    """The outputs of a `task` graph with one row per input token, (batch_size, sequence_length, ...): cut to each
    input's own length, compared at real positions only. The others have one row per input, whatever its length."""
    return tuple(
        name
        for name, axes in dynamic_axes(task).items()
        if name in OUTPUT_NAMES[task] and SEQUENCE_AXIS in axes.values()
    )


@dataclass
class VariantSpec:
    """One ONNX graph of the bundle."""

    file: str
    """File name inside the bundle, e.g. `cpu-int8.onnx`."""
    provider: str
    """The ONNX Runtime execution provider it is built for (`CPUExecutionProvider`, `CUDAExecutionProvider`)."""
    precision: str
    """`fp32`, `int8`, `fp16`, `bf16`."""
    parity: dict[str, Any] = field(default_factory=dict)
    """Accuracy figures measured against PyTorch at export (max_abs_diff, label_agreement, f1_delta...)."""
    fused_ops: dict[str, int] = field(default_factory=dict)
    """Counts of fused operators in the graph (Attention, SkipLayerNormalization, ...)."""
    runtime_options: dict[str, Any] = field(default_factory=dict)
    """Settings for the runtime that executes the graph; for `provider == "OpenVINO"` (a graph run by the
    OpenVINO runtime, not ONNX Runtime) the `compile_model` properties, e.g. {"INFERENCE_PRECISION_HINT": "bf16"}."""
    batch_invariant: bool | None = None
    """Whether each input's outputs are the same (within the precision's tolerance) alone and batched beside other
    inputs of the same and of other lengths, as judged at export (export/invariance.py). A variant that is not
    serves only when forced or unbatched (`bundles.variant_choice`); None: not judged (a manifest written before
    the judgment existed)."""
    batch_invariance: dict[str, Any] = field(default_factory=dict)
    """That judgment's figures: max_abs_diff between the outputs alone and batched, its tolerance, the batch shape
    that gave it, rows and batches compared, argmax_agreement, and the provider and CPU it ran on."""


@dataclass
class BundleManifest:
    """manifest.json: everything the service needs to serve a bundle without torch."""

    name: str
    """Model name the service exposes (e.g. `minilm-sst2`)."""
    task: str
    """One of TASKS."""
    max_seq_length: int
    """Longest input (tokens, specials included) the graphs accept."""
    variants: dict[str, VariantSpec]
    """Variant name -> graph."""
    labels: list[str] = field(default_factory=list)
    """Class names by index (classify, ner); empty for qa / embed."""
    lowercase: bool = True
    """Whether the tokenizer lower-cases (informational; the tokenizer folder is authoritative)."""
    source: dict[str, Any] = field(default_factory=dict)
    """Where it came from: model path or name, export options, creation time, versions."""
    task_settings: dict[str, Any] = field(default_factory=dict)
    """The model's own task settings (as `bertserve evaluate` reads them, fitted to `max_seq_length`): for qa
    max_seq_length, doc_stride, max_query_length, max_answer_length (and version_2, null_threshold); for ner
    max_seq_length, stride; for embed pooling ("mean" | "cls" | "max") and normalize (bool); for fill-mask
    mask_token. The service's defaults for the model; a setting not given takes the service's own."""
    outputs: list[str] = field(default_factory=list)
    """The graphs' outputs, in order: the task's OUTPUT_NAMES (empty = those, when built in code), of which a bundle
    exported before an on-request output (ON_REQUEST_OUTPUTS) joined the contract lacks that one. A bundle whose
    graphs output anything else was exported by another build of the contract and is refused: re-export it."""
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        self.variants = {
            name: spec if isinstance(spec, VariantSpec) else VariantSpec(**spec) for name, spec in self.variants.items()
        }
        if self.task not in TASKS:
            raise ValueError(f"manifest task {self.task!r} is not one of {TASKS}")
        if not self.variants:
            raise ValueError("a bundle needs at least one variant")
        if self.max_seq_length < 8:
            raise ValueError(f"max_seq_length {self.max_seq_length} is too small")
        self.outputs = list(self.outputs) or list(OUTPUT_NAMES[self.task])
        if not outputs_fit(self.task, self.outputs):
            raise ValueError(f"{self.task} graphs output {list(OUTPUT_NAMES[self.task])}, not {self.outputs}")
        if not isinstance(self.task_settings, dict):
            raise ValueError(f"manifest task_settings must be an object, got {self.task_settings!r}")
        if self.task in ("classify", "ner") and not self.labels:
            raise ValueError(f"a {self.task} bundle needs labels")

    @property
    def output_names(self) -> tuple[str, ...]:
        """The outputs every call fetches: the graphs' outputs but the on-request ones."""
        on_request = ON_REQUEST_OUTPUTS.get(self.task, ())
        return tuple(name for name in self.outputs if name not in on_request)

    @property
    def on_request_outputs(self) -> tuple[str, ...]:
        """The on-request outputs (ON_REQUEST_OUTPUTS) these graphs have: fetched for the calls that ask for them."""
        on_request = ON_REQUEST_OUTPUTS.get(self.task, ())
        return tuple(name for name in self.outputs if name in on_request)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    def write(self, bundle_dir: str | Path) -> Path:
        path = Path(bundle_dir) / MANIFEST_FILE
        path.write_text(self.to_json())
        return path

    @classmethod
    def read(cls, bundle_dir: str | Path) -> BundleManifest:
        """Read and validate `bundle_dir/manifest.json`; errors name the bundle and the problem."""
        path = Path(bundle_dir) / MANIFEST_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{bundle_dir} is not a serving bundle: no {MANIFEST_FILE}")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON: {error}") from error
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise ValueError(
                f"{path} has format_version {version!r} and this build reads {FORMAT_VERSION}; re-export the bundle: "
                f"{reexport_command(data, path)}"
            )
        if data.get("task") in OUTPUT_NAMES:
            _check_outputs(data, path)
        try:
            manifest = cls(**data)
        except TypeError as error:
            raise ValueError(f"{path} does not match the manifest schema: {error}") from error
        for name, variant in manifest.variants.items():
            if not (Path(bundle_dir) / variant.file).is_file():
                raise FileNotFoundError(f"bundle {bundle_dir}: variant {name!r} file {variant.file} is missing")
        return manifest


def _check_outputs(data: dict[str, Any], path: Path) -> None:
    """Refuse a manifest whose graphs' outputs are not the task's OUTPUT_NAMES, saying how to get a bundle that is."""
    task = data["task"]
    outputs = list(data.get("outputs") or OUTPUT_NAMES[task])
    if not outputs_fit(task, outputs):
        raise ValueError(
            f"{path}: the graphs of this {task} bundle output {outputs}, and this build serves {task} graphs that "
            f"output {list(OUTPUT_NAMES[task])} (only what the answer needs leaves the graph); re-export the bundle: "
            f"{reexport_command(data, path)}"
        )


def outputs_fit(task: str, outputs: list[str]) -> bool:
    """Whether graphs that output `outputs` serve `task`: its OUTPUT_NAMES in order, of which only on-request ones
    (ON_REQUEST_OUTPUTS, the outputs a bundle of an earlier build lacks) may be missing."""
    on_request = ON_REQUEST_OUTPUTS.get(task, ())
    required = [name for name in OUTPUT_NAMES[task] if name not in on_request]
    in_order = [name for name in OUTPUT_NAMES[task] if name in outputs]
    return in_order == outputs and [name for name in outputs if name not in on_request] == required


def reexport_command(data: dict[str, Any], path: Path) -> str:
    """The command that writes the bundle of manifest `path` (its JSON `data`) again with this build."""
    source = data.get("source")
    model = source.get("model", "MODEL") if isinstance(source, dict) else "MODEL"
    return f"bertserve export {model} --out {path.parent}"
