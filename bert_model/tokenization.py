"""WordPiece tokenization through the Hugging Face `tokenizers` library (Rust), never hand-written.

`BertTokenizer` builds the BERT pipeline (BertNormalizer -> BertPreTokenizer -> WordPiece -> [CLS] A [SEP]
B [SEP] template) from a `vocab.txt`, or loads a `tokenizer.json`. Any padding or truncation baked into a
shipped `tokenizer.json` is switched off: lengths are decided per call (`max_length`, `truncation`), and
padding to a batch happens in `pad()` with numpy. Torch-free: the service uses this module.

Truncation is state of a `tokenizers.Tokenizer`, and calls run concurrently (the service encodes on several
threads), so a truncating call borrows one of at most `MAX_TRUNCATING_COPIES` private copies and sets that
call's truncation on it (a field assignment, about a microsecond). The number of copies depends on how many
calls run at once, never on the settings asked for: no value a caller sends grows memory or costs a rebuild.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import numpy as np
from tokenizers import AddedToken, Encoding, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece

from bert_model.registry import resolve_model_path

Truncation = Literal["longest_first", "only_first", "only_second", "none"]
TRUNCATION_STRATEGIES: tuple[str, ...] = ("longest_first", "only_first", "only_second", "none")
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
MAX_TRUNCATING_COPIES = 4
"""Most copies of a tokenizer that truncating calls use at once (a call beyond waits for one to come back)."""


class InputTooLongError(ValueError):
    """The text needs more tokens than allowed and truncation is off."""


class BertTokenizer:
    """A BERT WordPiece tokenizer with per-call truncation, pairs, offsets and numpy batching."""

    def __init__(self, tokenizer: Tokenizer, lowercase: bool, model_max_length: int = 512) -> None:
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self._tokenizer = tokenizer
        self.lowercase = lowercase
        self.model_max_length = model_max_length
        vocab = tokenizer.get_vocab()
        missing = [token for token in SPECIAL_TOKENS if token not in vocab]
        if missing:
            raise ValueError(f"the vocabulary lacks BERT's special tokens {missing}")
        _register_special_tokens(tokenizer)
        self._copies_returned = threading.Condition()
        self._idle_copies: list[Tokenizer] = []
        self._copies_built = 0
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (vocab[t] for t in SPECIAL_TOKENS)

    # ---- construction --------------------------------------------------------------------------------
    @classmethod
    def from_vocab(cls, vocab_file: str | Path, lowercase: bool = True, model_max_length: int = 512) -> BertTokenizer:
        """The BERT pipeline over a `vocab.txt` (one token per line, id = line number)."""
        path = Path(vocab_file)
        if not path.is_file():
            raise FileNotFoundError(f"no vocabulary file at {path}")
        vocab: dict[str, int] = {}
        for index, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
            vocab.setdefault(line.rstrip("\n"), index)
        if not vocab:
            raise ValueError(f"{path} is empty")
        missing = [token for token in SPECIAL_TOKENS if token not in vocab]
        if missing:
            raise ValueError(f"{path} lacks BERT's special tokens {missing}")
        return cls(build_wordpiece(vocab, lowercase), lowercase, model_max_length)

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, lowercase: bool | None = None) -> BertTokenizer:
        """From a model folder or built-in name: `tokenizer.json` if present, else `vocab.txt`.

        Lower-casing follows `tokenizer_config.json` (`do_lower_case`) unless `lowercase` is given.
        """
        folder = resolve_model_path(name_or_path)
        settings = _read_json(folder / "tokenizer_config.json")
        max_length = int(settings.get("model_max_length", 512))
        max_length = min(max_length, _max_positions(folder))
        do_lower = bool(settings.get("do_lower_case", True)) if lowercase is None else lowercase
        if (folder / "tokenizer.json").is_file() and lowercase is None:
            tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
            return cls(tokenizer, _normalizer_lowercases(tokenizer, do_lower), max_length)
        if (folder / "vocab.txt").is_file():
            return cls.from_vocab(folder / "vocab.txt", lowercase=do_lower, model_max_length=max_length)
        raise FileNotFoundError(f"no tokenizer in {folder}: expected tokenizer.json or vocab.txt")

    def save(self, folder: str | Path) -> Path:
        """Write vocab.txt, tokenizer.json and tokenizer_config.json (loadable by `transformers`)."""
        target = Path(folder)
        target.mkdir(parents=True, exist_ok=True)
        by_id = sorted(self._tokenizer.get_vocab().items(), key=lambda item: item[1])
        (target / "vocab.txt").write_text("".join(token + "\n" for token, _ in by_id), encoding="utf-8")
        self._tokenizer.save(str(target / "tokenizer.json"))
        config = {
            "do_lower_case": self.lowercase,
            "model_max_length": self.model_max_length,
            "tokenizer_class": "BertTokenizer",
            "unk_token": "[UNK]",
            "sep_token": "[SEP]",
            "pad_token": "[PAD]",
            "cls_token": "[CLS]",
            "mask_token": "[MASK]",
        }
        (target / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
        return target

    # ---- vocabulary ----------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def id_to_token(self, index: int) -> str | None:
        return self._tokenizer.id_to_token(index)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return [self._tokenizer.id_to_token(int(i)) or "[UNK]" for i in ids]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens))

    @property
    def backend(self) -> Tokenizer:
        """The underlying `tokenizers.Tokenizer` (no truncation, no padding)."""
        return self._tokenizer

    # ---- encoding ------------------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[str]:
        """Word pieces of `text`, without special tokens."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).tokens)

    def encode(
        self,
        text: str,
        pair: str | None = None,
        *,
        max_length: int | None = None,
        truncation: Truncation = "longest_first",
        stride: int = 0,
        add_special_tokens: bool = True,
    ) -> Encoding:
        """Encode a text or a (text, pair); `encoding.overflowing` holds further windows when truncating.

        `max_length` defaults to the model's maximum; `truncation="none"` raises InputTooLongError instead
        of cutting. Offsets are character offsets into the text (or the pair) each token came from.
        """
        return self.encode_batch(
            [text],
            [pair] if pair is not None else None,
            max_length=max_length,
            truncation=truncation,
            stride=stride,
            add_special_tokens=add_special_tokens,
        )[0]

    def encode_batch(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None = None,
        *,
        max_length: int | None = None,
        truncation: Truncation = "longest_first",
        stride: int = 0,
        add_special_tokens: bool = True,
    ) -> list[Encoding]:
        """Encode many inputs at once (in parallel, in Rust)."""
        _check_texts(texts, "texts")
        if pairs is not None:
            _check_texts(pairs, "pairs")
            if len(pairs) != len(texts):
                raise ValueError(f"got {len(texts)} texts but {len(pairs)} pairs")
        limit = self.model_max_length if max_length is None else max_length
        if limit > self.model_max_length:
            raise ValueError(f"max_length {limit} exceeds the model's maximum of {self.model_max_length} tokens")
        if truncation not in TRUNCATION_STRATEGIES:
            raise ValueError(f"truncation must be one of {TRUNCATION_STRATEGIES}, got {truncation!r}")
        inputs: list[str | tuple[str, str]] = list(texts) if pairs is None else list(zip(texts, pairs, strict=True))
        if truncation == "none":
            encodings = _encode_all(self._tokenizer, inputs, add_special_tokens)
            for index, encoding in enumerate(encodings):
                if len(encoding.ids) > limit:
                    raise InputTooLongError(
                        f"input {index} has {len(encoding.ids)} tokens, more than the maximum of {limit}: "
                        "shorten it or enable truncation"
                    )
            return list(encodings)
        _check_stride(stride, limit, self._added_tokens(pairs is not None) if add_special_tokens else 0)
        with self._truncating(limit, truncation, stride) as tokenizer:
            return _encode_all(tokenizer, inputs, add_special_tokens)

    @property
    def truncating_copies(self) -> int:
        """Copies built for truncating calls so far: at most MAX_TRUNCATING_COPIES, whatever the settings."""
        return self._copies_built

    def _added_tokens(self, pair: bool) -> int:
        return int(self._tokenizer.num_special_tokens_to_add(pair))

    @contextmanager
    def _truncating(self, max_length: int, strategy: str, stride: int) -> Iterator[Tokenizer]:
        """A copy of the tokenizer, for this call alone, that truncates as asked (see the module docstring)."""
        copy = self._borrow_copy()
        try:
            copy.enable_truncation(max_length, stride=stride, strategy=strategy)
            yield copy
        finally:
            with self._copies_returned:
                self._idle_copies.append(copy)
                self._copies_returned.notify()

    def _borrow_copy(self) -> Tokenizer:
        with self._copies_returned:
            while not self._idle_copies and self._copies_built >= MAX_TRUNCATING_COPIES:
                self._copies_returned.wait()
            if self._idle_copies:
                return self._idle_copies.pop()
            self._copies_built += 1
        try:
            return Tokenizer.from_str(self._tokenizer.to_str())
        except BaseException:
            with self._copies_returned:
                self._copies_built -= 1
                self._copies_returned.notify()
            raise

    def pad(self, encodings: Sequence[Encoding], pad_to: int | None = None) -> dict[str, np.ndarray]:
        """Stack encodings into int64 arrays (B, S) padded with [PAD] to the longest (or `pad_to`)."""
        return pad_encodings(encodings, self.pad_id, pad_to)

    def __call__(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None = None,
        *,
        max_length: int | None = None,
        truncation: Truncation = "longest_first",
    ) -> dict[str, np.ndarray]:
        """Encode and pad a batch: `input_ids`, `attention_mask`, `token_type_ids` as int64 arrays."""
        return self.pad(self.encode_batch(texts, pairs, max_length=max_length, truncation=truncation))


