"""Data readers for fine-tuning and evaluation: GLUE-style text classification files, SQuAD JSON, CoNLL columns,
reranking lists.

Formats:
- classification: TSV (GLUE layout, read with `csv.QUOTE_NONE` as GLUE's own reader does), CSV (standard
  quoting) or JSON lines, with a header naming a text column or a text pair and a label column
  (`sentence`/`label` for SST-2, `sentence1`/`sentence2` or `premise`/`hypothesis` for pairs, ...);
- SQuAD v1.1 / v2.0 JSON (Rajpurkar et al. 2016, 2018): data -> paragraphs -> qas -> answers;
- CoNLL-2003 column files (Tjong Kim Sang & De Meulder 2003): one token per line, the NER tag in the last
  column, blank lines between sentences, `-DOCSTART-` lines skipped; IOB1 tags are converted to IOB2;
- reranking lists: JSON lines `{"query": str, "positive": str, "negatives": [str, ...]}`, negatives hardest first
  (the layout of sentence-transformers' hard-negative data sets, one line per query).

Files may be gzip-compressed (`.gz`). Every malformed record raises ValueError naming the file and the line
(or the JSON path of a SQuAD record); an empty data set is refused. Torch-free.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bert_model.tasks.ner import iob1_to_iob2

TEXT_PAIR_COLUMNS: tuple[tuple[str, str], ...] = (
    ("sentence1", "sentence2"),
    ("premise", "hypothesis"),
    ("question1", "question2"),
    ("question", "sentence"),
    ("text_a", "text_b"),
    ("text", "text_pair"),
)
TEXT_COLUMNS: tuple[str, ...] = ("sentence", "text", "review", "content", "document")
LABEL_COLUMNS: tuple[str, ...] = ("label", "labels", "gold_label", "target")
TagScheme = Literal["auto", "iob1", "iob2"]


# ---- classification ------------------------------------------------------------------------------------
@dataclass
class TextExample:
    """One classification example; `label` is None when the file has no label column."""

    text: str
    pair: str | None
    label: str | None
    line: int
    """1-based line of the record in its file."""


@dataclass
class TextColumns:
    """Which columns hold the text, the optional second text and the label."""

    text: str
    pair: str | None
    label: str | None


def read_text_dataset(
    path: str | Path,
    *,
    text_column: str | None = None,
    pair_column: str | None = None,
    label_column: str | None = None,
    label_map: Mapping[str, str] | None = None,
    require_labels: bool = True,
) -> list[TextExample]:
    """Read a TSV / CSV / JSONL classification file (format from the extension, `.gz` allowed).

    Columns are found from the header unless given. `label_map` renames raw labels (e.g. {"0": "negative"}):
    a raw label missing from it is an error naming the line.
    """
    source = Path(path)
    kind = _table_kind(source)
    rows = _jsonl_rows(source) if kind == "jsonl" else _delimited_rows(source, kind)
    examples: list[TextExample] = []
    columns: TextColumns | None = None
    for line, record in rows:
        if columns is None:
            columns = resolve_columns(list(record), source, text_column, pair_column, label_column, require_labels)
        examples.append(_text_example(record, columns, source, line, label_map))
    if not examples:
        raise ValueError(f"{source}: the data set is empty (no examples)")
    return examples


def resolve_columns(
    names: Sequence[str],
    source: Path,
    text: str | None = None,
    pair: str | None = None,
    label: str | None = None,
    require_labels: bool = True,
) -> TextColumns:
    """Pick the text / pair / label columns among `names` (given ones are checked, others detected)."""
    for given in (text, pair, label):
        if given is not None and given not in names:
            raise ValueError(f"{source}: no column {given!r}; the columns are {list(names)}")
    if text is None:
        detected = next(((a, b) for a, b in TEXT_PAIR_COLUMNS if a in names and b in names), None)
        if detected is not None:
            text, pair = detected[0], pair or detected[1]
        else:
            text = next((c for c in TEXT_COLUMNS if c in names), None)
    if text is None:
        raise ValueError(f"{source}: cannot tell which column holds the text among {list(names)}: name it")
    if label is None:
        label = next((c for c in LABEL_COLUMNS if c in names), None)
    if label is None and require_labels:
        raise ValueError(f"{source}: no label column among {list(names)} (expected one of {LABEL_COLUMNS})")
    return TextColumns(text, pair, label)


def _text_example(
    record: Mapping[str, Any], columns: TextColumns, source: Path, line: int, label_map: Mapping[str, str] | None
) -> TextExample:
    text = _field(record, columns.text, source, line)
    pair = _field(record, columns.pair, source, line) if columns.pair else None
    label = _field(record, columns.label, source, line, allow_empty=False) if columns.label else None
    if label is not None and label_map is not None:
        if label not in label_map:
            raise ValueError(f"{source}:{line}: label {label!r} is not in the label map {dict(label_map)}")
        label = label_map[label]
    return TextExample(text=text, pair=pair, label=label, line=line)


def _field(record: Mapping[str, Any], name: str, source: Path, line: int, allow_empty: bool = True) -> str:
    value = record.get(name)
    if value is None:
        raise ValueError(f"{source}:{line}: missing value for column {name!r}")
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, dict | list):
        raise ValueError(f"{source}:{line}: column {name!r} holds {type(value).__name__}, expected text")
    text = str(value)
    if not allow_empty and not text.strip():
        raise ValueError(f"{source}:{line}: empty value for column {name!r}")
    return text


def _table_kind(source: Path) -> str:
    name = source.name.lower().removesuffix(".gz")
    for suffix, kind in ((".tsv", "tsv"), (".csv", "csv"), (".jsonl", "jsonl"), (".json", "jsonl")):
        if name.endswith(suffix):
            return kind
    raise ValueError(f"{source}: unknown format; expected a .tsv, .csv or .jsonl file (optionally .gz)")


def _delimited_rows(source: Path, kind: str) -> Iterator[tuple[int, dict[str, str]]]:
    with open_text(source) as handle:
        # GLUE's TSVs contain bare quote characters: no quoting there; CSV files use standard quoting.
        reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE) if kind == "tsv" else csv.reader(handle)
        header: list[str] | None = None
        try:
            for row in reader:
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if header is None:
                    header = [name.strip() for name in row]
                    continue
                if len(row) != len(header):
                    raise ValueError(
                        f"{source}:{reader.line_num}: expected {len(header)} fields ({', '.join(header)}), "
                        f"got {len(row)}"
                    )
                yield reader.line_num, dict(zip(header, row, strict=True))
        except csv.Error as error:
            raise ValueError(f"{source}:{reader.line_num}: malformed {kind.upper()} line: {error}") from error


def _jsonl_rows(source: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with open_text(source) as handle:
        for line, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as error:
                raise ValueError(f"{source}:{line}: invalid JSON: {error.msg} (column {error.colno})") from error
            if not isinstance(record, dict):
                raise ValueError(f"{source}:{line}: expected a JSON object, got {type(record).__name__}")
            yield line, record


@dataclass
class RankingList:
    """A query and its candidate passages, one of them relevant."""

    query: str
    passages: list[str]
    gold: int | None = 0
    """Index of the relevant passage in `passages` (None: not known)."""


def read_ranking_lists(path: str | Path, negatives: int | None = None) -> list[RankingList]:
    """A reranking JSON-lines file: per line, the query and its positive (index 0), then its first `negatives`
    negatives (all of them when None). Errors name the file and the line."""
    source = Path(path)
    lists = [_ranking_list(record, f"{source}:{line}", negatives) for line, record in _jsonl_rows(source)]
    if not lists:
        raise ValueError(f"{source}: the data set is empty (no query lines)")
    return lists


def _ranking_list(record: dict[str, Any], where: str, negatives: int | None) -> RankingList:
    query, positive, others = record.get("query"), record.get("positive"), record.get("negatives")
    if not isinstance(query, str) or not query.strip() or not isinstance(positive, str) or not positive.strip():
        raise ValueError(f"{where}: query and positive must be non-empty strings")
    if not isinstance(others, list) or not others or not all(isinstance(text, str) for text in others):
        raise ValueError(f"{where}: negatives must be a non-empty list of strings")
    return RankingList(query, [positive, *others[:negatives]])


def label_set(examples: Sequence[TextExample]) -> list[str]:
    """The distinct labels, sorted (numerically when they are all integers)."""
    labels = {e.label for e in examples if e.label is not None}
    if all(_is_int(label) for label in labels):
        return sorted(labels, key=int)
    return sorted(labels)


def check_known_labels(examples: Sequence[TextExample], known: Sequence[str], source: str | Path) -> None:
    """Raise ValueError naming the first lines whose label the model does not know."""
    known_set = set(known)
    unknown = [(e.line, e.label) for e in examples if e.label is not None and e.label not in known_set]
    if unknown:
        shown = ", ".join(f"line {line}: {label!r}" for line, label in unknown[:5])
        raise ValueError(
            f"{source}: {len(unknown)} example(s) have labels the model does not know ({shown}); "
            f"the model's labels are {list(known)}"
        )


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


# ---- SQuAD ---------------------------------------------------------------------------------------------
@dataclass
class SquadAnswer:
    text: str
    start: int
    """Character offset of the answer in the context."""


@dataclass
class SquadExample:
    """One SQuAD question with its context and reference answers (empty for an unanswerable v2 question)."""

    id: str
    question: str
    context: str
    answers: list[SquadAnswer] = field(default_factory=list)
    is_impossible: bool = False
    title: str = ""


def read_squad(path: str | Path) -> list[SquadExample]:
    """Read a SQuAD v1.1 / v2.0 JSON file; errors name the file and the JSON path of the bad record."""
    source = Path(path)
    with open_text(source) as handle:
        try:
            data = json.load(handle)
        except json.JSONDecodeError as error:
            raise ValueError(f"{source}:{error.lineno}: invalid JSON: {error.msg} (column {error.colno})") from error
    articles = _expect(data, "data", list, source, "$") if isinstance(data, dict) else None
    if articles is None:
        raise ValueError(f"{source}: expected a JSON object with a 'data' list (SQuAD format)")
    examples: list[SquadExample] = []
    for a, article in enumerate(articles):
        title = str(article.get("title", "")) if isinstance(article, dict) else ""
        for p, paragraph in enumerate(_expect(article, "paragraphs", list, source, f"data[{a}]")):
            where = f"data[{a}].paragraphs[{p}]"
            context = _expect(paragraph, "context", str, source, where)
            for q, qa in enumerate(_expect(paragraph, "qas", list, source, where)):
                examples.append(_squad_example(qa, context, title, source, f"{where}.qas[{q}]"))
    if not examples:
        raise ValueError(f"{source}: the data set is empty (no questions)")
    return examples


def _squad_example(qa: Any, context: str, title: str, source: Path, where: str) -> SquadExample:
    qid = str(_expect(qa, "id", (str, int), source, where))
    question = _expect(qa, "question", str, source, where)
    impossible = bool(qa.get("is_impossible", False))
    answers = []
    for n, answer in enumerate(qa.get("answers", [])):
        text = _expect(answer, "text", str, source, f"{where}.answers[{n}] (id {qid})")
        start = _expect(answer, "answer_start", int, source, f"{where}.answers[{n}] (id {qid})")
        if not 0 <= start <= len(context) - len(text):
            raise ValueError(f"{source}: {where}.answers[{n}] (id {qid}): answer_start {start} is outside the context")
        answers.append(SquadAnswer(text, start))
    if not answers and not impossible:
        raise ValueError(f"{source}: {where} (id {qid}) has no answers and is not marked is_impossible")
    return SquadExample(qid, question, context, answers, impossible, title)


def _expect(record: Any, key: str, kind: type | tuple[type, ...], source: Path, where: str) -> Any:
    if not isinstance(record, dict):
        raise ValueError(f"{source}: {where} must be a JSON object, got {type(record).__name__}")
    if key not in record:
        raise ValueError(f"{source}: {where} lacks the field {key!r}")
    value = record[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{source}: {where}.{key} has the wrong type ({type(value).__name__})")
    return value


# ---- CoNLL ---------------------------------------------------------------------------------------------
@dataclass
class ConllSentence:
    words: list[str]
    tags: list[str]
    """IOB2 tags, one per word."""
    line: int
    """1-based line of the sentence's first word."""


