"""`--variant auto`: the choice logic with injected timings and a fake clock, and the service choosing on a tiny
bundle. No assertion depends on how fast anything really runs."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from bundles.runtimes import CPU_PROVIDER as CPU
from bundles.spec import MANIFEST_FILE
from service.backends.variant_timing import (
    MAX_ROUNDS,
    MIN_ROUNDS,
    Shape,
    choose_fastest,
    pick_fastest,
    timing_feed,
    timing_shapes,
)
from service.engine.engine import Engine
from service.settings import ServiceSettings

GUARDED = {"judgment": "eval-set", "label_agreement": 0.995}
SHAPES = ("b1x128", "b8x128")


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeBackend:
    """Reports injected seconds per call (true speed per shape × noise) and advances the fake clock by them."""

    def __init__(self, variant: str, speed_ms: dict[str, float], clock: FakeClock, rng: random.Random) -> None:
        self.variant = variant
        self.speed_ms = speed_ms
        self.clock = clock
        self.rng = rng
        self.started = self.closed = False
        self.fail_start = False

    async def start(self) -> None:
        if self.fail_start:
            raise RuntimeError("graph needs an operator this runtime lacks")
        self.started = True
        self.clock.now += 0.05

    async def time_call(self, inputs: dict[str, np.ndarray]) -> float:
        label = f"b{inputs['input_ids'].shape[0]}x{inputs['input_ids'].shape[1]}"
        seconds = self.speed_ms[label] / 1000 * self.rng.uniform(0.97, 1.03)
        if self.rng.random() < 0.2:  # another process took the core: a call several times slower
            seconds *= self.rng.uniform(2.0, 6.0)
        self.clock.now += seconds
        return seconds

    async def close(self) -> None:
        self.closed = True


def feeds() -> dict[str, dict[str, np.ndarray]]:
    return {label: timing_feed(Shape(int(label[1]), 128), 101, 102, [7, 8, 9]) for label in SHAPES}


def run_choice(speeds: dict[str, dict[str, float]], seed: int, budget_s: float = 2.0, fail: tuple[str, ...] = ()):
    clock, rng = FakeClock(), random.Random(seed)
    backends: dict[str, FakeBackend] = {}

    def make(name: str) -> FakeBackend:
        backends[name] = FakeBackend(name, speeds[name], clock, rng)
        backends[name].fail_start = name in fail
        return backends[name]

    chosen, choice = asyncio.run(choose_fastest(list(speeds), make, feeds(), budget_s, clock=clock))
    return chosen, choice, backends


def relative_cost(speeds: dict[str, dict[str, float]], name: str) -> float:
    """The true mean relative time of `name` over the shapes (1.0 = the fastest at every shape)."""
    return sum(speeds[name][s] / min(v[s] for v in speeds.values()) for s in SHAPES) / len(SHAPES)


def test_noisy_timings_pick_a_variant_within_5_percent_of_the_fastest() -> None:
    speeds = {
        "openvino-int8": {"b1x128": 4.9, "b8x128": 31.0},
        "openvino-bf16": {"b1x128": 5.0, "b8x128": 30.2},
        "cpu-int8": {"b1x128": 5.6, "b8x128": 42.0},
        "cpu-fp32": {"b1x128": 10.1, "b8x128": 75.0},
    }
    best = min(relative_cost(speeds, name) for name in speeds)
    for seed in range(40):
        chosen, choice, backends = run_choice(speeds, seed)
        assert relative_cost(speeds, choice.variant) <= 1.05 * best, (seed, choice)
        assert chosen is backends[choice.variant] and not chosen.closed
        assert all(b.closed for name, b in backends.items() if name != choice.variant)  # the others released
        assert MIN_ROUNDS <= choice.rounds <= MAX_ROUNDS and choice.auto
        assert set(choice.timings_ms) == set(speeds) and all(set(t) == set(SHAPES) for t in choice.timings_ms.values())


def test_the_budget_bounds_the_rounds_but_never_below_the_minimum() -> None:
    speeds = {"a": {"b1x128": 100.0, "b8x128": 900.0}, "b": {"b1x128": 120.0, "b8x128": 800.0}}
    _, choice, _ = run_choice(speeds, seed=0, budget_s=0.01)
    assert choice.rounds == MIN_ROUNDS
    _, generous, _ = run_choice(speeds, seed=0, budget_s=1e6)
    assert generous.rounds == MAX_ROUNDS


def test_clearly_slower_variants_stop_racing_but_stay_in_the_report() -> None:
    speeds = {"fast": {"b1x128": 5.0, "b8x128": 30.0}, "slow": {"b1x128": 20.0, "b8x128": 150.0}}
    chosen, choice, backends = run_choice({**speeds, "close": {"b1x128": 5.1, "b8x128": 31.0}}, seed=2, budget_s=1e6)
    assert backends["slow"].closed and set(choice.timings_ms) == {"fast", "slow", "close"}
    assert choice.variant in ("fast", "close") and chosen is backends[choice.variant]


def test_a_variant_that_fails_to_load_is_skipped_with_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    speeds = {"fast-but-broken": {"b1x128": 1.0, "b8x128": 5.0}, "cpu-fp32": {"b1x128": 10.0, "b8x128": 70.0}}
    with caplog.at_level(logging.WARNING, logger="service.backends.variant_timing"):
        chosen, choice, backends = run_choice(speeds, seed=1, fail=("fast-but-broken",))
    assert choice.variant == "cpu-fp32" and chosen is backends["cpu-fp32"]
    assert choice.skipped["fast-but-broken"].startswith("failed to load: RuntimeError: graph needs an operator")
    assert backends["fast-but-broken"].closed
    assert any(getattr(r, "variant", None) == "fast-but-broken" for r in caplog.records), caplog.records
    assert choice.timings_ms == {}  # one candidate left: nothing to time


def test_no_loadable_candidate_raises_naming_the_failures() -> None:
    with pytest.raises(ValueError, match="failed to load"):
        run_choice({"a": {"b1x128": 1.0, "b8x128": 2.0}}, seed=0, fail=("a",))


def test_ties_go_to_the_static_order_and_every_shape_weighs_the_same() -> None:
    even = {"a": {"b1x128": 5.0, "b8x128": 30.0}, "b": {"b1x128": 5.0, "b8x128": 30.0}}
    assert pick_fastest(even, ["b", "a"]) == "b"
    # a: 10% slower at batch 1, 40% faster at batch 8 -> a wins on the mean relative time
    mixed = {"a": {"b1x128": 5.5, "b8x128": 30.0}, "b": {"b1x128": 5.0, "b8x128": 50.0}}
    assert pick_fastest(mixed, ["b", "a"]) == "a"


def test_timing_shapes_follow_the_models_serving_length_and_the_batcher() -> None:
    assert timing_shapes("qa", 256, 8, 16384) == [Shape(1, 256), Shape(8, 256)]
    assert timing_shapes("classify", 512, 8, 16384) == [Shape(1, 128), Shape(8, 128)]
    assert timing_shapes("ner", 128, 32, 1024) == [Shape(1, 128), Shape(8, 128)]  # the token budget caps the batch
    assert timing_shapes("embed", 64, 1, 16384) == [Shape(1, 64)]  # batching off: one shape
    feed = timing_feed(Shape(2, 6), 101, 102, [7, 8, 9])
    assert feed["input_ids"].tolist() == [[101, 7, 8, 9, 7, 102]] * 2 and feed["attention_mask"].all()


# ---- the service choosing on a tiny bundle (real ONNX Runtime sessions; only the choice's shape is checked) ----
INVARIANT = {"batch_invariant": True}
"""Judged batch invariant at export."""


@pytest.fixture()
def multi_variant_bundle(tiny_bundles: dict[str, Path], tmp_path: Path) -> Path:
    """The tiny classify bundle with two guarded copies of its graph, an unguarded one, a broken guarded one and a
    guarded one judged batch dependent at export."""
    bundle = shutil.copytree(tiny_bundles["classify"], tmp_path / "tiny-auto")
    manifest = json.loads((bundle / MANIFEST_FILE).read_text())
    (graph,) = [spec["file"] for spec in manifest["variants"].values()]
    shutil.copy(bundle / graph, bundle / "copy.onnx")
    shutil.copy(bundle / graph, bundle / "raw.onnx")
    (bundle / "broken.onnx").write_bytes(b"not an onnx graph")
    manifest["variants"] = {
        "cpu-fp32": {"file": graph, "provider": CPU, "precision": "fp32", "parity": {"judgment": "max-abs-diff"}},
        "cpu-int8": {"file": "copy.onnx", "provider": CPU, "precision": "int8", "parity": GUARDED, **INVARIANT},
        "cpu-raw": {"file": "raw.onnx", "provider": CPU, "precision": "int8", "parity": {}, **INVARIANT},
        "cpu-broken": {"file": "broken.onnx", "provider": CPU, "precision": "int8", "parity": GUARDED, **INVARIANT},
        "cpu-dependent": {
            "file": "copy.onnx",
            "provider": CPU,
            "precision": "int8",
            "parity": GUARDED,
            "batch_invariant": False,
            "batch_invariance": {"max_abs_diff": 0.61, "tolerance": 0.01, "worst_shape": "8 x 64"},
        },
    }
    (bundle / MANIFEST_FILE).write_text(json.dumps(manifest))
    return bundle


def listed_model(bundle: Path, **settings: object) -> dict:
    """Load `bundle` with `settings` on the CPU, return its /models entry, close."""

    async def run() -> dict:
        service = Engine(ServiceSettings(models=[str(bundle)], warmup_rounds=0, grpc_port=-1, device="cpu", **settings))
        assert not service.state.ready
        try:
            await service.load()
            service.set_ready()
            assert service.state.ready  # ready only once the choice is made (it is part of loading)
            (info,) = service.list_models()
            return info
        finally:
            await service.close()

    return asyncio.run(run())


def test_the_service_times_the_guarded_variants_and_reports_the_choice(multi_variant_bundle: Path) -> None:
    info = listed_model(multi_variant_bundle, variant="auto", variant_budget_s=0.2)
    choice = info["variant_choice"]
    assert choice["auto"] and info["variant"] in ("cpu-fp32", "cpu-int8")
    assert set(choice["timings_ms"]) == {"cpu-fp32", "cpu-int8"}
    assert set(choice["timings_ms"]["cpu-int8"]) == {"b1x64", "b8x64"}  # the graph's 64 tokens, batch 8
    assert choice["skipped"]["cpu-raw"].startswith("no accuracy-guard judgment")
    assert choice["skipped"]["cpu-broken"].startswith("failed to load")
    assert choice["skipped"]["cpu-dependent"].startswith("not batch invariant at export: max |diff| 0.61")
    assert choice["rounds"] >= MIN_ROUNDS


def test_a_forced_variant_wins_over_auto(multi_variant_bundle: Path) -> None:
    info = listed_model(multi_variant_bundle, variant="cpu-raw")
    assert info["variant"] == "cpu-raw" and info["variant_choice"]["auto"] is False
    assert info["variant_choice"]["timings_ms"] == {}