def pad_encodings(encodings: Sequence[Encoding], pad_id: int, pad_to: int | None = None) -> dict[str, np.ndarray]:
    """Right-pad encodings into `input_ids`, `attention_mask`, `token_type_ids` int64 arrays of shape (B, S)."""
    if not encodings:
        raise ValueError("cannot pad an empty batch")
    longest = max(len(e.ids) for e in encodings)
    width = longest if pad_to is None else pad_to
    if width < longest:
        raise ValueError(f"pad_to={pad_to} is shorter than the longest encoding ({longest})")
    return pad_rows([e.ids for e in encodings], [e.type_ids for e in encodings], width, pad_id)


def pad_rows(
    input_ids: Sequence[Sequence[int]], token_type_ids: Sequence[Sequence[int]], width: int, pad_id: int
) -> dict[str, np.ndarray]:
    """Right-pad rows of token ids and their segment ids to `width` columns: the int64 (B, width) arrays
    `input_ids` (padded with `pad_id`), `attention_mask` and `token_type_ids` a BERT graph takes."""
    if len(input_ids) != len(token_type_ids):
        raise ValueError(f"{len(input_ids)} rows of token ids but {len(token_type_ids)} rows of segment ids")
    shape = (len(input_ids), width)
    arrays = {
        "input_ids": np.full(shape, pad_id, dtype=np.int64),
        "attention_mask": np.zeros(shape, dtype=np.int64),
        "token_type_ids": np.zeros(shape, dtype=np.int64),
    }
    for row, (ids, types) in enumerate(zip(input_ids, token_type_ids, strict=True)):
        length = len(ids)
        if length > width:
            raise ValueError(f"row {row} has {length} tokens, more than the width {width}")
        arrays["input_ids"][row, :length] = ids
        arrays["attention_mask"][row, :length] = 1
        arrays["token_type_ids"][row, :length] = types
    return arrays


