"""Tokenization through the Hugging Face `tokenizers` library (Rust), never hand-written, for every BERT family.

`BertTokenizer` wraps a `tokenizers.Tokenizer`: the BERT pipeline (BertNormalizer -> BertPreTokenizer -> WordPiece
-> [CLS] A [SEP] B [SEP] template) built from a `vocab.txt`, or whatever a checkpoint's `tokenizer.json` holds:
WordPiece (BERT, DistilBERT, ELECTRA), byte-level BPE (RoBERTa) or SentencePiece Unigram (XLM-RoBERTa, ALBERT).
Each family's special tokens come from the checkpoint: `tokenizer_config.json` / `special_tokens_map.json` name
them by role (cls or bos, sep or eos, pad, unk, mask); where they do not, the post-processor's template names the
first and last ones and the vocabulary the others by their usual spellings. How a text and a pair are framed
(`[CLS] A [SEP]`, `<s> A </s></s> B </s>`) and which segment id each part gets is read off the post-processor
itself (`SequenceTemplate`), so the task features build sequences exactly as the tokenizer would. A model that has
no token types (RoBERTa's single type, DistilBERT's none) gets segment ids 0 throughout: `model_input_names` in
`tokenizer_config.json` says so where present, else the folder's config.json (`type_vocab_size`).

Any padding or truncation baked into a shipped `tokenizer.json` is switched off: lengths are decided per call
(`max_length`, `truncation`), and padding to a batch happens in `pad()` with numpy. Torch-free: the service uses
this module.

Truncation is state of a `tokenizers.Tokenizer`, and calls run concurrently (the service encodes on several
threads), so a truncating call borrows one of at most `MAX_TRUNCATING_COPIES` private copies and sets that
call's truncation on it (a field assignment, about a microsecond). The number of copies depends on how many
calls run at once, never on the settings asked for: no value a caller sends grows memory or costs a rebuild.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
from tokenizers import AddedToken, Encoding, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece

from bert_model.config import BertConfig
from bert_model.registry import resolve_model_path

Truncation = Literal["longest_first", "only_first", "only_second", "none"]
TRUNCATION_STRATEGIES: tuple[str, ...] = ("longest_first", "only_first", "only_second", "none")
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
HEAD_CHARS_PER_TOKEN = 8
"""Characters per wanted token of the first prefix of a long text that only its first window is wanted of (a
text of the BERT family's languages averages four to five characters per token)."""
MAX_TRUNCATING_COPIES = 4
"""Most copies of a tokenizer that truncating calls use at once (a call beyond waits for one to come back)."""
WITHOUT_TOKEN_TYPES = ["input_ids", "attention_mask"]
"""`model_input_names` of a tokenizer whose model takes no token types (Hugging Face's key and spelling)."""


class InputTooLongError(ValueError):
    """The text needs more tokens than allowed and truncation is off."""


@dataclass(frozen=True)
class SpecialTokens:
    """A family's special tokens by role, as written in its vocabulary."""

    cls: str
    """First token of every sequence, whose state classification reads ([CLS], RoBERTa's bos <s>)."""
    sep: str
    """Closes a text and separates a pair ([SEP], RoBERTa's eos </s>)."""
    pad: str
    unk: str
    mask: str
    """What a masked-LM predicts ([MASK], <mask>)."""

    def in_id_order(self) -> tuple[str, ...]:
        """The tokens in the order of the id attributes BertTokenizer sets (pad, unk, cls, sep, mask)."""
        return self.pad, self.unk, self.cls, self.sep, self.mask

    def config_entries(self) -> dict[str, str]:
        """The `*_token` entries of a `tokenizer_config.json`."""
        return {
            "unk_token": self.unk,
            "sep_token": self.sep,
            "pad_token": self.pad,
            "cls_token": self.cls,
            "mask_token": self.mask,
        }


BERT_SPECIAL_TOKENS = SpecialTokens(cls="[CLS]", sep="[SEP]", pad="[PAD]", unk="[UNK]", mask="[MASK]")
ROLE_KEYS: dict[str, tuple[str, ...]] = {
    "cls": ("cls_token", "bos_token"),
    "sep": ("sep_token", "eos_token"),
    "pad": ("pad_token",),
    "unk": ("unk_token",),
    "mask": ("mask_token",),
}
"""Keys of `tokenizer_config.json` / `special_tokens_map.json` naming each role, the first found wins."""
USUAL_SPELLINGS: dict[str, tuple[str, ...]] = {
    "cls": ("[CLS]", "<s>"),
    "sep": ("[SEP]", "</s>"),
    "pad": ("[PAD]", "<pad>"),
    "unk": ("[UNK]", "<unk>"),
    "mask": ("[MASK]", "<mask>"),
}
"""What a role's token is looked up as in the vocabulary when nothing names it."""


class Frame(NamedTuple):
    """Special tokens a template puts at one place (before, between or after the texts), with their segment ids."""

    ids: tuple[int, ...]
    types: tuple[int, ...]


@dataclass(frozen=True)
class SequenceTemplate:
    """How the tokenizer frames token sequences: the special ids around one text and around a pair, and the
    segment id of every part. Read off the post-processor by encoding a probe (`of`), so that sequences built
    from tokens cut beforehand (QA and NER windows) come out exactly as the tokenizer would encode them:
    BERT `[CLS] A [SEP]`, `[CLS] A [SEP] B [SEP]` with segments 0 / 1; RoBERTa `<s> A </s>`,
    `<s> A </s></s> B </s>` with segment 0 throughout."""

    single_prefix: Frame
    single_suffix: Frame
    pair_prefix: Frame
    pair_middle: Frame
    pair_suffix: Frame
    single_type: int
    """Segment id of the text's tokens."""
    first_type: int
    """Segment id of a pair's first text."""
    second_type: int
    """Segment id of a pair's second text."""

    @property
    def single_specials(self) -> int:
        """Special tokens around one text."""
        return len(self.single_prefix.ids) + len(self.single_suffix.ids)

    @property
    def pair_specials(self) -> int:
        """Special tokens around and between a pair."""
        return len(self.pair_prefix.ids) + len(self.pair_middle.ids) + len(self.pair_suffix.ids)

    @property
    def has_segments(self) -> bool:
        """Whether any part of a pair gets a segment id other than 0."""
        frames = (self.pair_prefix, self.pair_middle, self.pair_suffix)
        return bool(self.first_type or self.second_type or any(any(frame.types) for frame in frames))

    def single(self, ids: Sequence[int]) -> tuple[list[int], list[int]]:
        """(token ids, segment ids) of one text's tokens with the template's specials around them."""
        prefix, suffix = self.single_prefix, self.single_suffix
        return (
            [*prefix.ids, *ids, *suffix.ids],
            [*prefix.types, *[self.single_type] * len(ids), *suffix.types],
        )

    def pair(self, first: Sequence[int], second: Sequence[int]) -> tuple[list[int], list[int]]:
        """(token ids, segment ids) of a pair's tokens with the template's specials around and between them."""
        prefix, middle, suffix = self.pair_prefix, self.pair_middle, self.pair_suffix
        return (
            [*prefix.ids, *first, *middle.ids, *second, *suffix.ids],
            [
                *prefix.types,
                *[self.first_type] * len(first),
                *middle.types,
                *[self.second_type] * len(second),
                *suffix.types,
            ],
        )

    def second_start(self, first_length: int) -> int:
        """Position of a pair's second text when its first has `first_length` tokens."""
        return len(self.pair_prefix.ids) + first_length + len(self.pair_middle.ids)

    def without_types(self) -> SequenceTemplate:
        """The same template with segment id 0 everywhere (a model without token types)."""
        values: dict[str, Any] = {}
        for field in fields(self):
            value = getattr(self, field.name)
            values[field.name] = Frame(value.ids, (0,) * len(value.ids)) if isinstance(value, Frame) else 0
        return SequenceTemplate(**values)

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> SequenceTemplate:
        """The template of `tokenizer`'s post-processor (ValueError when it has none, or one that interleaves
        special tokens with a text's tokens)."""
        if tokenizer.post_processor is None:
            raise ValueError("the tokenizer has no post-processor, so the special tokens around a text are unknown")
        (single_prefix, single_suffix), (single_type,) = _frames(tokenizer.encode("a"), 1)
        (pair_prefix, pair_middle, pair_suffix), (first_type, second_type) = _frames(tokenizer.encode("a", "b"), 2)
        return cls(
            single_prefix, single_suffix, pair_prefix, pair_middle, pair_suffix, single_type, first_type, second_type
        )


def _frames(encoding: Encoding, texts: int) -> tuple[list[Frame], list[int]]:
    """The runs of special tokens before, between and after the `texts` texts of a post-processed `encoding`,
    and each text's segment id."""
    runs: list[list[tuple[int, int]]] = [[]]
    text_types: list[int] = []
    inside: int | None = None
    for sequence, token, kind in zip(encoding.sequence_ids, encoding.ids, encoding.type_ids, strict=True):
        if sequence is None:
            if inside is not None:
                runs.append([])
                inside = None
            runs[-1].append((token, kind))
        elif sequence != inside:
            if inside is not None:
                runs.append([])  # two texts back to back, nothing between them
            text_types.append(kind)
            inside = sequence
    if inside is not None:
        runs.append([])
    if len(text_types) != texts or len(runs) != texts + 1:
        raise ValueError(f"the tokenizer's post-processor does not frame {texts} text(s) as one template: {encoding}")
    return [Frame(tuple(t for t, _ in run), tuple(k for _, k in run)) for run in runs], text_types


class BertTokenizer:
    """A tokenizer of the BERT family with per-call truncation, pairs, offsets and numpy batching."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        lowercase: bool,
        model_max_length: int = 512,
        special_tokens: SpecialTokens | None = None,
        uses_token_types: bool | None = None,
        tokenizer_class: str = "BertTokenizer",
    ) -> None:
        """`special_tokens`: by role (default: the template's first and last tokens as cls and sep, the others by
        their usual spellings in the vocabulary); `uses_token_types`: whether the model takes segment ids (default:
        whether the template gives a pair's parts segment ids other than 0)."""
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self._tokenizer = tokenizer
        self.lowercase = lowercase
        self.model_max_length = model_max_length
        self.tokenizer_class = tokenizer_class
        """`tokenizer_class` written into a saved tokenizer_config.json (the checkpoint's own)."""
        self.special_tokens = special_tokens or _found_special_tokens(tokenizer, {})
        vocab = tokenizer.get_vocab()
        missing = [token for token in self.special_tokens.in_id_order() if token not in vocab]
        if missing:
            family = "BERT's" if self.special_tokens == BERT_SPECIAL_TOKENS else "its"
            raise ValueError(f"the vocabulary lacks {family} special tokens {missing}")
        _register_special_tokens(tokenizer, self.special_tokens)
        _install_template(tokenizer, self.special_tokens)
        template = SequenceTemplate.of(tokenizer)
        self.uses_token_types = template.has_segments if uses_token_types is None else uses_token_types
        """Whether the model takes segment ids: features of a model without them carry 0 throughout."""
        self.template = template if self.uses_token_types else template.without_types()
        """The special ids and segment ids of a text and of a pair, as the task features build them."""
        self._longest_added = max((len(t.content) for t in tokenizer.get_added_tokens_decoder().values()), default=0)
        """Characters of the longest added token (`_encode_heads`' margin)."""
        self._copies_returned = threading.Condition()
        self._idle_copies: list[Tokenizer] = []
        self._copies_built = 0
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            vocab[t] for t in self.special_tokens.in_id_order()
        )

    @property
    def mask_token(self) -> str:
        """The mask token as written in a text ([MASK], <mask>)."""
        return self.special_tokens.mask

    # ---- construction --------------------------------------------------------------------------------
    @classmethod
    def from_vocab(
        cls,
        vocab_file: str | Path,
        lowercase: bool = True,
        model_max_length: int = 512,
        uses_token_types: bool | None = None,
    ) -> BertTokenizer:
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
        tokenizer = build_wordpiece(vocab, lowercase)
        return cls(tokenizer, lowercase, model_max_length, BERT_SPECIAL_TOKENS, uses_token_types)

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, lowercase: bool | None = None) -> BertTokenizer:
        """From a model folder or built-in name: `tokenizer.json` if present, else `vocab.txt`.

        Lower-casing follows `tokenizer_config.json` (`do_lower_case`) unless `lowercase` is given; the longest
        input is the smaller of its `model_max_length` and the model's (config.json, past a family's position
        offset); special tokens and token types as the module docstring says.
        """
        folder = resolve_model_path(name_or_path)
        settings = _read_json(folder / "tokenizer_config.json")
        model = _model_config(folder)
        max_length = int(settings.get("model_max_length", 512))
        max_length = min(max_length, model.max_sequence_length if model else 512)
        do_lower = bool(settings.get("do_lower_case", True)) if lowercase is None else lowercase
        token_types = _uses_token_types(settings, model)
        if (folder / "tokenizer.json").is_file() and lowercase is None:
            tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
            configured = {**_read_json(folder / "special_tokens_map.json"), **settings}
            return cls(
                tokenizer,
                _normalizer_lowercases(tokenizer, do_lower),
                max_length,
                _found_special_tokens(tokenizer, configured),
                token_types,
                str(settings.get("tokenizer_class") or "BertTokenizer"),
            )
        if (folder / "vocab.txt").is_file():
            return cls.from_vocab(folder / "vocab.txt", do_lower, max_length, token_types)
        raise FileNotFoundError(f"no tokenizer in {folder}: expected tokenizer.json or vocab.txt")

    def save(self, folder: str | Path) -> Path:
        """Write tokenizer.json and tokenizer_config.json, and a WordPiece model's vocab.txt (loadable by
        `transformers`)."""
        target = Path(folder)
        target.mkdir(parents=True, exist_ok=True)
        if isinstance(self._tokenizer.model, WordPiece):
            by_id = sorted(self._tokenizer.get_vocab().items(), key=lambda item: item[1])
            (target / "vocab.txt").write_text("".join(token + "\n" for token, _ in by_id), encoding="utf-8")
        self._tokenizer.save(str(target / "tokenizer.json"))
        config: dict[str, Any] = {
            "do_lower_case": self.lowercase,
            "model_max_length": self.model_max_length,
            "tokenizer_class": self.tokenizer_class,
            **self.special_tokens.config_entries(),
        }
        if not self.uses_token_types:
            config["model_input_names"] = WITHOUT_TOKEN_TYPES
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
        return [self._tokenizer.id_to_token(int(i)) or self.special_tokens.unk for i in ids]

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
        overflow: bool = True,
    ) -> list[Encoding]:
        """Encode many inputs at once (in parallel, in Rust). `overflow=False`: only each input's first window is
        wanted (`encoding.overflowing` then holds no more than the tokenized part); a long text without a pair is
        then tokenized only as far as its first window needs (`_encode_heads`)."""
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
        added = self._added_tokens(pairs is not None) if add_special_tokens else 0
        _check_stride(stride, limit, added)
        with self._truncating(limit, truncation, stride) as tokenizer:
            if not overflow and pairs is None and stride == 0:
                return _encode_heads(tokenizer, list(texts), limit - added, self._longest_added, add_special_tokens)
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
        """Stack encodings into int64 arrays (B, S) padded with the pad token to the longest (or `pad_to`); segment
        ids 0 throughout for a model without token types."""
        arrays = pad_encodings(encodings, self.pad_id, pad_to)
        if not self.uses_token_types:
            arrays["token_type_ids"][:] = 0
        return arrays

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


