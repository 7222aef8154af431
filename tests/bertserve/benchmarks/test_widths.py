"""The batch-width benchmark on tiny bundles: the batches it pads, the report it writes, its input errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bert_model.tasks.features import Feature
from bertserve.benchmarks.widths import cut_batches, main, read_features
from bundles.serving import open_bundle
from tests.service.tiny_bundles import with_openvino_variant

SENTENCES = [
    "a gripping , beautifully acted film",
    "the plot is thin and the jokes fall flat , and nobody in the cast seems to care",
    "an unexpectedly moving portrait of a family that refuses to fall apart",
    "tedious",
    "one of the best films of the year , with a score that lingers long after the credits",
    "i would not recommend it to anyone who values their time",
]


def _data(tmp_path: Path, count: int = 30) -> Path:
    path = tmp_path / "sst2.tsv"
    rows = [f"{SENTENCES[i % len(SENTENCES)]} {'again ' * (i % 7)}\t{i % 2}" for i in range(count)]
    path.write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    return path


def test_batches_are_length_sorted_groups_cut_in_order() -> None:
    rows = [Feature(0, [1] * length, [0] * length) for length in (5, 9, 3, 7, 8, 2, 6, 4, 1)]
    batches = cut_batches(rows, batch_size=2, group=4, seed=0)
    assert sorted(len(row) for batch in batches for row in batch) == list(range(1, 10))
    assert [len(batch) for batch in batches] == [2, 2, 2, 2, 1]
    for first, second in zip(batches[0::2], batches[1::2], strict=False):  # one group of 4 = two batches
        lengths = [len(row) for row in first + second]
        assert lengths == sorted(lengths)


def test_report_pads_every_batch_to_each_multiple(tiny_bundles: dict[str, Path], tmp_path: Path) -> None:
    """Padded tokens per multiple equal the batches' rows x (longest row rounded up, at most the graph's 64)."""
    pytest.importorskip("openvino", reason="the optional openvino extra is not installed")
    folder = with_openvino_variant(tiny_bundles["classify"], tmp_path)
    data = _data(tmp_path)
    out = tmp_path / "out"
    argv = [str(folder), "--data", str(data), "--rounds", "1", "--limit", "24", "--group", "8", "--out", str(out)]
    assert main(argv) == 0
    report = json.loads((out / f"widths-{folder.name}.json").read_text())
    markdown = (out / f"widths-{folder.name}.md").read_text()
    assert set(report["results"]) == {"cpu-fp32", "openvino-fp32"}
    assert report["features"] == 24 and report["batches"] == 3
    rows = read_features(open_bundle(folder), data, 24)
    batches = cut_batches(rows, 8, 8, 0)
    for variant, by_multiple in report["results"].items():
        assert list(by_multiple) == ["1", "8", "16", "32"]
        assert by_multiple["1"]["vs_longest_row"] == 1.0
        for multiple, figures in by_multiple.items():
            m = int(multiple)
            expected = sum(len(b) * min(-(-max(map(len, b)) // m) * m, 64) for b in batches)
            assert figures["padded_tokens"] == expected
            assert figures["median_ms_per_batch"] > 0
        assert f"| {variant} |" in markdown
    command = "python -m bertserve.benchmarks.widths " + " ".join(argv)
    assert report["provenance"]["command"] == command and report["provenance"]["cpu"]["cores"] >= 1
    assert markdown.startswith("Measured ") and f" by `{command}`." in markdown.splitlines()[0]


def test_qa_features_are_the_models_windows(tiny_bundles: dict[str, Path], tmp_path: Path) -> None:
    context = " ".join(f"sentence {i} tells of the river that runs through the old town ." for i in range(12))
    squad = {"data": [{"title": "t", "paragraphs": [{"context": context, "qas": [
        {"id": "a", "question": "what runs through the town ?", "answers": [{"text": "the river", "answer_start": 11}]},
    ]}]}]}  # fmt: skip
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(squad))
    rows = read_features(open_bundle(tiny_bundles["qa"]), path, 10)
    assert len(rows) > 1  # a context longer than one 64-token window
    assert all(len(row) <= 64 for row in rows)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--data", "missing.tsv"], "is not a file"),
        (["--multiples", "0,16"], "--multiples must be positive"),
        (["--rounds", "0"], "--rounds must be at least 1"),
        (["--variants", "gpu-fp16"], "are not CPU variants"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tiny_bundles: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    data = _data(tmp_path)
    argv = [str(tiny_bundles["classify"]), "--data", str(data), "--out", str(tmp_path / "out"), *args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
    assert not (tmp_path / "out").exists()


def test_encoder_bundles_are_refused(tiny_bundles: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'embed' bundle"):
        read_features(open_bundle(tiny_bundles["embed"]), _data(tmp_path), 5)
