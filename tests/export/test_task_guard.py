"""The task-level accuracy guard: `bertserve evaluate`'s windows, decoding and metrics; refusals; its inputs.

Fast tests use the tiny models (random weights, 50x head weights for clear margins) and small eval files written
here; the real default models are checked on ../shared/data (their export is marked slow).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from bert_model.config import BertConfig
from bert_model.registry import resolve_model_path
from bert_model.tokenization import BertTokenizer
from bundles.spec import BundleManifest
from export import parity
from export import variants as variant_table
from export.bundle import build_bundle, torch_outputs
from export.parity import AccuracyGuardError
from export.task_guard import GuardOptions, build_guard
from export.wrapper import load_task_model

NO_DATA = Path("/nonexistent")
CONTEXT = "the film was very good and the acting was great but the plot was boring"
LONG_CONTEXT = " ".join(["it was not a good movie and the plot of it was very bad"] * 6)


def squad_file(folder: Path) -> Path:
    """Six questions over a short and a long context (several 64-token windows), answers in the vocabulary."""

    def qa(qid: str, question: str, context: str, answer: str) -> dict:
        return {"id": qid, "question": question, "answers": [{"text": answer, "answer_start": context.index(answer)}]}

    paragraphs = [
        {
            "context": CONTEXT,
            "qas": [
                qa("q1", "the acting was", CONTEXT, "great"),
                qa("q2", "the film was", CONTEXT, "very good"),
                qa("q3", "the plot was", CONTEXT, "boring"),
            ],
        },
        {
            "context": LONG_CONTEXT,
            "qas": [
                qa("q4", "it was not a", LONG_CONTEXT, "good movie"),
                qa("q5", "the plot was", LONG_CONTEXT, "very bad"),
                qa("q6", "a good", LONG_CONTEXT, "movie"),
            ],
        },
    ]
    path = folder / "tiny-squad.json"
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "tiny", "paragraphs": paragraphs}]}))
    return path


def conll_file(folder: Path) -> Path:
    sentences = [
        [("w10", "B-PER"), ("w11", "I-PER"), ("was", "O"), ("in", "O"), ("w12", "B-LOC")],
        [("the", "O"), ("film", "O"), ("of", "O"), ("w13", "B-PER"), ("is", "O"), ("good", "O")],
        [("w14", "B-LOC"), ("w15", "I-LOC"), ("and", "O"), ("w16", "B-LOC")],
    ]
    path = folder / "tiny.conll"
    path.write_text("\n\n".join("\n".join(f"{w} NN O {t}" for w, t in s) for s in sentences) + "\n")
    return path


def damage(source: Path, target: Path, scale: float = 1.0) -> None:
    """A copy of the graph with gaussian noise (`scale` x each weight matrix's std) on every weight matrix."""
    graph = onnx.load(str(source))
    rng = np.random.default_rng(0)
    for initializer in graph.graph.initializer:
        array = numpy_helper.to_array(initializer)
        if array.dtype == np.float32 and array.ndim == 2:
            noisy = array + rng.normal(0.0, scale * float(array.std()), array.shape).astype(np.float32)
            initializer.CopyFrom(numpy_helper.from_array(noisy, initializer.name))
    onnx.save(graph, str(target))


@pytest.fixture()
def damaged_int8(monkeypatch: pytest.MonkeyPatch) -> None:
    """`cpu-int8` quantizes a damaged copy of the fused graph: a variant that gives other answers."""
    recipe = variant_table.RECIPES["cpu-int8"]

    def build(sources: variant_table.Sources, target: Path) -> None:
        broken = target.with_name("damaged-fused.onnx")
        damage(sources.fused, broken)
        recipe.build(variant_table.Sources(raw=sources.raw, fused=broken), target)
        broken.unlink()

    monkeypatch.setitem(variant_table.RECIPES, "cpu-int8", variant_table.Recipe(**{**recipe.__dict__, "build": build}))


# ---- guard inputs -----------------------------------------------------------------------------------------
def guard_of(name: str, task: str, **options: object) -> object:
    folder = resolve_model_path(name)
    return build_guard(
        task, BertConfig.load(folder), BertTokenizer.from_pretrained(folder), 512, GuardOptions(**options)
    )


def test_squad_guard_reads_the_windows_evaluate_uses(data_dir: Path) -> None:
    guard = guard_of("minilm-squad", "qa", data_dir=data_dir, limit=40)
    assert guard.judgment == "eval-set" and guard.source.endswith("squad_v1.1/dev-v1.1.half-a.json")
    assert guard.examples == 40
    # the model's stored settings (it was trained on 256-token windows), not the bundle's 512 positions
    assert guard.settings["max_seq_length"] == 256 and guard.settings["doc_stride"] == 128
    assert max(len(f) for f in guard.features) <= 256
    assert len(guard.features) > guard.examples  # long paragraphs: several doc_stride windows per question
    assert sorted(i for batch in guard.order for i in batch) == list(range(len(guard.features)))


def test_shorter_bundles_shrink_the_windows_like_the_service() -> None:
    from export.task_guard import task_options

    config = BertConfig.load(resolve_model_path("minilm-squad"))
    options = task_options("qa", config, 128)
    assert (options.max_seq_length, options.max_query_length, options.doc_stride) == (128, 62, 31)
    assert task_options("qa", config, 512).max_seq_length == 256


@pytest.mark.parametrize(
    ("name", "task", "data", "limit"),
    [
        ("minilm-squad", "qa", "squad_v1.1/dev-v1.1.half-a.json", 12),
        ("minilm-conll03", "ner", "conll2003/iob2/valid.txt", 40),
    ],
)
def test_guard_fp32_figures_are_bertserve_evaluate_s(
    name: str, task: str, data: str, limit: int, data_dir: Path
) -> None:
    """The guard decodes and scores with evaluate's recipe: on the same examples, PyTorch fp32 gets the same F1."""
    from bert_model.finetuning.run import evaluate_model

    model, _, folder = load_task_model(name)
    guard = build_guard(
        task, model.config, BertTokenizer.from_pretrained(folder), 512, GuardOptions(data_dir=data_dir, limit=limit)
    )
    scored = guard.score(torch_outputs(model, task, guard.feeds))
    evaluated = evaluate_model(name, None, data_dir / data, limit=limit)
    assert evaluated["examples"] == guard.examples == limit
    assert scored.metrics["f1"] == pytest.approx(evaluated["f1"], abs=1e-9)
    if task == "qa":
        assert scored.metrics["exact_match"] == pytest.approx(evaluated["exact_match"], abs=1e-9)


def test_default_data_the_model_cannot_score_falls_back_to_agreement(
    tiny_models: dict[str, Path], data_dir: Path
) -> None:
    """The tiny NER model knows PER and LOC only: CoNLL's ORG / MISC tags cannot be scored, its texts still judge."""
    folder = tiny_models["ner"]
    guard = build_guard(
        "ner",
        BertConfig.load(folder),
        BertTokenizer.from_pretrained(folder),
        64,
        GuardOptions(data_dir=data_dir, limit=8),
    )
    assert guard.judgment == "agreement-with-fp32" and guard.source.endswith("conll2003/iob2/valid.txt")
    assert guard.examples == 8 and "cannot be scored by this model" in guard.note and "B-ORG" in guard.note


# ---- tiny models: eval sets, damage, thresholds -------------------------------------------------------------
def test_qa_eval_set_guard_on_a_squad_file(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    data = squad_file(tmp_path)
    result = build_bundle(tiny_models["qa"], tmp_path / "b", "cpu-fp32,cpu-int8", max_seq_len=64, eval_data=data)
    guard = result.manifest.source["guard_inputs"]
    assert guard["judgment"] == "eval-set" and guard["source"] == str(data) and guard["count"] == 6
    assert guard["features"] > 6  # the long context spans several 64-token windows
    assert set(guard["pytorch_fp32"]) >= {"f1", "exact_match"}
    int8 = result.manifest.variants["cpu-int8"].parity
    assert int8["judgment"] == "eval-set" and int8["metric"] == "squad_f1"
    assert int8["f1_fp32"] == guard["pytorch_fp32"]["f1"] and int8["f1"] >= int8["f1_fp32"] - 1.0
    assert result.manifest.variants["cpu-fp32"].parity["judgment"] == "max-abs-diff"


def test_ner_eval_set_guard_on_a_conll_file(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    data = conll_file(tmp_path)
    result = build_bundle(tiny_models["ner"], tmp_path / "b", "cpu-fp32,gpu-fp16", max_seq_len=64, eval_data=data)
    guard = result.manifest.source["guard_inputs"]
    assert guard["judgment"] == "eval-set" and guard["count"] == 3 and guard["settings"]["max_seq_length"] == 64
    fp16 = result.manifest.variants["gpu-fp16"].parity
    assert fp16["metric"] == "entity_f1" and fp16["f1"] == pytest.approx(fp16["f1_fp32"], abs=1.0)


def test_eval_set_threshold_that_cannot_pass_refuses_and_writes_nothing(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parity, "F1_POINTS", -1.0)  # a variant would have to beat fp32 by a point
    data = squad_file(tmp_path)
    with pytest.raises(
        AccuracyGuardError, match=r"variant cpu-int8 refused: SQuAD F1 [\d.]+ vs PyTorch fp32 [\d.]+ on 6"
    ):
        build_bundle(
            tiny_models["qa"], tmp_path / "b", "cpu-fp32,cpu-int8", max_seq_len=64, eval_data=data, strict=True
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-squad.json"]  # no bundle, no scratch folder


@pytest.mark.usefixtures("damaged_int8")
@pytest.mark.parametrize(
    ("task", "metric"), [("qa", "answer F1"), ("ner", "entity F1"), ("classify", "label_agreement")]
)
def test_damaged_variant_is_refused_with_its_figure(
    task: str, metric: str, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    result = build_bundle(tiny_models[task], tmp_path / "b", "cpu-fp32,cpu-int8", max_seq_len=64, data_dir=NO_DATA)
    assert list(result.refused) == ["cpu-int8"] and result.refused["cpu-int8"].startswith(metric)
    assert sorted(p.name for p in (tmp_path / "b").glob("*.onnx")) == ["cpu-fp32.onnx"]
    assert result.manifest.source["refused_variants"] == result.refused
    with pytest.raises(AccuracyGuardError, match=f"variant cpu-int8 refused: {metric}"):
        build_bundle(tiny_models[task], tmp_path / "c", "cpu-int8", max_seq_len=64, data_dir=NO_DATA)  # nothing left
    assert not (tmp_path / "c").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["b"]


def test_bad_guard_inputs_fail_before_any_work(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    model = tiny_models["qa"]
    with pytest.raises(FileNotFoundError, match=r"eval data file .*missing\.json does not exist"):
        build_bundle(model, tmp_path / "b", eval_data=tmp_path / "missing.json")
    data = conll_file(tmp_path)
    with pytest.raises(ValueError, match="not both"):
        build_bundle(model, tmp_path / "b", eval_data=data, calibration=data)
    with pytest.raises(ValueError, match="limit must be a positive integer"):
        build_bundle(model, tmp_path / "b", guard_limit=0)
    with pytest.raises(ValueError, match=r"tiny\.conll"):  # a CoNLL file is no SQuAD JSON
        build_bundle(model, tmp_path / "b", "cpu-fp32", max_seq_len=64, eval_data=data)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.conll"]


def test_calibration_texts_are_judged_by_agreement(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    texts = tmp_path / "questions.txt"
    texts.write_text(f"the acting was\t{CONTEXT}\nthe plot was\t{LONG_CONTEXT}\n")
    result = build_bundle(tiny_models["qa"], tmp_path / "b", "cpu-fp32,gpu-fp16", max_seq_len=64, calibration=texts)
    guard = result.manifest.source["guard_inputs"]
    assert guard["judgment"] == "agreement-with-fp32" and guard["count"] == 2 and "pytorch_fp32" not in guard
    assert result.manifest.variants["gpu-fp16"].parity["answer_f1_vs_fp32"] == 100.0
    bad = tmp_path / "no-context.txt"
    bad.write_text("a question without its context\n")
    with pytest.raises(ValueError, match="need a question and a context"):
        build_bundle(tiny_models["qa"], tmp_path / "c", "cpu-fp32", max_seq_len=64, calibration=bad)


# ---- the real default models (slow: a full export each) -----------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", ["minilm-squad", "minilm-conll03"])
def test_default_models_pass_their_task_guards_on_real_data(name: str, data_dir: Path, tmp_path: Path) -> None:
    result = build_bundle(name, tmp_path / name, data_dir=data_dir)  # every default variant, 1000 examples
    manifest = BundleManifest.read(tmp_path / name)
    guard = manifest.source["guard_inputs"]
    assert guard["judgment"] == "eval-set" and guard["count"] == 1000
    print(f"\n{name}: PyTorch fp32 {guard['pytorch_fp32']}; refused {result.refused}")
    assert manifest.variants["cpu-fp32"].parity["max_abs_diff"] <= 1e-4
    for variant, spec in manifest.variants.items():
        figures = {k: v for k, v in spec.parity.items() if k not in ("guard_source", "threshold")}
        print(f"{name} {variant}: {figures}")
        if spec.precision != "fp32":
            assert spec.parity["f1"] >= spec.parity["f1_fp32"] - 1.0
    assert "gpu-fp16" in manifest.variants  # fp16 keeps the answers
    for why in result.refused.values():
        assert why.startswith(("SQuAD F1", "entity F1", "skipped"))
