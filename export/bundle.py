"""`build_bundle`: a model folder (or built-in name) -> a self-describing serving bundle, written atomically.

The bundle layout and manifest are the contract in `bundles.spec` (BundleManifest, VariantSpec).
Steps: validate every option before any work; load the model (eager attention); read the guard's examples
(task_guard.py); export opset-17 ONNX; canonicalize and fuse; build each requested variant; run each, opened as
the service opens it (`bundles.runtimes`), against PyTorch fp32 on the guard's batches, decode both with
`bertserve evaluate`'s task logic and refuse the variants outside their guard (parity.py); write everything into a
temporary folder next to the target and rename it into place at the end, so a failure never leaves a half-written
bundle. The manifest carries the model's own
window and decoding settings (`task_settings`, the ones `bertserve evaluate` uses) for the service's defaults;
an embed bundle's are its pooling and normalization (export/sentence_layout.py), a fill-mask bundle's its mask
token. The encoder's own tasks are guarded by export/encoder_guards.py. Their graphs put only the answer's inputs
out (export/wrapper.py): an embed graph pools as its layout says, a fill-mask graph scores the mask tokens only.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from torch import nn

from bert_model.config import META_KEY, BertConfig
from bert_model.registry import resolve_model_path
from bert_model.tokenization import BertTokenizer
from bundles.runtimes import OpenedVariant, open_variant
from bundles.spec import OUTPUT_NAMES, TOKENIZER_DIR, BundleManifest, VariantSpec, sequence_outputs
from bundles.variant_choice import batch_dependence
from export.canonicalize import canonicalize
from export.encoder_guards import embedding_guard, fill_mask_guard
from export.graph import export_onnx, fuse_bert, fused_op_counts
from export.invariance import InvarianceResult, check_batch_invariance
from export.parity import AccuracyGuardError, Outputs, ParityResult, Scored, judge_fp32, max_abs_diff
from export.rerank_layout import default_rerank_settings
from export.score_guards import rerank_guard, score_guard
from export.sentence_layout import EmbeddingSettings, embedding_settings
from export.task_guard import DEFAULT_GUARD_LIMIT, GuardOptions, TaskGuard, build_guard, served_task_settings
from export.variant_names import DEFAULT_VARIANTS
from export.variants import RECIPES, CannotBuild, Sources, parse_variants
from export.wrapper import (
    TASK_CLASSES,
    ExportWrapper,
    GraphOptions,
    encoder_of,
    labels_of,
    load_task_model,
    task_of_folder,
)

logger = logging.getLogger(__name__)
Keep = Callable[[dict[str, np.ndarray], int], dict[str, np.ndarray]]
DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"


@dataclass
class ExportOptions:
    """What `build_bundle` builds; validated before any work starts."""

    variants: list[str] = field(default_factory=lambda: list(DEFAULT_VARIANTS))
    """Variant names (see export.variants.RECIPES)."""
    max_seq_len: int | None = None
    """Longest input the bundle serves; default: the most the model takes (`BertConfig.max_sequence_length`; an
    embedding model's sentence-transformers `max_seq_length`, when its folder gives one)."""
    name: str | None = None
    """Model name in the manifest; default: the target folder's name."""
    eval_data: Path | None = None
    """A labelled eval set for the accuracy guards (SQuAD JSON for qa, CoNLL for ner, labelled TSV for classify):
    reduced-precision variants are judged on F1 against its gold answers; default: the real data set."""
    calibration: Path | None = None
    """A text file (one input per line, tab between a pair) for the accuracy guards, judged by agreement with
    PyTorch fp32's predictions; default: the real data set, else built-in sentences."""
    data_dir: Path | None = None
    """Folder of the real data sets (../shared/data) used when neither file is given."""
    guard_limit: int = DEFAULT_GUARD_LIMIT
    """How many examples (questions, sentences, texts) the accuracy guards judge, evenly spaced over the file."""
    strict: bool = False
    """Fail the whole export when a variant is refused (default: drop that variant, keep the others)."""
    task: str | None = None
    """Serve the model as this task instead of the one its folder names (export/wrapper.py `task_of_folder`): `rerank`
    for a one-output sequence classifier saved without a reranker's marker, `classify` to serve a reranker's
    scores as a classifier's. Only tasks of the same head class are accepted."""

    def guard_options(self) -> GuardOptions:
        """The accuracy guard's inputs (raises ValueError / FileNotFoundError on bad paths or limits)."""
        data_dir = self.data_dir if self.data_dir is not None else DEFAULT_DATA_DIR
        return GuardOptions(self.eval_data, self.calibration, data_dir, self.guard_limit)


@dataclass
class BundleResult:
    path: Path
    manifest: BundleManifest
    refused: dict[str, str] = field(default_factory=dict)
    """Variant name -> why its guard refused it (not written)."""

    @property
    def batch_dependent(self) -> dict[str, str]:
        """Variant name -> why it is not batch invariant (written, refused for batched serving)."""
        return batch_dependent_variants(self.manifest)


def build_bundle(
    model_name_or_path: str | Path,
    out_dir: str | Path,
    variants: str | list[str] | tuple[str, ...] = DEFAULT_VARIANTS,
    max_seq_len: int | None = None,
    **options: Any,
) -> BundleResult:
    """Export `model_name_or_path` into the serving bundle `out_dir` (replaced atomically if it exists)."""
    opts = ExportOptions(variants=parse_variants(variants), max_seq_len=max_seq_len, **options)
    opts.guard_options()  # validated before any work
    target = Path(out_dir).expanduser().resolve()
    _check_target(target)
    model, task, folder = load_task_model(model_name_or_path, check_task(model_name_or_path, opts.task))
    config: BertConfig = encoder_of(model).config
    layout = embedding_settings(folder) if task == "embed" else None
    if opts.max_seq_len is None and layout is not None and layout.max_seq_length is not None:
        opts.max_seq_len = min(layout.max_seq_length, config.max_sequence_length)
    if opts.max_seq_len is None and task == "rerank":
        opts.max_seq_len = trained_length(config)
    max_len = _check_max_len(opts.max_seq_len, config)
    tokenizer = _tokenizer_of(folder, config)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        manifest, refused = _build_into(scratch, model, (task, layout), folder, tokenizer, max_len, opts, target.name)
        _make_readable(scratch)
        _replace_dir(scratch, target)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return BundleResult(target, manifest, refused)


def check_task(model_name_or_path: str | Path, task: str | None) -> str | None:
    """`task` when the model may be served as it (a task whose head class is the folder's own; a reranker has one
    output); None when not given."""
    if task is None:
        return None
    folder = resolve_model_path(model_name_or_path)
    own = task_of_folder(folder)
    if task not in TASK_CLASSES or TASK_CLASSES[task] is not TASK_CLASSES[own]:
        raise ValueError(f"{folder} is a {own} model and cannot be served as {task!r}")
    if task == "rerank" and BertConfig.load(folder).num_labels != 1:
        raise ValueError(f"a reranker has one output; {folder} has {BertConfig.load(folder).num_labels}")
    return task


def trained_length(config: BertConfig) -> int | None:
    """The pair length a fine-tuned reranker was trained with (its stored `max_seq_length`), within its positions."""
    settings = config.extra.get(META_KEY, {}).get("task", {})
    length = settings.get("max_seq_length") if isinstance(settings, dict) else None
    return min(length, config.max_sequence_length) if isinstance(length, int) else None


def _check_target(target: Path) -> None:
    if target.exists() and not target.is_dir():
        raise NotADirectoryError(f"output {target} exists and is not a folder")
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise PermissionError(f"cannot create the output folder's parent {parent}: {error.strerror}") from error
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"output folder {parent} is not writable")


