"""The pretraining loop: masked LM + next-sentence prediction (Devlin et al. 2019, section 3.1, appendix A.2), or
masked LM alone on data built with the `mlm` objective (Liu et al. 2019, RoBERTa, section 4.2).

One optimizer step consumes `batch_size` sequences (the global batch), split over the processes of a torchrun
job (DDP) and, within a process, over gradient-accumulation micro-batches. The loss of a step is the mean MLM
cross-entropy over all the masked tokens of the global batch plus the mean NSP cross-entropy over its
sequences: each micro-batch contributes its sums divided by the global counts, so the gradient is the same
however the batch is split (one process or many, with or without accumulation). DDP averages gradients over
processes, hence the factor `world_size`. Without NSP the pooler and the NSP head take no part in the loss: they
are frozen (DDP would otherwise wait for their gradients), and the finished model is saved as a masked LM.
bf16 autocast is used only where the device computes bf16 natively (`bert_model.training.resolve_bf16`).

Every step's data, masks and dropout are decided by seeds and saved state, which makes a resumed run repeat
the uninterrupted one (see resume.py). SIGINT / SIGTERM stop the run at the end of the current step with a
checkpoint; a second Ctrl-C aborts at once.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from contextlib import AbstractContextManager, nullcontext, suppress
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from bert_model.heads import IGNORE_INDEX, BertForMaskedLM, BertForPreTraining, PreTrainingOutput
from bert_model.pretraining.dataset import InstanceStream, MaskedInstance, collate, iter_split, token_counts
from bert_model.pretraining.distributed import (
    DistContext,
    all_reduce_max,
    all_reduce_sum,
    init_distributed,
    shutdown,
)
from bert_model.pretraining.metrics import BatchSums, Sums
from bert_model.pretraining.model_setup import build_model
from bert_model.pretraining.optim import WarmupLinearSchedule, build_optimizer
from bert_model.pretraining.resume import ResumeState, checkpoint_path, load_checkpoint, save_checkpoint
from bert_model.pretraining.shards import TOKENIZER_DIR, DataMeta
from bert_model.pretraining.training_args import TrainingArgs
from bert_model.tokenization import BertTokenizer
from bert_model.training import MetricsLog, TrainResult, resolve_bf16

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
ARGS_FILE = "pretraining_args.json"


def pretrain(args: TrainingArgs) -> TrainResult:
    """Run (or resume) pretraining; under torchrun every process calls this."""
    context = init_distributed(args.device)
    try:
        return Trainer(args, context).run()
    finally:
        shutdown(context)


class _StopSignal(AbstractContextManager["_StopSignal"]):
    """Turns SIGINT/SIGTERM into a request to stop after the current step (a second SIGINT aborts)."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopSignal:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with suppress(ValueError):  # not the main thread: leave signals alone
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True


