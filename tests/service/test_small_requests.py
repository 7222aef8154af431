"""Small requests built and post-processed together on one thread (service/engine/small_requests.py): the same features
as one request at a time (`Pipeline.build_many`), the same answers as post-processing on the caller's thread, errors
kept to their own request, and rounds that grow with the load."""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from bundles.serving import open_bundle
from service.engine.inputs import ClassifyInput, NERInput
from service.engine.pipelines import Pipeline, Plan, make_pipeline
from service.engine.small_requests import THREAD_NAME, SmallRequests
from service.errors import BackendError, InputTooLong, InvalidInput
from tests.service.server import serving

TEXTS = ["a gripping, beautifully acted film", "dull", "an overlong mess that never finds its footing", "fine"]
LONG = "word " * 2000


@pytest.fixture(scope="module")
def classify(tiny_bundles: dict[str, Path]) -> Pipeline:
    return make_pipeline(open_bundle(tiny_bundles["classify"]))


def _plan(pipeline: Pipeline, request: Any) -> Plan:
    return pipeline.plan(request)


def _rows(features: Any) -> list[tuple[int, list[int], list[int]]]:
    return [(f.request_index, list(f.input_ids), list(f.token_type_ids)) for f in features]


def test_classify_build_many_equals_one_request_at_a_time(classify: Pipeline) -> None:
    requests = [
        ClassifyInput(texts=TEXTS[:2], truncate=True),
        ClassifyInput(texts=[TEXTS[2]], pairs=["it is long"], truncate=True),
        ClassifyInput(texts=[TEXTS[3]], truncate=True),
        ClassifyInput(texts=[LONG], truncate=True),  # cut, as alone
        ClassifyInput(texts=TEXTS[1:3], pairs=["one", "two"], truncate=True),
        ClassifyInput(texts=[TEXTS[0]], truncate=False),
    ]
    plans = [_plan(classify, request) for request in requests]
    together = classify.build_many(plans)
    alone = [classify.build(plan) for plan in plans]
    assert [_rows(features) for features in together] == [_rows(features) for features in alone]  # type: ignore[arg-type]


def test_a_failing_input_fails_its_own_request_only(classify: Pipeline) -> None:
    requests = [
        ClassifyInput(texts=[TEXTS[0]], truncate=True),
        ClassifyInput(texts=[LONG], truncate=False),  # too long, not cut
        ClassifyInput(texts=[TEXTS[1]], truncate=True),
    ]
    built = classify.build_many([_plan(classify, request) for request in requests])
    assert isinstance(built[1], InputTooLong)
    assert _rows(built[0]) == _rows(classify.build(_plan(classify, requests[0])))  # type: ignore[arg-type]
    assert _rows(built[2]) == _rows(classify.build(_plan(classify, requests[2])))  # type: ignore[arg-type]


def test_concurrent_requests_share_rounds_and_get_their_own_features(
    classify: Pipeline, tiny_bundles: dict[str, Path]
) -> None:
    ner = make_pipeline(open_bundle(tiny_bundles["ner"]))
    requests: list[tuple[Pipeline, Any]] = [
        (classify, ClassifyInput(texts=[TEXTS[i % len(TEXTS)] + f" {i}"], truncate=True)) for i in range(40)
    ]
    requests += [(ner, NERInput(texts=[f"Angela Merkel visited Paris {i} times."], truncate=True)) for i in range(5)]
    groups = SmallRequests()

    async def main() -> list[Any]:
        return await asyncio.gather(
            *(groups.build(pipeline, _plan(pipeline, request)) for pipeline, request in requests)
        )

    try:
        built = asyncio.run(main())
    finally:
        groups.close()
    expected = [pipeline.build(_plan(pipeline, request)) for pipeline, request in requests]
    assert [_rows(features) for features in built] == [_rows(features) for features in expected]
    assert 1 <= groups.rounds < len(requests)


def test_errors_reach_their_caller_and_the_thread_goes_on(classify: Pipeline) -> None:
    groups = SmallRequests()

    async def main() -> tuple[BaseException | None, list[Any]]:
        failing = groups.build(classify, _plan(classify, ClassifyInput(texts=[LONG], truncate=False)))
        fine = groups.build(classify, _plan(classify, ClassifyInput(texts=[TEXTS[0]], truncate=True)))
        outcomes = await asyncio.gather(failing, fine, return_exceptions=True)
        after = await groups.build(classify, _plan(classify, ClassifyInput(texts=[TEXTS[1]], truncate=True)))
        first = outcomes[0] if isinstance(outcomes[0], BaseException) else None
        return first, [outcomes[1], after]

    try:
        error, answers = asyncio.run(main())
    finally:
        groups.close()
    assert isinstance(error, InvalidInput) and "tokens" in str(error)
    assert all(len(features) == 1 for features in answers)


