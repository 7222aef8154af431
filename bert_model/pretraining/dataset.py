"""Reading pretraining shards back: a resumable, deterministic stream of masked instances, and padded batches.

The training stream visits every instance once per epoch: shards in a seeded random order, instances within a
shard in a seeded random order, one shard in memory at a time. Its position is two integers (epoch, instances
consumed in the epoch), which is what a checkpoint stores to resume exactly. With dynamic masking (Liu et al.
2019, RoBERTa, section 4.1) each instance is masked when it is read, with a generator seeded by (seed, epoch,
shard, index): a new mask every epoch, yet the same mask whichever process or step reads it. Torch-free: batches
are numpy arrays.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bert_model.pretraining.masking import IGNORE_INDEX, MaskingOptions, MaskingVocabulary, mask_tokens
from bert_model.pretraining.shards import DataMeta, Shard, StoredInstance

_DYNAMIC_MASK_STREAM = 7  # a constant in the seed tuple, so masking draws never coincide with ordering draws


@dataclass
class StreamState:
    """Where the stream is: the epoch and how many instances of it were consumed."""

    epoch: int = 0
    position: int = 0


@dataclass
class MaskedInstance:
    """An instance ready to batch: corrupted ids, MLM labels (-100 = not chosen), where B starts, NSP label."""

    input_ids: np.ndarray
    labels: np.ndarray
    segment_b_start: int
    next_sentence_label: int
    source: int = 0


class InstanceStream:
    """An endless, resumable stream over one split of a data folder (see the module docstring)."""

    def __init__(
        self,
        folder: str | Path,
        meta: DataMeta,
        split: str = "train",
        seed: int = 0,
        shuffle: bool = True,
        state: StreamState | None = None,
    ) -> None:
        if split not in meta.splits or meta.splits[split].instances == 0:
            raise ValueError(f"the data folder {folder} has no {split!r} instances")
        self.folder = Path(folder) / split
        self.info = meta.splits[split]
        self.seed = seed
        self.shuffle = shuffle
        self.state = state or StreamState()
        self.sizes = [shard.instances for shard in self.info.shards]
        self.masking = MaskingOptions(**{k: v for k, v in meta.masking.items() if k != "dynamic"})
        specials = set(meta.special_ids.values())
        self.vocab = MaskingVocabulary.build(meta.special_ids["mask"], meta.vocab_size, specials)
        self._loaded: tuple[int, int, Shard, np.ndarray] | None = None  # (epoch, shard, shard data, order)

    @property
    def epoch_size(self) -> int:
        return self.info.instances

    def take(self, count: int) -> list[MaskedInstance]:
        """The next `count` instances (crossing epoch ends), advancing the state."""
        return [self.next_instance() for _ in range(count)]

    def next_instance(self) -> MaskedInstance:
        if self.state.position >= self.epoch_size:
            self.state = StreamState(self.state.epoch + 1, 0)
        shard_index, offset = self._locate(self.state.position)
        shard, order = self._shard(shard_index)
        index = int(order[offset])
        self.state.position += 1
        return self._masked(shard[index], shard_index, index)

    def _shard_order(self) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.sizes))
        return np.random.default_rng([self.seed, self.state.epoch]).permutation(len(self.sizes))

    def _locate(self, position: int) -> tuple[int, int]:
        """(shard file index, offset within the shard's visiting order) of a position in the epoch."""
        for shard_index in self._shard_order():
            size = self.sizes[shard_index]
            if position < size:
                return int(shard_index), position
            position -= size
        raise AssertionError("position beyond the epoch")

    def _shard(self, shard_index: int) -> tuple[Shard, np.ndarray]:
        cached = self._loaded
        if cached is not None and cached[0] == self.state.epoch and cached[1] == shard_index:
            return cached[2], cached[3]
        shard = Shard(self.folder / self.info.shards[shard_index].file)
        if self.shuffle:
            order = np.random.default_rng([self.seed, self.state.epoch, shard_index]).permutation(len(shard))
        else:
            order = np.arange(len(shard))
        self._loaded = (self.state.epoch, shard_index, shard, order)
        return shard, order

    def _masked(self, stored: StoredInstance, shard_index: int, index: int) -> MaskedInstance:
        labels, input_ids = stored.labels, stored.input_ids
        if labels is None:  # dynamic masking: a fresh, reproducible mask for this epoch
            rng = np.random.default_rng([self.seed, _DYNAMIC_MASK_STREAM, self.state.epoch, shard_index, index])
            masked = mask_tokens(stored.input_ids, self.masking, self.vocab, rng, stored.word_start)
            labels, input_ids = masked.labels, masked.input_ids
        return MaskedInstance(input_ids, labels, stored.segment_b_start, stored.next_sentence_label, stored.source)


def iter_split(folder: str | Path, meta: DataMeta, split: str, limit: int | None = None) -> Iterator[MaskedInstance]:
    """The instances of a split in stored order (one pass, at most `limit`): what evaluation reads."""
    stream = InstanceStream(folder, meta, split, shuffle=False)
    total = stream.epoch_size if limit is None else min(limit, stream.epoch_size)
    for _ in range(total):
        yield stream.next_instance()


def token_counts(folder: str | Path, meta: DataMeta, split: str = "train") -> np.ndarray:
    """(vocab_size,) int64 occurrences of every token id in a split (one shard in memory at a time)."""
    counts = np.zeros(meta.vocab_size, dtype=np.int64)
    for info in meta.splits[split].shards:
        counts += Shard(Path(folder) / split / info.file).token_counts(meta.vocab_size)
    return counts


def collate(
    instances: list[MaskedInstance], pad_id: int, pad_to: int | None = None, multiple_of: int = 1
) -> dict[str, np.ndarray]:
    """Pad to the longest instance rounded up to `multiple_of` (or to `pad_to`): int64 arrays input_ids,
    attention_mask, token_type_ids, labels (B, S) and next_sentence_label (B,)."""
    if not instances:
        raise ValueError("cannot collate an empty batch")
    longest = max(len(instance.input_ids) for instance in instances)
    width = -(-longest // multiple_of) * multiple_of
    if pad_to is not None:
        if pad_to < longest:
            raise ValueError(f"pad_to={pad_to} is shorter than the longest instance ({longest})")
        width = pad_to
    batch = len(instances)
    input_ids = np.full((batch, width), pad_id, dtype=np.int64)
    labels = np.full((batch, width), IGNORE_INDEX, dtype=np.int64)
    attention_mask = np.zeros((batch, width), dtype=np.int64)
    token_type_ids = np.zeros((batch, width), dtype=np.int64)
    for row, instance in enumerate(instances):
        length = len(instance.input_ids)
        input_ids[row, :length] = instance.input_ids
        labels[row, :length] = instance.labels
        attention_mask[row, :length] = 1
        token_type_ids[row, instance.segment_b_start : length] = 1
    next_sentence_label = np.array([i.next_sentence_label for i in instances], dtype=np.int64)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_type_ids": token_type_ids,
        "labels": labels,
        "next_sentence_label": next_sentence_label,
    }