def _check_max_len(max_seq_len: int | None, config: BertConfig) -> int:
    limit = config.max_sequence_length
    value = limit if max_seq_len is None else max_seq_len
    if not isinstance(value, int) or not 8 <= value <= limit:
        raise ValueError(f"max_seq_len must be an integer in [8, {limit}] for this model, got {max_seq_len!r}")
    return value


def _tokenizer_of(folder: Path, config: BertConfig) -> BertTokenizer:
    """The model folder's tokenizer, or its base model's for an adapter + head composite folder."""
    try:
        return BertTokenizer.from_pretrained(folder)
    except FileNotFoundError:
        base = config.extra.get(META_KEY, {}).get("base_model")
        if not base:
            raise
        return BertTokenizer.from_pretrained(resolve_model_path(base))


def _build_into(
    scratch: Path,
    model: nn.Module,
    task_layout: tuple[str, EmbeddingSettings | None],
    folder: Path,
    tokenizer: BertTokenizer,
    max_len: int,
    opts: ExportOptions,
    default_name: str,
) -> tuple[BundleManifest, dict[str, str]]:
    started = time.time()
    task, layout = task_layout
    guard = _guard(task, model, tokenizer, max_len, opts, layout)
    work = scratch / ".work"
    work.mkdir()
    options = graph_options(task, layout, tokenizer)
    raw, fused, rewrites, fused_counts = build_graphs(model, task, work, options)
    reference = torch_outputs(model, task, guard.feeds, guard.keep, options)
    expected = guard.score(reference)
    sources = Sources(raw=raw, fused=fused, calibration=guard.feeds)
    variants, refused = _build_variants(scratch, opts.variants, sources, guard, (reference, expected))
    if refused and (opts.strict or not variants):
        raise AccuracyGuardError("; ".join(f"variant {k} refused: {v}" for k, v in refused.items()))
    shutil.rmtree(work)
    tokenizer.model_max_length = max_len  # the service truncates to the bundle's limit by default
    tokenizer.save(scratch / TOKENIZER_DIR)
    manifest = BundleManifest(
        name=opts.name or default_name,
        task=task,
        max_seq_length=max_len,
        variants=variants,
        labels=labels_of(model) if task != "rerank" else [],
        lowercase=tokenizer.lowercase,
        source=_source_info(folder, opts, guard.describe(expected), rewrites, fused_counts, refused, started),
        task_settings=_task_settings(task, layout, (folder, encoder_of(model).config), max_len, tokenizer),
    )
    if layout is not None:
        manifest.source["task_settings_source"] = layout.source
    manifest.write(scratch)
    return manifest, refused


