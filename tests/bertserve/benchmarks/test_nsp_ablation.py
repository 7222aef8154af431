"""The NSP ablation end to end on a stand-in data folder: a small synthetic corpus under the real file names, tiny
RTE and SST-2 files, seconds of pretraining per run. Checks the pipeline and the report, not the figures."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from bertserve.benchmarks import nsp_ablation
from tests.bert_model.pretraining.conftest import synthetic_corpus

WORDS = "ship sail wave harbour farm cow field city street tram army siege castle".split()  # noqa: SIM905


def _stand_in_data(root: Path) -> Path:
    """The files the benchmark reads, small: the corpus, RTE train/dev and SST-2 train/dev.half-a."""
    rng = random.Random(0)
    for index, name in enumerate(nsp_ablation.CORPUS):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(synthetic_corpus(60, seed=index))
    rte = root / "rte/glue_tsv_converted"
    rte.mkdir(parents=True)
    for split, count in (("train", 64), ("dev", 16)):
        rows = ["index\tsentence1\tsentence2\tlabel"]
        for i in range(count):
            first = " ".join(rng.choices(WORDS, k=8))
            second = first if i % 2 else " ".join(rng.choices(WORDS, k=5))
            rows.append(f"{i}\t{first}\t{second}\t{'entailment' if i % 2 else 'not_entailment'}")
        (rte / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    sst2 = root / "sst2"
    sst2.mkdir()
    rows = ["sentence\tlabel"] + [f"{' '.join(rng.choices(WORDS, k=6))}\t{i % 2}" for i in range(64)]
    with gzip.open(sst2 / "train.tsv.gz", "wt") as handle:
        handle.write("\n".join(rows) + "\n")
    (sst2 / "dev.half-a.tsv").write_text("\n".join(rows[:17]) + "\n")
    return root


@pytest.mark.slow
@pytest.mark.integration
def test_ablation_pipeline_writes_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _stand_in_data(tmp_path / "data")
    out, reports = tmp_path / "out", tmp_path / "bench"
    argv = ["--data", str(data), "--out", str(out), "--report-dir", str(reports), "--minutes", "0.05", "--seeds", "3"]
    nsp_ablation.main(argv)
    report = json.loads((reports / "nsp-ablation.json").read_text())
    runs = {run["objective"]: run for run in report["runs"]}
    assert set(runs) == {"mlm-nsp", "mlm"}
    assert "nsp_acc" in runs["mlm-nsp"]["own_eval"] and "nsp_acc" not in runs["mlm"]["own_eval"]
    for run in runs.values():
        assert run["steps"] >= 1 and set(run["mlm_on"]) == {"mlm-nsp", "mlm"}
        assert set(run["downstream"]) == {"rte", "sst2"} and all(0 <= v <= 100 for v in run["downstream"].values())
    assert json.loads((out / "runs/mlm-seed3/config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    table = (reports / "nsp-ablation.md").read_text()
    assert "MLM only, packed (RoBERTa)" in table and "| seed |" in table and table.startswith("Measured ")
    assert "nsp-ablation.md" in capsys.readouterr().out
    nsp_ablation.main(argv)  # finished runs are reused: the second call measures nothing again
    assert json.loads((reports / "nsp-ablation.json").read_text())["runs"] == report["runs"]
