import gzip
import json

import pytest

from bert_model.tasks.readers import check_known_labels, label_set, read_conll, read_squad, read_text_dataset


def test_tsv_with_quotes_and_pairs(tmp_path) -> None:
    path = tmp_path / "dev.tsv"
    path.write_text('index\tsentence1\tsentence2\tlabel\n0\tHe said "hi\tOK\tentailment\n1\tA\tB\tnot_entailment\n')
    examples = read_text_dataset(path)
    assert [(e.text, e.pair, e.label, e.line) for e in examples] == [
        ('He said "hi', "OK", "entailment", 2),
        ("A", "B", "not_entailment", 3),
    ]
    assert label_set(examples) == ["entailment", "not_entailment"]


def test_gzipped_tsv_csv_and_jsonl_with_label_map(tmp_path) -> None:
    tsv = tmp_path / "train.tsv.gz"
    with gzip.open(tsv, "wt") as handle:
        handle.write("sentence\tlabel\ngood film\t1\nbad film\t0\n")
    csv_path = tmp_path / "train.csv"
    csv_path.write_text('text,label\n"good, really",1\nbad,0\n')
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text('{"text": "good", "label": 1}\n\n{"text": "bad", "label": 0}\n')
    names = {"0": "negative", "1": "positive"}
    for path in (tsv, csv_path, jsonl):
        examples = read_text_dataset(path, label_map=names)
        assert [e.label for e in examples] == ["positive", "negative"], path
    assert read_text_dataset(csv_path)[0].text == "good, really"
    assert read_text_dataset(jsonl)[1].line == 3


def test_integer_labels_sort_numerically(tmp_path) -> None:
    path = tmp_path / "d.tsv"
    path.write_text("sentence\tlabel\na\t10\nb\t2\nc\t1\n")
    assert label_set(read_text_dataset(path)) == ["1", "2", "10"]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.tsv", "sentence\tlabel\nfine\t1\ntoo\tmany\tfields\n", r"bad.tsv:3: expected 2 fields"),
        ("bad.jsonl", '{"text": "a", "label": 1}\n{"text": "b", "label": \n', r"bad.jsonl:2: invalid JSON"),
        ("bad2.jsonl", '{"text": "a", "label": 1}\n["b", 1]\n', r"bad2.jsonl:2: expected a JSON object"),
        (
            "nolabel.jsonl",
            '{"text": "a", "label": 1}\n{"text": "b"}\n',
            r"nolabel.jsonl:2: missing value for column 'label'",
        ),
        ("empty.tsv", "sentence\tlabel\n", r"empty.tsv: the data set is empty"),
        ("cols.tsv", "foo\tbar\nx\ty\n", r"cols.tsv: cannot tell which column holds the text"),
        ("data.txt", "x", r"unknown format"),
    ],
)
def test_malformed_classification_files_name_file_and_line(tmp_path, name, content, message) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        read_text_dataset(path)


def test_label_map_and_unknown_labels_are_reported(tmp_path) -> None:
    path = tmp_path / "eval.tsv"
    path.write_text("sentence\tlabel\na\t0\nb\t2\nc\tmaybe\n")
    with pytest.raises(ValueError, match=r"eval.tsv:3: label '2' is not in the label map"):
        read_text_dataset(path, label_map={"0": "negative", "1": "positive"})
    examples = read_text_dataset(path)
    with pytest.raises(ValueError, match=r"2 example\(s\) have labels the model does not know \(line 3: '2', line 4"):
        check_known_labels(examples, ["0", "1"], path)


def test_missing_file_is_a_file_not_found_error(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="no data file"):
        read_text_dataset(tmp_path / "absent.tsv")


def squad_file(tmp_path, qas, context="Paris is in France."):
    path = tmp_path / "squad.json"
    path.write_text(
        json.dumps({"version": "2.0", "data": [{"title": "T", "paragraphs": [{"context": context, "qas": qas}]}]})
    )
    return path


def test_squad_v2_reading(tmp_path) -> None:
    path = squad_file(
        tmp_path,
        [
            {"id": "a", "question": "Where?", "answers": [{"text": "France", "answer_start": 12}]},
            {"id": "b", "question": "Who?", "answers": [], "is_impossible": True},
        ],
    )
    first, second = read_squad(path)
    assert (first.id, first.answers[0].text, first.answers[0].start, first.title) == ("a", "France", 12, "T")
    assert second.is_impossible and not second.answers


@pytest.mark.parametrize(
    ("qas", "message"),
    [
        ([{"id": "a", "answers": []}], r"data\[0\].paragraphs\[0\].qas\[0\] lacks the field 'question'"),
        ([{"id": "a", "question": "q", "answers": [{"text": "x", "answer_start": 99}]}], r"\(id a\): answer_start 99"),
        ([{"id": "a", "question": "q", "answers": []}], r"\(id a\) has no answers and is not marked is_impossible"),
        ([], r"the data set is empty"),
    ],
)
def test_malformed_squad_records_are_located(tmp_path, qas, message) -> None:
    with pytest.raises(ValueError, match=message):
        read_squad(squad_file(tmp_path, qas))


def test_squad_syntax_error_names_the_line(tmp_path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"data": [\n{"title": "x",\n "paragraphs": [}\n]}')
    with pytest.raises(ValueError, match=r"broken.json:3: invalid JSON"):
        read_squad(path)


def test_conll_iob1_is_converted_and_docstart_skipped(tmp_path) -> None:
    path = tmp_path / "eng.testa"
    path.write_text(
        "-DOCSTART- -X- O O\n\nEU NNP I-NP I-ORG\nrejects VBZ I-VP O\nGerman JJ I-NP I-MISC\n\n"
        "Peter NNP I-NP I-PER\nBlackburn NNP I-NP I-PER\nParis NNP I-NP I-LOC\nBerlin NNP I-NP B-LOC\n"
    )
    first, second = read_conll(path)
    assert first.words == ["EU", "rejects", "German"] and first.tags == ["B-ORG", "O", "B-MISC"] and first.line == 3
    assert second.tags == ["B-PER", "I-PER", "B-LOC", "B-LOC"] and second.line == 7
    with pytest.raises(ValueError, match=r"eng.testa:3: tag 'I-ORG' starts an entity, which IOB2 forbids"):
        read_conll(path, scheme="iob2")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("EU B-ORG\nrejects\n", r"bad.txt:2: expected a word and a tag"),
        ("EU B-ORG\nrejects X-FOO\n", r"bad.txt:2: tag 'X-FOO' is not O, B-TYPE or I-TYPE"),
        ("-DOCSTART- -X- O O\n\n", r"bad.txt: the data set is empty"),
    ],
)
def test_malformed_conll_lines_name_file_and_line(tmp_path, content, message) -> None:
    path = tmp_path / "bad.txt"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        read_conll(path)


def test_real_files_parse(data_dir) -> None:
    assert len(read_text_dataset(data_dir / "sst2" / "dev.half-a.tsv")) == 436
    assert len(read_text_dataset(data_dir / "rte" / "superglue_jsonl" / "val.jsonl")) == 277
    iob1 = read_conll(data_dir / "conll2003" / "eng.testa")
    iob2 = read_conll(data_dir / "conll2003" / "iob2" / "valid.txt", scheme="iob2")
    assert len(iob1) == 3250 and [s.tags for s in iob1] == [s.tags for s in iob2]
    v2 = read_squad(data_dir / "squad_v2.0" / "dev-v2.0.subset-3articles.json")
    assert len(v2) == 1124 and sum(e.is_impossible for e in v2) == 541