def _guard(
    task: str,
    model: nn.Module,
    tokenizer: BertTokenizer,
    max_len: int,
    opts: ExportOptions,
    layout: EmbeddingSettings | None,
) -> TaskGuard:
    """The accuracy guard's examples and decoding for `task` (validated options: see ExportOptions)."""
    options = opts.guard_options()
    if task in ("embed", "fill-mask") and options.eval_data is not None:
        raise ValueError(f"a {task} model has no labels to score on an eval set: give --calibration texts")
    if task == "embed":
        return embedding_guard(tokenizer, max_len, layout.pooling if layout else "mean", options, options.data_dir)
    if task == "fill-mask":
        return fill_mask_guard(tokenizer, max_len, options, options.data_dir)
    if task == "rerank":
        return rerank_guard(tokenizer, max_len, options)
    config = encoder_of(model).config
    if task == "classify" and config.num_labels == 1:  # its arg-max label would always agree: rank its scores
        if options.eval_data is not None:
            raise ValueError("a one-output classifier is judged on the order of its scores: give --calibration texts")
        return score_guard(tokenizer, max_len, options)
    return build_guard(task, config, tokenizer, max_len, options)


def _task_settings(
    task: str,
    layout: EmbeddingSettings | None,
    model: tuple[Path, BertConfig],
    max_len: int,
    tokenizer: BertTokenizer,
) -> dict[str, Any]:
    folder, config = model
    if layout is not None:
        return layout.task_settings()
    if task == "fill-mask":
        return {"mask_token": tokenizer.mask_token}
    if task == "rerank":
        return default_rerank_settings(folder).task_settings()
    return served_task_settings(task, config, max_len, tokenizer)


