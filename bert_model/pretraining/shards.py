"""The on-disk format of pretraining data: a folder of numpy shards plus `meta.json`, streamed shard by shard.

```
DATA/
  meta.json           format version, options, special ids, per-split shard list and statistics
  tokenizer/          the tokenizer the ids come from (vocab.txt, tokenizer.json, tokenizer_config.json)
  train/shard-00000.npz, shard-00001.npz, ...
  eval/shard-00000.npz   held-out documents (absent when eval_fraction is 0)
```

Each shard is an uncompressed `.npz` (numpy's zip of arrays, read with `allow_pickle=False`) holding N instances
as concatenated token arrays plus offsets, so a sequence is `input_ids[offsets[i]:offsets[i + 1]]`:

| array | dtype, shape | meaning |
|---|---|---|
| `input_ids` | int32 (T,) | `[CLS] A [SEP] B [SEP]` ids, already corrupted when masking is static |
| `offsets` | int64 (N+1,) | start of each instance in the concatenated arrays |
| `segment_b_start` | int32 (N,) | index of B's first token: token type 0 before it, 1 from it on |
| `next_sentence_label` | int8 (N,) | 0 IsNext, 1 NotNext, -100 none (objective `mlm`: packed full sentences) |
| `source` | int16 (N,) | index of the corpus file (in `meta.json` `corpus`) that segment A comes from |
| `labels` | int32 (T,) | static masking only: original id at chosen positions, -100 elsewhere |
| `word_start` | uint8 (T,) | dynamic masking only: 1 at the first piece of each word (for whole-word masking) |
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bert_model.pretraining.instances import NOT_NEXT, TrainingInstance
from bert_model.pretraining.masking import MaskedSequence

FORMAT_VERSION = 1
META_FILE = "meta.json"
TOKENIZER_DIR = "tokenizer"


@dataclass
class ShardInfo:
    file: str
    instances: int
    tokens: int


@dataclass
class SplitInfo:
    """What one split holds, with the statistics measured while writing it."""

    shards: list[ShardInfo] = field(default_factory=list)
    documents: int = 0
    documents_per_source: dict[str, int] = field(default_factory=dict)
    instances: int = 0
    tokens: int = 0
    not_next: int = 0
    masked_tokens: int = 0
    """Chosen positions (static masking; 0 when masking is dynamic)."""
    maskable_tokens: int = 0
    """Non-special tokens: the denominator of the masked share."""
    static_masking: bool = True


@dataclass
class DataMeta:
    """`meta.json`: everything a training run needs to read the shards back."""

    max_seq_length: int
    vocab_size: int
    special_ids: dict[str, int]
    masking: dict[str, Any]
    options: dict[str, Any]
    corpus: list[str]
    splits: dict[str, SplitInfo] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    @property
    def objective(self) -> str:
        """`mlm-nsp` or `mlm` (`build.OBJECTIVES`); folders written before the option existed are `mlm-nsp`."""
        return str(self.options.get("objective", "mlm-nsp"))

    @property
    def has_nsp(self) -> bool:
        """Whether the instances carry next-sentence labels."""
        return self.objective == "mlm-nsp"

    def fingerprint(self) -> str:
        """A short hash of this metadata (options, counts, shard sizes): differs when the data differs."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    def save(self, folder: Path) -> Path:
        path = folder / META_FILE
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, folder: str | Path) -> DataMeta:
        path = Path(folder) / META_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{folder} is not a pretraining data folder: no {META_FILE} (run pretrain-data)")
        data = json.loads(path.read_text())
        if data.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{path} has format version {data.get('format_version')}, expected {FORMAT_VERSION}")
        splits = {
            name: SplitInfo(**{**info, "shards": [ShardInfo(**s) for s in info["shards"]]})
            for name, info in data.pop("splits").items()
        }
        return cls(**data, splits=splits)