def _register_special_tokens(tokenizer: Tokenizer, special_tokens: SpecialTokens) -> None:
    """Make the family's special tokens added special tokens (unsplit, never lower-cased), as Hugging Face's
    tokenizers have them: "[MASK]" written in a text is then the mask token, not `[`, `mask`, `]`. A vocabulary
    file, or a tokenizer.json saved without `added_tokens`, does not say so itself. Tokens already added keep their
    own settings (RoBERTa's <mask> takes the space before it)."""
    added = {token.content for token in tokenizer.get_added_tokens_decoder().values()}
    tokens = [
        AddedToken(token, special=True, normalized=False)
        for token in dict.fromkeys(special_tokens.in_id_order())
        if token not in added
    ]
    if tokens:
        tokenizer.add_special_tokens(tokens)


def _install_template(tokenizer: Tokenizer, special_tokens: SpecialTokens) -> None:
    """Give a WordPiece tokenizer saved without a post-processor BERT's template over its cls and sep tokens (what a
    WordPiece vocabulary means); other tokenizers keep theirs (SequenceTemplate.of refuses one without)."""
    if tokenizer.post_processor is not None or not isinstance(tokenizer.model, WordPiece):
        return
    cls_token, sep_token = special_tokens.cls, special_tokens.sep
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls_token} $A:0 {sep_token}:0",
        pair=f"{cls_token} $A:0 {sep_token}:0 $B:1 {sep_token}:1",
        special_tokens=[(cls_token, tokenizer.token_to_id(cls_token)), (sep_token, tokenizer.token_to_id(sep_token))],
    )