def graph_options(task: str, layout: EmbeddingSettings | None, tokenizer: BertTokenizer) -> GraphOptions:
    """What the graph computes after the encoder: an embed graph's pooling (its layout's), a fill-mask graph's mask
    token id (the tokenizer's own mask token, which the manifest names)."""
    if task == "fill-mask":
        mask_id = tokenizer.token_to_id(tokenizer.mask_token)
        if mask_id is None:
            raise ValueError(f"a fill-mask model's tokenizer needs its mask token {tokenizer.mask_token!r}")
        return GraphOptions(mask_token_id=mask_id)
    return GraphOptions(pooling=layout.pooling if layout is not None else "mean")


def build_graphs(
    model: nn.Module, task: str, work: Path, options: GraphOptions | None = None
) -> tuple[Path, Path, dict[str, int], dict[str, int]]:
    """Export, canonicalize and fuse: returns (raw graph, fused graph, rewrite counts, fused-op counts)."""
    config: BertConfig = encoder_of(model).config
    traced = export_onnx(model, task, work / "traced.onnx", options)
    graph = onnx.load(str(traced))
    rewrites = canonicalize(graph)
    raw = work / "raw.onnx"
    onnx.save(graph, str(raw))
    fused = work / "fused.onnx"
    counts = fuse_bert(raw, fused, config)
    return raw, fused, rewrites, counts


def torch_outputs(
    model: nn.Module,
    task: str,
    batches: list[dict[str, np.ndarray]],
    keep: Keep | None = None,
    options: GraphOptions | None = None,
) -> Outputs:
    """PyTorch fp32 outputs of the exported forward (`ExportWrapper` over `model`, eval mode) on every guard batch,
    keyed by the task's output names (what `keep(outputs, batch_index)` keeps of them, when given)."""
    names = OUTPUT_NAMES[task]
    model.eval()
    wrapper = ExportWrapper(model, task, options).eval()
    results: Outputs = []
    with torch.inference_mode():
        for batch in batches:
            values = wrapper(*(torch.from_numpy(batch[k]) for k in ("input_ids", "attention_mask", "token_type_ids")))
            arrays = {name: value.float().numpy() for name, value in zip(names, values, strict=True)}
            results.append(keep(arrays, len(results)) if keep is not None else arrays)
    return results


def _build_variants(
    scratch: Path, names: list[str], sources: Sources, guard: TaskGuard, reference: tuple[Outputs, Scored]
) -> tuple[dict[str, VariantSpec], dict[str, str]]:
    variants: dict[str, VariantSpec] = {}
    refused: dict[str, str] = {}
    for name in names:
        recipe = RECIPES[name]
        missing = recipe.unavailable()
        if missing:
            refused[name] = f"skipped: {missing}"
            logger.warning("variant %s skipped: %s", name, missing)
            continue
        path = scratch / recipe.file
        try:
            recipe.build(sources, path)
        except CannotBuild as error:
            refused[name] = f"skipped: {error}"
            logger.warning("variant %s skipped: %s", name, error)
            continue
        spec = recipe.spec()
        result, invariance = check_variant(spec, path, guard, reference)
        if not result.passed:
            refused[name] = result.message
            logger.warning("variant %s refused (not written): %s", name, result.message)
            path.unlink()
            continue
        spec.parity = result.figures
        spec.fused_ops = fused_op_counts(onnx.load(str(path), load_external_data=False))
        _record_invariance(name, spec, invariance)
        variants[name] = spec
    return variants, refused


def _record_invariance(name: str, spec: VariantSpec, invariance: InvarianceResult | None) -> None:
    """Write the batch-invariance judgment into `spec`; a variant outside it is written but refused for batched
    serving (`bundles.variant_choice`), which the export says."""
    if invariance is None:
        return
    spec.batch_invariant = invariance.passed
    spec.batch_invariance = invariance.figures()
    if not invariance.passed:
        logger.warning(
            "variant %s is not batch invariant (written, refused for batched serving: it serves only when forced with "
            "--variant %s or unbatched): %s",
            name,
            name,
            invariance.message,
        )