def test_a_caller_that_goes_away_leaves_the_others_answered(classify: Pipeline) -> None:
    groups = SmallRequests()

    async def main() -> list[Any]:
        plans = [_plan(classify, ClassifyInput(texts=[text], truncate=True)) for text in TEXTS]
        tasks = [asyncio.create_task(groups.build(classify, plan)) for plan in plans]
        tasks[0].cancel()
        return await asyncio.gather(*tasks[1:])

    try:
        answers = asyncio.run(main())
    finally:
        groups.close()
    assert [len(features) for features in answers] == [1, 1, 1]


def test_the_thread_is_named_for_the_cpu_split_and_ends_on_close(classify: Pipeline) -> None:
    groups = SmallRequests()
    asyncio.run(groups.build(classify, _plan(classify, ClassifyInput(texts=[TEXTS[0]], truncate=True))))
    assert any(thread.name == THREAD_NAME for thread in threading.enumerate())
    groups.close()
    assert not any(thread.name == THREAD_NAME for thread in threading.enumerate())
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(groups.build(classify, _plan(classify, ClassifyInput(texts=[TEXTS[0]], truncate=True))))


def test_post_processing_runs_on_the_thread_and_answers_as_on_the_loop(classify: Pipeline) -> None:
    import numpy as np

    small = SmallRequests()
    request = ClassifyInput(texts=TEXTS[:2], truncate=True, top_k=None)
    features = classify.build(_plan(classify, request))
    outputs = [{"logits": np.array([0.25, -1.5], dtype=np.float32)}, {"logits": np.array([3.0, 2.0], np.float32)}]
    threads: list[str] = []
    postprocess_many = classify.postprocess_many

    def recorded(items: Any) -> Any:
        threads.append(threading.current_thread().name)
        return postprocess_many(items)

    async def main() -> tuple[Any, ...]:
        return tuple(
            await asyncio.gather(
                small.postprocess(classify, request, features, outputs),
                small.postprocess(classify, request, features, outputs[:1]),  # a row short: the backend's fault
                small.postprocess(classify, request, features, outputs),
                return_exceptions=True,
            )
        )

    classify.postprocess_many = recorded  # type: ignore[method-assign]
    try:
        answer, error, again = asyncio.run(main())
    finally:
        del classify.postprocess_many
        small.close()
    assert answer == again == classify.postprocess(request, features, outputs)
    assert threads and set(threads) == {THREAD_NAME}
    assert isinstance(error, BackendError) and "post-processing failed" in str(error)


def test_classify_postprocess_many_equals_one_request_at_a_time(classify: Pipeline) -> None:
    """Every request's answers, bit for bit, as `postprocess` gives them alone: requests of several score functions
    and top_k mixed, logits with ties, huge and tiny values, and requests whose outputs do not fit kept to their
    own error."""
    import numpy as np

    rng = np.random.default_rng(7)
    items: list[Any] = []
    for index in range(60):
        count = 1 + index % 3
        request = ClassifyInput(
            texts=TEXTS[:count],
            truncate=True,
            top_k=[1, None, 2][index % 3],
            function_to_apply=[None, "sigmoid", "none", "softmax"][index % 4],  # type: ignore[arg-type]
        )
        features = classify.build(_plan(classify, request))
        logits = (rng.standard_normal((count, 2)) * [1, 30, 0.001][index % 3]).astype(np.float32)
        if index % 7 == 0:
            logits[:, 1] = logits[:, 0]  # a tie: label order decides
        outputs = [{"logits": row} for row in logits]
        if index % 11 == 5:
            outputs = outputs + outputs  # more rows than features
        if index % 13 == 4:
            outputs = [{"logits": np.array([np.nan, 1.0], np.float32)}] * count
        items.append((request, features, outputs))

    def alone(item: Any) -> Any:
        try:
            return classify.postprocess(*item)
        except Exception as error:
            return (type(error), str(error))

    together = [
        (type(answer), str(answer)) if isinstance(answer, Exception) else answer
        for answer in classify.postprocess_many(items)
    ]
    assert repr(together) == repr([alone(item) for item in items])  # repr: NaN scores (sigmoid of NaN) compare equal
    assert any(isinstance(answer, tuple) for answer in together)


def _threads_named(pid: int, name: str) -> int:
    return sum((task / "comm").read_text().strip() == name for task in Path(f"/proc/{pid}/task").iterdir())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names are read from /proc")
@pytest.mark.parametrize("parallelism", [None, "true"])
def test_a_served_batch_is_tokenized_on_the_thread_that_asks_unless_told_otherwise(
    tiny_bundles: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parallelism: str | None
) -> None:
    """By default the server keeps the tokenizers library's own pool unstarted: its workers, started from the
    small-request thread, would carry that thread's name. `TOKENIZERS_PARALLELISM=true` brings the pool back."""
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    env = {} if parallelism is None else {"TOKENIZERS_PARALLELISM": parallelism}
    with serving([tiny_bundles["classify"]], tmp_path / "server.log", env) as server:
        for _ in range(3):
            response = httpx.post(server.url + "/classify", json={"inputs": TEXTS}, timeout=30)
            assert response.status_code == 200, response.text
        threads = _threads_named(server.process.pid, THREAD_NAME)
    assert threads == 1 if parallelism is None else threads > 1, threads