class ShardWriter:
    """Buffers instances and writes `shard-NNNNN.npz` files of `instances_per_shard` each."""

    def __init__(self, folder: Path, instances_per_shard: int, static_masking: bool) -> None:
        if instances_per_shard < 1:
            raise ValueError(f"instances_per_shard must be at least 1, got {instances_per_shard}")
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.instances_per_shard = instances_per_shard
        self.static_masking = static_masking
        self.info = SplitInfo(static_masking=static_masking)
        self._pending: list[tuple[TrainingInstance, MaskedSequence | None]] = []

    def add(self, instance: TrainingInstance, masked: MaskedSequence | None) -> None:
        if self.static_masking and masked is None:
            raise ValueError("static masking needs the masked sequence of every instance")
        self._pending.append((instance, masked))
        if len(self._pending) >= self.instances_per_shard:
            self._flush()

    def close(self) -> SplitInfo:
        if self._pending:
            self._flush()
        return self.info

    def _flush(self) -> None:
        arrays = _pack(self._pending, self.static_masking)
        name = f"shard-{len(self.info.shards):05d}.npz"
        np.savez(self.folder / name, **arrays)  # type: ignore[arg-type]
        self.info.shards.append(ShardInfo(name, len(self._pending), int(arrays["input_ids"].size)))
        self.info.instances += len(self._pending)
        self.info.tokens += int(arrays["input_ids"].size)
        self.info.not_next += int((arrays["next_sentence_label"] == NOT_NEXT).sum())
        if self.static_masking:
            self.info.masked_tokens += int((arrays["labels"] != -100).sum())
        self._pending = []


def _pack(items: list[tuple[TrainingInstance, MaskedSequence | None]], static: bool) -> dict[str, np.ndarray]:
    lengths = np.array([len(instance.input_ids) for instance, _ in items], dtype=np.int64)
    arrays: dict[str, np.ndarray] = {
        "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        "segment_b_start": np.array([i.segment_b_start for i, _ in items], dtype=np.int32),
        "next_sentence_label": np.array([i.next_sentence_label for i, _ in items], dtype=np.int8),
        "source": np.array([i.source for i, _ in items], dtype=np.int16),
    }
    if static:
        arrays["input_ids"] = np.concatenate([m.input_ids for _, m in items if m is not None]).astype(np.int32)
        arrays["labels"] = np.concatenate([m.labels for _, m in items if m is not None]).astype(np.int32)
    else:
        arrays["input_ids"] = np.concatenate([np.asarray(i.input_ids) for i, _ in items]).astype(np.int32)
        arrays["word_start"] = np.concatenate([np.asarray(i.word_start) for i, _ in items]).astype(np.uint8)
    return arrays


@dataclass
class StoredInstance:
    """One instance as read back: ids (corrupted if static), labels (static) or word starts (dynamic)."""

    input_ids: np.ndarray
    segment_b_start: int
    next_sentence_label: int
    labels: np.ndarray | None = None
    word_start: np.ndarray | None = None
    source: int = 0


class Shard:
    """The arrays of one shard file, indexable by instance."""

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise FileNotFoundError(f"pretraining shard {path} is missing")
        with np.load(path, allow_pickle=False) as data:
            self._arrays = {name: data[name] for name in data.files}
        self.offsets = self._arrays["offsets"]

    def __len__(self) -> int:
        return int(self.offsets.size - 1)

    def token_counts(self, vocab_size: int) -> np.ndarray:
        """(vocab_size,) occurrences of each token id in the uncorrupted text of this shard's instances."""
        ids = self._arrays["input_ids"].astype(np.int64)
        labels = self._arrays.get("labels")
        if labels is not None:  # static masking: the original token sits in the label where one was chosen
            ids = np.where(labels >= 0, labels, ids)
        return np.bincount(ids, minlength=vocab_size)[:vocab_size]

    def __getitem__(self, index: int) -> StoredInstance:
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        labels = self._arrays.get("labels")
        word_start = self._arrays.get("word_start")
        return StoredInstance(
            input_ids=self._arrays["input_ids"][start:end].astype(np.int64),
            segment_b_start=int(self._arrays["segment_b_start"][index]),
            next_sentence_label=int(self._arrays["next_sentence_label"][index]),
            labels=None if labels is None else labels[start:end].astype(np.int64),
            word_start=None if word_start is None else word_start[start:end].astype(bool),
            source=int(self._arrays["source"][index]) if "source" in self._arrays else 0,
        )
