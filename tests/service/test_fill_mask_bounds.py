"""Fill-mask requests cannot amplify: targets are bounded in count and length before anything is tokenized, the
fills a request asks for (masks x top_k) are bounded before the model runs, and what a request will put out
counts in its size (so a short text asking for many fills is post-processed off the event loop)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from bundles.serving import open_bundle
from service.engine.engine import INLINE_CHARACTERS, Engine
from service.engine.inputs import FILL_MASK_MAX_TARGET_CHARS, FILL_MASK_MAX_TARGETS, FillMaskInput
from service.engine.pipelines import FILL_MASK_MAX_FILLS, make_pipeline
from service.errors import InvalidInput
from service.settings import ServiceSettings


@pytest.fixture
def service(encoder_bundles: dict[str, Path]) -> Engine:
    settings = ServiceSettings(models=[str(encoder_bundles["fill-mask"])], warmup_rounds=0, grpc_port=-1)
    return Engine(settings)


def test_a_huge_target_and_too_many_targets_are_refused_before_any_tokenization(service: Engine) -> None:
    # validated before a model is looked up: the service need not even be loaded
    start = time.perf_counter()
    with pytest.raises(InvalidInput, match=f"1000000 characters, more than the limit of {FILL_MASK_MAX_TARGET_CHARS};"):
        asyncio.run(service.submit(FillMaskInput(texts=["a [MASK]"], targets=["a" * 1_000_000])))
    assert time.perf_counter() - start < 0.1  # main tokenized it on the event loop (1.5 s on the real model)
    too_many = FillMaskInput(texts=["a [MASK]"], targets=["a"] * (FILL_MASK_MAX_TARGETS + 1))
    expected = f"{FILL_MASK_MAX_TARGETS + 1} targets in one request, more than the limit of {FILL_MASK_MAX_TARGETS};"
    with pytest.raises(InvalidInput, match=expected):
        asyncio.run(service.submit(too_many))


def test_fills_beyond_the_bound_are_refused_before_the_model_runs(service: Engine) -> None:
    top_k = min(100, open_bundle(Path(service.settings.models[0])).tokenizer.vocab_size)
    masks = FILL_MASK_MAX_FILLS // top_k + 1
    text = " ".join(["[MASK] word"] * masks)
    calls: list[int] = []

    async def scenario() -> None:
        await service.load()
        service.set_ready()
        try:
            batcher = next(iter(service.models.values())).batcher
            with pytest.raises(InvalidInput, match=f"{masks * top_k} fills .* limit of {FILL_MASK_MAX_FILLS}"):
                await service.submit(FillMaskInput(texts=[text], top_k=top_k))
            with pytest.raises(InvalidInput, match="limit of"):  # the same masks spread over many texts
                await service.submit(FillMaskInput(texts=["[MASK] word"] * masks, top_k=top_k))
            calls.append(batcher.backend_calls)
            # at the bound: answered, every mask with its fills
            fitting = " ".join(["[MASK] word"] * (FILL_MASK_MAX_FILLS // top_k))
            results = (await service.submit(FillMaskInput(texts=[fitting], top_k=top_k))).results
            assert len(results[0]) == FILL_MASK_MAX_FILLS // top_k and all(len(f) == top_k for f in results[0])
            # targets count as the fills of a mask when fewer than top_k
            few = (await service.submit(FillMaskInput(texts=[text], top_k=top_k, targets=["word"]))).results
            assert len(few[0]) == masks
        finally:
            await service.close()

    asyncio.run(scenario())
    assert calls == [0]  # the refused requests never reached the model


def test_what_a_fill_mask_request_puts_out_counts_in_its_size(service: Engine) -> None:
    pipeline = make_pipeline(open_bundle(Path(service.settings.models[0])))
    short = "The [MASK] sat on the [MASK] by the [MASK]."
    assert pipeline.size(FillMaskInput(texts=[short], top_k=1)) < INLINE_CHARACTERS
    assert pipeline.size(FillMaskInput(texts=[short], top_k=100)) >= INLINE_CHARACTERS
    assert pipeline.size(FillMaskInput(texts=["a [MASK]"], targets=["x" * INLINE_CHARACTERS])) >= INLINE_CHARACTERS