class Trainer:
    """One pretraining run in `args.out` (see the module docstring)."""

    def __init__(self, args: TrainingArgs, context: DistContext) -> None:
        args.validate(context.world_size)
        self.args = args
        self.context = context
        self.meta = DataMeta.load(args.data)
        self.tokenizer = BertTokenizer.from_pretrained(args.data / TOKENIZER_DIR)
        self._check_out_folder()
        torch.manual_seed(args.seed)  # the same initial weights in every process
        counts = token_counts(args.data, self.meta) if args.mlm_bias_init == "unigram" else None
        model = build_model(
            self.meta,
            self.tokenizer,
            args.config,
            args.init,
            args.dropout,
            args.position_init,
            args.attention_init,
            counts,
        )
        if not self.meta.has_nsp:
            freeze_nsp_parts(model)
        self.model = model.to(context.device)
        self.bf16 = resolve_bf16(args.bf16, context.device.type, announce=context.is_main)
        self.optimizer = build_optimizer(self.model, args.optimizer, args.learning_rate, args.weight_decay)
        budget_s = None if args.time_budget_minutes is None else args.time_budget_minutes * 60
        self.schedule = WarmupLinearSchedule(
            self.optimizer, args.learning_rate, args.resolved_warmup(), args.max_steps, budget_s
        )
        self.lr = self.schedule.apply(0)
        self.stream = InstanceStream(args.data, self.meta, "train", seed=args.seed)
        self.has_eval = self.meta.splits.get("eval") is not None and self.meta.splits["eval"].instances > 0
        self.metrics = MetricsLog(args.out / METRICS_FILE if context.is_main else None, append=True)
        self.step, self.elapsed_s = 0, 0.0
        torch.manual_seed(args.seed + 1 + context.rank)  # dropout differs per process
        if args.resume:
            self._resume()
        self.engine: nn.Module = self.model
        if context.distributed:
            ids = [context.device.index] if context.device.type == "cuda" else None
            self.engine = DistributedDataParallel(self.model, device_ids=ids)
        self._eval_batches: list[tuple[dict[str, torch.Tensor], torch.Tensor]] | None = None
        # Batch widths rounded up to a multiple of 8 (when the positions allow): fewer distinct shapes for the
        # CPU kernels and the allocator to cache.
        fits = -(-self.meta.max_seq_length // 8) * 8 <= self.model.config.max_position_embeddings
        self._pad_multiple = 8 if fits else 1

    # ---- set-up --------------------------------------------------------------------------------------------
    def _check_out_folder(self) -> None:
        out = self.args.out
        if out.exists() and not out.is_dir():
            raise NotADirectoryError(f"--out {out} exists and is not a folder")
        has_run = (out / METRICS_FILE).exists() or checkpoint_path(out).exists()
        if has_run and not self.args.resume:
            raise ValueError(f"{out} already holds a run: pass --resume to continue it, or choose another --out")
        if self.args.resume and not checkpoint_path(out).exists():
            raise FileNotFoundError(f"--resume: no checkpoint in {out} to continue from")
        if self.context.is_main:
            out.mkdir(parents=True, exist_ok=True)

    def _resume(self) -> None:
        state = load_checkpoint(self.args.out, self.model, self.optimizer, self._run_identity(), self.context)
        self.step, self.elapsed_s = state.step, state.elapsed_s
        self.stream.state = state.stream
        self.metrics.truncate_after(self.step)
        logger.info("resumed %s at step %d", self.args.out, self.step)

    # ---- the loop ------------------------------------------------------------------------------------------
    def run(self) -> TrainResult:
        args = self.args
        self._write_args()
        self._clock_start, self._clock_base = time.perf_counter(), self.elapsed_s
        last_eval = self._maybe_eval(initial=True)
        window, window_steps, window_time = Sums(), 0, 0.0
        last_train: dict[str, Any] = {}
        started_at = self.step
        bar = tqdm(
            total=args.max_steps, initial=self.step, disable=self._no_progress(), unit="step", dynamic_ncols=True
        )
        with _StopSignal() as stop, bar:
            while not self._done():
                tick = time.perf_counter()
                self._train_step(window)
                window_steps += 1
                window_time += time.perf_counter() - tick
                bar.update(1)
                requested = self._synchronise(stop.requested)
                done = self._done()
                if self.step % args.log_every == 0 or done:
                    last_train = self._log_train(window, window_steps, window_time, bar)
                    window, window_steps, window_time = Sums(), 0, 0.0
                last_eval = self._maybe_eval(final=done) or last_eval
                if done or requested or (args.stop_after is not None and self.step - started_at >= args.stop_after):
                    break
                if args.save_every and self.step % args.save_every == 0:
                    self._save()
        completed = self._done()
        self._save()
        if completed:
            self._save_final()
        return TrainResult(self.step, self.elapsed_s, completed, last_train, last_eval)

    def _done(self) -> bool:
        return self.step >= self.args.max_steps or self.schedule.finished(self.step, self.elapsed_s)

    def _no_progress(self) -> bool | None:
        if not self.context.is_main:
            return True
        return None if self.args.progress is None else not self.args.progress

    def _synchronise(self, stop_requested: bool) -> bool:
        """Update the run's wall time; agree over processes on it and on a stop request (max over all), so
        that every process takes the same learning rate and stops at the same step."""
        self.elapsed_s = self._clock_base + time.perf_counter() - self._clock_start
        shared = torch.tensor([float(stop_requested), self.elapsed_s], dtype=torch.float64)
        if self.context.distributed:
            all_reduce_max(shared, self.context)
            self.elapsed_s = float(shared[1])
        return bool(shared[0] > 0)

    def _train_step(self, window: Sums) -> None:
        args, context = self.args, self.context
        instances = self.stream.take(args.batch_size)
        global_masked = max(sum(int((i.labels != IGNORE_INDEX).sum()) for i in instances), 1)
        share = args.per_process_batch(context.world_size)
        # Sorting the share by length before cutting micro-batches wastes less compute on padding and does not
        # change the gradient: every micro-batch's loss is normalised by the global counts.
        local = sorted(instances[context.rank * share : (context.rank + 1) * share], key=lambda i: len(i.input_ids))
        micro = share // args.accumulation_steps(context.world_size)
        chunks = [local[i : i + micro] for i in range(0, share, micro)]
        for index, chunk in enumerate(chunks):
            last = index == len(chunks) - 1
            sync: AbstractContextManager[Any] = nullcontext()
            if context.distributed and not last:
                assert isinstance(self.engine, DistributedDataParallel)
                sync = self.engine.no_sync()
            with sync:
                output, batch = self._forward(chunk)
                sums = _batch_sums(output, batch)
                loss = (sums.mlm_loss_sum / global_masked + sums.nsp_loss_sum / args.batch_size) * context.world_size
                loss.backward()
            window.add(sums)
        if args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), args.max_grad_norm)
        self.lr = self.schedule.apply(self.step, self.elapsed_s)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1

    def _forward(self, chunk: list[MaskedInstance]) -> tuple[PreTrainingOutput, dict[str, torch.Tensor]]:
        batch = self._tensors(chunk)
        with torch.autocast(self.context.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            output = self.engine(**batch)
        return output, batch

    def _tensors(self, chunk: list[MaskedInstance]) -> dict[str, torch.Tensor]:
        """The model's inputs and labels; without NSP no next-sentence labels (the model then skips that loss)."""
        arrays = collate(chunk, self.tokenizer.pad_id, multiple_of=self._pad_multiple)
        if not self.meta.has_nsp:
            del arrays["next_sentence_label"]
        return {name: torch.from_numpy(array).to(self.context.device) for name, array in arrays.items()}

    # ---- logging and evaluation ----------------------------------------------------------------------------
    def _log_train(self, window: Sums, steps: int, seconds: float, bar: tqdm) -> dict[str, Any]:
        all_reduce_sum(window.values, self.context)
        summary = window.summary()
        record = {
            "step": self.step,
            "split": "train",
            **summary,
            "lr": self.lr,
            "epoch": self.stream.state.epoch + self.stream.state.position / self.stream.epoch_size,
            "sequences_per_s": steps * self.args.batch_size / max(seconds, 1e-9),
            "elapsed_s": self.elapsed_s,
        }
        self.metrics.write(record)
        bar.set_postfix(loss=f"{summary['loss']:.3f}", mlm_acc=f"{summary['mlm_acc']:.3f}", refresh=False)
        return record

    def _maybe_eval(self, initial: bool = False, final: bool = False) -> dict[str, Any] | None:
        every, step = self.args.eval_every, self.step
        if not self.has_eval:
            return None
        due = (initial and every > 0 and step == 0) or (not initial and (final or (every > 0 and step % every == 0)))
        if not due:
            return None
        record = {"step": step, "split": "eval", **self.evaluate(), "lr": self.lr}
        record["elapsed_s"] = self.elapsed_s
        self.metrics.write(record)
        if self.context.is_main:
            nsp = f" nsp_acc {record['nsp_acc']:.4f}" if "nsp_acc" in record else ""
            tqdm.write(f"step {step}: eval mlm_acc {record['mlm_acc']:.4f}{nsp} mlm_loss {record['mlm_loss']:.4f}")
        return record

    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """MLM loss/accuracy over the masked tokens and NSP loss/accuracy of the held-out instances, overall and
        per corpus file (`by_source`: accuracies of the instances whose segment A comes from that file)."""
        sums = Sums()
        sources = len(self.meta.corpus)
        per_source = torch.zeros(sources, 4, dtype=torch.float64)  # mlm hits, mlm count, nsp hits, nsp count
        self.model.eval()
        try:
            for batch, source in self._eval_inputs():
                with torch.autocast(self.context.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                    output = self.model(**batch)
                sums.add(_batch_sums(output, batch))
                per_source += _source_sums(output, batch, source, sources)
        finally:
            self.model.train()
        all_reduce_sum(sums.values, self.context)
        all_reduce_sum(per_source, self.context)
        by_source = {
            Path(name).name: {
                "mlm_acc": row[0] / max(row[1], 1),
                **({"nsp_acc": row[2] / max(row[3], 1)} if self.meta.has_nsp else {}),
                "sequences": int(row[3]),
            }
            for name, row in zip(self.meta.corpus, per_source.tolist(), strict=True)
            if row[3] > 0
        }
        return sums.summary() | {"by_source": by_source}

    def _eval_inputs(self) -> list[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        """(batch, source of each row) pairs of this process's share of the held-out instances (cached)."""
        if self._eval_batches is None:
            instances = list(iter_split(self.args.data, self.meta, "eval", self.args.eval_max_instances))
            mine = instances[self.context.rank :: self.context.world_size]
            size = self.args.eval_batch_size
            self._eval_batches = [
                (self._tensors(mine[i : i + size]), torch.tensor([x.source for x in mine[i : i + size]]))
                for i in range(0, len(mine), size)
            ]
        return self._eval_batches

    # ---- saving --------------------------------------------------------------------------------------------
    def _save(self) -> None:
        state = ResumeState(self.step, self.stream.state, self.elapsed_s)
        save_checkpoint(self.args.out, self.model, self.optimizer, state, self._run_identity(), self.context)

    def _save_final(self) -> None:
        """The finished model and its tokenizer in OUT: loads with from_pretrained and fine-tunes. An MLM-only
        run saves a masked LM: its pooler and NSP head were never trained."""
        if not self.context.is_main:
            return
        model = self.model if self.meta.has_nsp else masked_lm_of(self.model)
        model.save_pretrained(self.args.out)
        self.tokenizer.save(self.args.out)

    def _run_identity(self) -> dict[str, Any]:
        """The options a resumed run must share with the original, and a fingerprint of its data folder."""
        return self.args.to_json() | {"data_fingerprint": self.meta.fingerprint()}

    def _write_args(self) -> None:
        if self.context.is_main:
            payload = {
                "args": self.args.to_json(),
                "objective": self.meta.objective,
                "precision": "bf16-autocast" if self.bf16 else "fp32",
                "world_size": self.context.world_size,
                "data": self.meta.corpus,
            }
            (self.args.out / ARGS_FILE).write_text(json.dumps(payload, indent=2) + "\n")


def freeze_nsp_parts(model: BertForPreTraining) -> None:
    """Exclude the pooler and the NSP head from training (an MLM-only run never uses them)."""
    for module in (model.bert.pooler, model.cls.seq_relationship):
        if module is not None:
            module.requires_grad_(False)


def masked_lm_of(model: BertForPreTraining) -> BertForMaskedLM:
    """The encoder and MLM head of a pretraining model as a BertForMaskedLM (sharing no tensors with it)."""
    masked_lm = BertForMaskedLM(model.config)
    wanted = masked_lm.state_dict()
    state = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items() if name in wanted}
    masked_lm.load_checked(state, source="the pretraining model")
    return masked_lm


def _batch_sums(output: PreTrainingOutput, batch: dict[str, torch.Tensor]) -> BatchSums:
    """The loss sums, counts and hits of one forward pass (NSP sums zero when the batch has no NSP labels)."""
    labels = batch["labels"]
    targets = labels[labels != IGNORE_INDEX]  # lines up with the rows of masked_lm_logits
    masked = int(targets.numel())
    sequences = int(labels.shape[0])
    assert output.masked_lm_logits is not None and output.mlm_loss is not None
    mlm_hits = (output.masked_lm_logits.argmax(-1) == targets).sum()
    if output.nsp_loss is None:
        return BatchSums(output.mlm_loss * masked, masked, mlm_hits, 0.0, 0, 0, sequences)
    nsp_hits = (output.seq_relationship_logits.argmax(-1) == batch["next_sentence_label"]).sum()
    nsp_sum = output.nsp_loss * sequences
    return BatchSums(output.mlm_loss * masked, masked, mlm_hits, nsp_sum, sequences, nsp_hits, sequences)


def _source_sums(
    output: PreTrainingOutput, batch: dict[str, torch.Tensor], source: torch.Tensor, sources: int
) -> torch.Tensor:
    """(sources, 4): MLM hits, masked tokens, NSP hits, sequences of one batch, by each row's source."""
    labels = batch["labels"]
    chosen = labels != IGNORE_INDEX
    row_of_prediction = chosen.nonzero()[:, 0].cpu()  # prediction rows follow the chosen positions row-major
    assert output.masked_lm_logits is not None
    mlm_hit = (output.masked_lm_logits.argmax(-1) == labels[chosen]).double().cpu()
    nsp_labels = batch.get("next_sentence_label")
    nsp_hit = (
        (output.seq_relationship_logits.argmax(-1) == nsp_labels).double().cpu()
        if nsp_labels is not None
        else torch.zeros(source.shape[0], dtype=torch.float64)
    )
    prediction_source = source[row_of_prediction]
    return torch.stack(
        [
            torch.bincount(prediction_source, weights=mlm_hit, minlength=sources),
            torch.bincount(prediction_source, minlength=sources).double(),
            torch.bincount(source, weights=nsp_hit, minlength=sources),
            torch.bincount(source, minlength=sources).double(),
        ],
        dim=1,
    )
