"""Payload readers on the real data sets, the built-in sample, and clear errors on bad files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from loadtests.payloads import Payloads, load_payloads, read_conll, read_sentences, read_squad


def test_builtin_sample_without_paths() -> None:
    payloads = load_payloads()
    assert all(count >= 4 for count in payloads.counts().values())
    assert set(payloads.sources.values()) == {"built-in sample"}
    assert Payloads.from_json(payloads.to_json()) == payloads


def test_real_sst2_squad_conll(data_dir: Path) -> None:
    dev = read_sentences(data_dir / "sst2" / "dev.half-a.tsv")
    assert len(dev) == 436 and not any(s.endswith(("\t0", "\t1")) for s in dev)
    train = read_sentences(data_dir / "sst2" / "train.tsv.gz")
    assert len(train) >= 67_000
    pairs = read_squad(data_dir / "squad_v1.1" / "dev-v1.1.half-a.json")
    assert len(pairs) == 5397
    question, context = pairs[0]
    assert question.endswith("?") and len(context) > 200
    conll = read_conll(data_dir / "conll2003" / "iob2" / "valid.txt")
    assert len(conll) == 3250 and "-DOCSTART-" not in " ".join(conll[:50])
    assert len(read_conll(data_dir / "conll2003" / "iob2" / "train.txt.gz")) == 14041
    payloads = load_payloads(
        sst2=data_dir / "sst2" / "dev.half-a.tsv",
        squad=data_dir / "squad_v1.1" / "dev-v1.1.half-a.json",
        conll=data_dir / "conll2003" / "iob2" / "valid.txt",
        limit=300,
        seed=1,
    )
    assert payloads.counts() == {"classify": 300, "qa": 300, "ner": 300}
    assert payloads.sources["qa"].endswith("dev-v1.1.half-a.json")
    again = load_payloads(sst2=data_dir / "sst2" / "dev.half-a.tsv", limit=300, seed=1)
    assert again.classify == payloads.classify  # seeded sample


def test_bad_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"missing\.tsv does not exist"):
        load_payloads(sst2=tmp_path / "missing.tsv")
    with pytest.raises(ValueError, match="is not a file"):
        load_payloads(squad=tmp_path)
    bad_json = tmp_path / "squad.json"
    bad_json.write_text("{not json")
    with pytest.raises(ValueError, match=r"squad\.json is not valid JSON"):
        read_squad(bad_json)
    bad_json.write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match="not a SQuAD file"):
        read_squad(bad_json)
    tsv = tmp_path / "x.tsv"
    tsv.write_text("text\tlabel\nhello\t1\n")
    with pytest.raises(ValueError, match="no header with a `sentence` column"):
        read_sentences(tsv)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match="no sentences in"):
        read_sentences(empty)
    not_conll = tmp_path / "conll.txt"
    not_conll.write_text("justonecolumn\n")
    with pytest.raises(ValueError, match="is not CoNLL"):
        read_conll(not_conll)
    binary = tmp_path / "data.txt.gz"
    binary.write_bytes(gzip.compress(b"\xff\xfe\x00bad"))
    with pytest.raises(ValueError, match="cannot be read as UTF-8"):
        read_sentences(binary)
    not_gzip = tmp_path / "fake.tsv.gz"
    not_gzip.write_text("sentence\tlabel\n")
    with pytest.raises(ValueError, match="cannot be read"):
        read_sentences(not_gzip)
    with pytest.raises(ValueError, match="at least 1"):
        load_payloads(limit=0)


def test_unreadable_file(tmp_path: Path) -> None:
    import os

    locked = tmp_path / "locked.txt"
    locked.write_text("a sentence\n")
    locked.chmod(0)
    try:
        if os.access(locked, os.R_OK):
            pytest.skip("running as a user who can read any file (root)")
        with pytest.raises(PermissionError, match="not readable"):
            read_sentences(locked)
    finally:
        locked.chmod(0o644)