def _found_special_tokens(tokenizer: Tokenizer, configured: Mapping[str, Any]) -> SpecialTokens:
    """Each role's token: as `configured` (tokenizer_config.json over special_tokens_map.json) names it, else the
    first / last special token of the post-processor's template (cls / sep), else its usual spelling in the
    vocabulary. ValueError naming the roles nothing gives."""
    framing = _template_tokens(tokenizer)
    vocab = tokenizer.get_vocab()
    found: dict[str, str] = {}
    for role, keys in ROLE_KEYS.items():
        named = [_token_content(configured.get(key)) for key in keys]
        usual = [token for token in USUAL_SPELLINGS[role] if token in vocab]
        candidates = [*named, framing.get(role), *usual]
        token = next((candidate for candidate in candidates if candidate), None)
        if token is not None:
            found[role] = token
    missing = [role for role in ROLE_KEYS if role not in found]
    if missing:
        raise ValueError(
            f"cannot tell the tokenizer's special tokens for {missing}: name them in tokenizer_config.json"
        )
    return SpecialTokens(**found)


def _template_tokens(tokenizer: Tokenizer) -> dict[str, str]:
    """The cls (first) and sep (last) special tokens the post-processor puts around one text, where it has them."""
    if tokenizer.post_processor is None:
        return {}
    encoding = tokenizer.encode("a")
    specials = [
        token for token, sequence in zip(encoding.tokens, encoding.sequence_ids, strict=True) if sequence is None
    ]
    if not specials:
        return {}
    return {"cls": specials[0], "sep": specials[-1]}