def build_wordpiece(vocab: dict[str, int], lowercase: bool) -> Tokenizer:
    """BERT's tokenization pipeline (Devlin et al. 2019, appendix A.2) over a WordPiece vocabulary."""
    tokenizer = Tokenizer(WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls_id, sep_id = vocab["[CLS]"], vocab["[SEP]"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A:0 [SEP]:0",
        pair="[CLS] $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return tokenizer


def _register_special_tokens(tokenizer: Tokenizer) -> None:
    """Make BERT's special tokens added special tokens (unsplit, never lower-cased), as Hugging Face's BERT
    tokenizers have them: "[MASK]" written in a text is then the mask token, not `[`, `mask`, `]`. A vocabulary
    file, or a tokenizer.json saved without `added_tokens`, does not say so itself."""
    added = {token.content for token in tokenizer.get_added_tokens_decoder().values()}
    tokens = [AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS if token not in added]
    if tokens:
        tokenizer.add_special_tokens(tokens)


def _encode_all(tokenizer: Tokenizer, inputs: list[str | tuple[str, str]], add_special_tokens: bool) -> list[Encoding]:
    """Encode `inputs`: one alone with `encode`, several with `encode_batch`, which spreads them over the library's
    thread pool; for a single input that hand-off to another thread and back costs more than the encoding itself
    (a sentence encodes in about 30 microseconds)."""
    if len(inputs) == 1:
        text, pair = inputs[0] if isinstance(inputs[0], tuple) else (inputs[0], None)
        return [tokenizer.encode(text, pair, add_special_tokens=add_special_tokens)]
    return list(tokenizer.encode_batch(inputs, add_special_tokens=add_special_tokens))


def _check_stride(stride: int, limit: int, added: int) -> None:
    """Refuse a stride the tokenizer could not window with (it would otherwise fail inside Rust)."""
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 0:
        raise ValueError(f"stride must be a non-negative integer, got {stride!r}")
    if limit - added < 1:
        raise ValueError(f"max_length {limit} leaves no room for text beside the {added} special tokens")
    if stride >= limit - added:
        raise ValueError(
            f"stride {stride} must be smaller than max_length {limit} minus the {added} special tokens "
            f"({limit - added})"
        )


def _check_texts(texts: Sequence[str], name: str) -> None:
    if isinstance(texts, str):
        raise TypeError(f"{name} must be a list of strings, not a single string")
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{name}[{index}] must be a string, got {type(text).__name__}")


def _normalizer_lowercases(tokenizer: Tokenizer, default: bool) -> bool:
    state = json.loads(tokenizer.to_str()).get("normalizer") or {}
    return bool(state.get("lowercase", default))


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}


def _max_positions(folder: Path) -> int:
    config = _read_json(folder / "config.json")
    return int(config.get("max_position_embeddings", 512))