def batch_dependent_variants(manifest: BundleManifest) -> dict[str, str]:
    """Variant -> why it is not batch invariant, for the manifest's variants judged so at export."""
    return {
        name: batch_dependence(spec) or "not batch invariant"
        for name, spec in manifest.variants.items()
        if spec.batch_invariant is False
    }


def check_variant(
    spec: VariantSpec, path: Path, guard: TaskGuard, reference: tuple[Outputs, Scored]
) -> tuple[ParityResult, InvarianceResult | None]:
    """Open variant `spec` (file `path`) as the service serves it (`open_variant` with the service's default settings),
    run it on the guard batches and judge it against PyTorch fp32: its raw outputs (fp32), or its predictions decoded
    with `bertserve evaluate`'s task logic (reduced precision). A variant that serves lone batches on a copy compiled
    for latency is judged on both compiled graphs: the first refusal, else the figures of the graph serving batches.
    A variant that passes is then judged by batch invariance (export/invariance.py): the second result, None for a
    refused one."""
    opened = open_variant(path, spec, OUTPUT_NAMES[guard.task])
    try:
        results = [
            _judge(spec.precision, _guard_outputs(opened, guard, alone), guard, reference)
            for alone in ((False, True) if opened.lone_copy else (False,))
        ]
        failed = [result for result in results if not result.passed]
        invariance = None if failed else check_batch_invariance(opened, guard, spec.precision)
    finally:
        opened.close()
    if failed and failed[0] is not results[0]:
        failed[0].message += " (on the copy compiled for lone batches)"
    return (failed[0] if failed else results[0]), invariance


def _guard_outputs(opened: OpenedVariant, guard: TaskGuard, alone: bool) -> Outputs:
    return [guard.keep(opened.run(feed, alone=alone), index) for index, feed in enumerate(guard.feeds)]


def _judge(precision: str, candidate: Outputs, guard: TaskGuard, reference: tuple[Outputs, Scored]) -> ParityResult:
    outputs, expected = reference
    # Kept rows are real positions already (fill-mask: the masked ones); per-token outputs are compared at
    # attended positions, per-input ones (classify's logits, embed's vectors) whole.
    masks = None if guard.trim is not None else [feed["attention_mask"] for feed in guard.feeds]
    per_token = sequence_outputs(guard.task)
    if precision == "fp32":
        result = judge_fp32(outputs, candidate, masks, per_token)
    else:
        result = guard.judge(expected, guard.score(candidate))
        result.figures["max_abs_diff"] = max_abs_diff(outputs, candidate, masks, per_token)
    judgment = "max-abs-diff" if precision == "fp32" else guard.judgment
    result.figures.update(judgment=judgment, guard_source=guard.source, inputs=len(guard.features))
    return result


def _source_info(
    folder: Path,
    opts: ExportOptions,
    guard_inputs: dict[str, Any],
    rewrites: dict[str, int],
    fused_counts: dict[str, int],
    refused: dict[str, str],
    started: float,
) -> dict[str, Any]:
    import onnxruntime

    return {
        "model": str(folder),
        "model_type": BertConfig.load(folder).model_type,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "export_seconds": round(time.time() - started, 1),
        "opset": 17,
        "requested_variants": opts.variants,
        "refused_variants": refused,
        "guard_inputs": guard_inputs,
        "graph_rewrites": rewrites,
        "fused_ops": fused_counts,
        "versions": {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__},
    }


def _make_readable(folder: Path) -> None:
    """Folders 0755, files 0644: `mkdtemp` creates 0700, and a server running as another user (the container's
    non-root uid) must read the bundle."""
    folder.chmod(0o755)
    for path in folder.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def _replace_dir(scratch: Path, target: Path) -> None:
    """Move the finished `scratch` folder to `target`; an existing bundle is swapped out, then removed."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        target.rename(old)
    try:
        scratch.rename(target)
    except BaseException:
        if old is not None:
            old.rename(target)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