def _token_content(value: object) -> str | None:
    """A special token as tokenizer_config.json writes it: the string, or an AddedToken's dict with `content`."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _uses_token_types(settings: Mapping[str, Any], model: BertConfig | None) -> bool | None:
    """Whether the model takes segment ids: `model_input_names` of tokenizer_config.json, else the model config's
    token types (more than one); None when neither says (the template decides)."""
    names = settings.get("model_input_names")
    if isinstance(names, list):
        return "token_type_ids" in names
    if model is not None:
        return model.type_vocab_size > 1
    return None


def _model_config(folder: Path) -> BertConfig | None:
    """The folder's model config when it has one we read (a tokenizer-only folder, or another model, has none)."""
    data = _read_json(folder / "config.json")
    if not data:
        return None
    try:
        return BertConfig.from_hf_dict(data)
    except (ValueError, TypeError):
        return None


def _encode_all(tokenizer: Tokenizer, inputs: list[str | tuple[str, str]], add_special_tokens: bool) -> list[Encoding]:
    """Encode `inputs`: one alone with `encode`, several with `encode_batch`, which spreads them over the library's
    thread pool; for a single input that hand-off to another thread and back costs more than the encoding itself
    (a sentence encodes in about 30 microseconds)."""
    if len(inputs) == 1:
        text, pair = inputs[0] if isinstance(inputs[0], tuple) else (inputs[0], None)
        return [tokenizer.encode(text, pair, add_special_tokens=add_special_tokens)]
    return list(tokenizer.encode_batch(inputs, add_special_tokens=add_special_tokens))