def read_conll(path: str | Path, *, tag_column: int = -1, scheme: TagScheme = "auto") -> list[ConllSentence]:
    """Read a CoNLL column file; tags are converted to IOB2 (IOB1 conversion is a no-op on IOB2 input).

    `scheme="iob2"` refuses I- tags that do not continue an entity of their type.
    """
    if scheme not in ("auto", "iob1", "iob2"):
        raise ValueError(f"scheme must be auto, iob1 or iob2, got {scheme!r}")
    source = Path(path)
    sentences: list[ConllSentence] = []
    for first_line, rows in _conll_blocks(source):
        words, tags = [], []
        for line, columns in rows:
            tag = columns[tag_column] if -len(columns) <= tag_column < len(columns) else None
            if tag is None or len(columns) < 2:
                raise ValueError(f"{source}:{line}: expected a word and a tag (column {tag_column}), got {columns}")
            _check_tag(tag, source, line)
            words.append(columns[0])
            tags.append(tag)
        converted = iob1_to_iob2(tags)
        if scheme == "iob2" and converted != tags:
            bad = next(i for i, (a, b) in enumerate(zip(tags, converted, strict=True)) if a != b)
            raise ValueError(f"{source}:{rows[bad][0]}: tag {tags[bad]!r} starts an entity, which IOB2 forbids")
        sentences.append(ConllSentence(words, converted, first_line))
    if not sentences:
        raise ValueError(f"{source}: the data set is empty (no sentences)")
    return sentences


def _conll_blocks(source: Path) -> Iterator[tuple[int, list[tuple[int, list[str]]]]]:
    block: list[tuple[int, list[str]]] = []
    with open_text(source) as handle:
        for line, text in enumerate(handle, start=1):
            columns = text.split()
            if columns and columns[0] == "-DOCSTART-":
                columns = []
            if columns:
                block.append((line, columns))
            elif block:
                yield block[0][0], block
                block = []
    if block:
        yield block[0][0], block


def _check_tag(tag: str, source: Path, line: int) -> None:
    if tag != "O" and not (tag[:2] in ("B-", "I-") and len(tag) > 2):
        raise ValueError(f"{source}:{line}: tag {tag!r} is not O, B-TYPE or I-TYPE")


# ---- files ---------------------------------------------------------------------------------------------
def open_text(source: Path) -> io.TextIOWrapper:
    """Open a UTF-8 text file, transparently gunzipping `.gz`; FileNotFoundError names the path."""
    if not source.is_file():
        raise FileNotFoundError(f"no data file at {source}")
    if source.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(source, "rb"), encoding="utf-8", newline="")
    return open(source, encoding="utf-8", newline="")