def _encode_heads(
    tokenizer: Tokenizer, texts: list[str], room: int, margin: int, add_special_tokens: bool
) -> list[Encoding]:
    """Each text's first window of `room` tokens, as `tokenizer` (which truncates) encodes the whole text, with a
    long text tokenized only in part: a prefix of `HEAD_CHARS_PER_TOKEN` characters per token of `room`, four times
    longer while it falls short.

    A prefix gives the whole text's first window when that window ends before the prefix's last word and at least
    `margin` characters (the longest added token) before the cut: normalizers and pre-tokenizers act on characters
    and words, each word is tokenized on its own, so only the word the cut runs through (or an added token it cuts)
    can come out otherwise. Where the pre-tokenizer makes one word of everything (no spaces, no pre-tokenizer), no
    prefix qualifies and the whole text is tokenized, as without the cut."""
    heads: list[Encoding | None] = [None] * len(texts)
    pending = list(range(len(texts)))
    chars = HEAD_CHARS_PER_TOKEN * room
    while pending:
        prefixes = [texts[i] if len(texts[i]) <= chars else texts[i][:chars] for i in pending]
        encoded = _encode_all(tokenizer, list(prefixes), add_special_tokens)
        short = []
        for index, prefix, encoding in zip(pending, prefixes, encoded, strict=True):
            if len(prefix) == len(texts[index]) or _clear_of_the_cut(encoding, len(prefix) - margin):
                heads[index] = encoding
            else:
                short.append(index)
        pending, chars = short, 4 * chars
    return [head for head in heads if head is not None]


def _clear_of_the_cut(encoding: Encoding, last_character: int) -> bool:
    """Whether a truncated encoding of a prefix ends by `last_character` and before the prefix's last word: what
    was cut off (`overflowing`, in order) holds a token of another word than its last token's."""
    kept = [end for (_, end), part in zip(encoding.offsets, encoding.sequence_ids, strict=True) if part is not None]
    if max(kept, default=0) > last_character:
        return False
    rest = [
        word
        for window in encoding.overflowing
        for word, part in zip(window.word_ids, window.sequence_ids, strict=True)
        if part is not None
    ]
    return any(word != rest[-1] for word in rest)


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
    """Whether the tokenizer.json's normalizer lower-cases: BertNormalizer's `lowercase` (`default` when unset), a
    Lowercase step anywhere in it. Without a normalizer, `default` for WordPiece (BERT's convention) and no for the
    others (byte-level BPE keeps case)."""
    state = json.loads(tokenizer.to_str())
    found = _lowercases(state.get("normalizer"))
    if found is not None:
        return found
    return default if (state.get("normalizer") or isinstance(tokenizer.model, WordPiece)) else False


def _lowercases(normalizer: Mapping[str, Any] | None) -> bool | None:
    """Whether a normalizer's state lower-cases; None when it does not say (none, or BertNormalizer without the key)."""
    if not normalizer:
        return None
    kind = normalizer.get("type")
    if kind == "BertNormalizer":
        value = normalizer.get("lowercase")
        return None if value is None else bool(value)
    if kind == "Sequence":
        return any(_lowercases(step) for step in normalizer.get("normalizers") or [])
    return kind == "Lowercase"


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}
