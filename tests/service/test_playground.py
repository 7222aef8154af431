"""The playground page: its routes (on by default, off with `playground=False`, outside OpenAPI, a strict
Content-Security-Policy), and a real browser using it: Debian's chromium + chromedriver driven by selenium,
against a real server over the tiny bundles (classify, qa, ner, embed, fill-mask). Each tab is typed into and
submitted, and the rendered DOM is checked against the API's own answer to the same request: the highlighted
QA span is the answer, every NER mark is its entity's text, the label shown is the API's best label, the
heatmap holds the cosine similarities, each [MASK]'s first token is the API's. Errors (empty input, a wrong
API key against a second server that requires one) show the server's message.

With `PLAYGROUND_SCREENSHOTS=<folder>` (`make playground-screenshots`) the server serves the default models
(artifacts/bundles) when they are built, plus the tiny fill-mask bundle (no default model fills masks), and
each tab's result is saved as `<folder>/<task>.png`.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.http_api.app import create_app
from service.settings import DEFAULT_BUNDLES_DIR, ServiceSettings
from tests.service.server import REPO, ServerProcess, serving

SCREENSHOTS = os.environ.get("PLAYGROUND_SCREENSHOTS")
DEFAULT_MODELS = ("minilm-sst2", "minilm-squad", "minilm-conll03", "minilm")
API_KEY = "playground-secret"
WAIT_S = 30.0


# ---- the routes (no browser) ------------------------------------------------------------------------------
def _client(**settings: Any) -> TestClient:
    # no lifespan: the page and its assets need no model
    return TestClient(create_app(ServiceSettings(models=["unused"], grpc_port=-1, **settings)))


@pytest.mark.parametrize("path", ["/", "/playground"])
def test_page_is_served_with_a_strict_policy(path: str) -> None:
    response = _client().get(path)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "connect-src 'self'" in policy and "unsafe-inline" not in policy
    assert response.headers["x-content-type-options"] == "nosniff"
    assert 'src="playground/playground.js"' in response.text and "http" not in response.text.split("<body>")[0]


def test_assets_are_served_and_fetch_nothing_from_outside() -> None:
    client = _client()
    for name, media in (("playground.js", "text/javascript"), ("playground.css", "text/css")):
        response = client.get(f"/playground/{name}")
        assert response.status_code == 200 and response.headers["content-type"].startswith(media)
        assert "http://" not in response.text and "https://" not in response.text
    # the DOM is built from nodes and textContent only: no string is ever parsed as markup
    script = client.get("/playground/playground.js").text
    assert not re.search(r"\.(inner|outer)HTML\s*=|insertAdjacentHTML|document\.write|\beval\(", script)


def test_page_is_off_when_disabled_and_only_get_root_is_in_openapi() -> None:
    client = _client(playground=False)
    # POST / is Hugging Face's Inference API shape, so a GET there is the wrong method, not a missing page.
    assert client.get("/").status_code == 405
    assert client.get("/playground").status_code == 404
    assert "get" not in client.get("/openapi.json").json()["paths"]["/"]
    paths = _client().get("/openapi.json").json()["paths"]
    assert "/playground" not in paths and "text/html" in paths["/"]["get"]["responses"]["200"]["content"]


def test_with_a_key_the_page_needs_it_unless_the_docs_are_public() -> None:
    closed = _client(api_key=API_KEY)
    assert closed.get("/").status_code == 401 and closed.get("/playground/playground.js").status_code == 401
    assert closed.get("/", headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200
    public = _client(api_key=API_KEY, public_docs=True)
    assert public.get("/").status_code == 200 and public.get("/playground/playground.js").status_code == 200
    assert public.get("/models").status_code == 401


def test_serve_has_the_switch() -> None:
    import typer
    from typer.testing import CliRunner

    from bertserve.commands.serve import register

    app = typer.Typer()

    @app.callback()
    def root() -> None:
        """Test app."""

    register(app)
    result = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert "--no-playground" in result.output and "BERTSERVE_PLAYGROUND" in result.output


# ---- a real browser ---------------------------------------------------------------------------------------
def _chromium() -> tuple[str, str] | None:
    """(browser, driver) paths of Debian's chromium and chromedriver, if installed."""
    browser = next(
        (
            path
            for path in ("/usr/lib/chromium/chromium", shutil.which("chromium"), shutil.which("chromium-browser"))
            if path and os.access(path, os.X_OK)
        ),
        None,
    )
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    pytest.importorskip("selenium", reason="selenium is not installed (the dev extra)")
    paths = _chromium()
    if paths is None:
        pytest.skip("no chromium + chromedriver: `make browser-deps` installs them (apt)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = paths[0]
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1100,1000"):
        options.add_argument(argument)
    options.add_argument("--force-device-scale-factor=1")
    driver = webdriver.Chrome(options=options, service=Service(paths[1]))
    try:
        yield driver
    finally:
        driver.quit()


def _models(tiny_bundles: dict[str, Path], encoder_bundles: dict[str, Path], rerank_bundle: Path) -> list[Path]:
    models = [tiny_bundles["classify"], tiny_bundles["qa"], tiny_bundles["ner"], encoder_bundles["embed"]]
    default = [REPO / DEFAULT_BUNDLES_DIR / name for name in DEFAULT_MODELS]
    if SCREENSHOTS and all((path / "manifest.json").exists() for path in default):
        models = default
    return [*models, encoder_bundles["fill-mask"], rerank_bundle]


@pytest.fixture(scope="module")
def server(
    tiny_bundles: dict[str, Path],
    encoder_bundles: dict[str, Path],
    rerank_bundle: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("playground-server") / "server.log"
    with serving(_models(tiny_bundles, encoder_bundles, rerank_bundle), log, ready_timeout=180) as process:
        yield process


@pytest.fixture(scope="module")
def api(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30.0) as client:
        yield client


@pytest.fixture(scope="module")
def page(browser: Any, server: ServerProcess) -> Any:
    browser.get(server.url + "/")
    _wait_for(browser, "#tabs button")
    return browser


def _wait_for(driver: Any, css: str) -> Any:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    visible = expected_conditions.visibility_of_element_located((By.CSS_SELECTOR, css))
    return WebDriverWait(driver, WAIT_S).until(visible)


def _all(driver: Any, css: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, css))


def _text(element: Any) -> str:
    """The node's exact text (selenium's `.text` is the rendered text, with whitespace folded)."""
    return str(element.get_attribute("textContent"))


def _type(driver: Any, task: str, field: str, text: str) -> None:
    """Type into a field of a tab; set the value directly where chromedriver cannot type (outside the BMP)."""
    _all(driver, f"#tab-{task}")[0].click()
    element = _all(driver, f"#panel-{task} [name={field}]")[0]
    if len(text) > 400 or any(ord(char) > 0xFFFF for char in text):
        driver.execute_script("arguments[0].value = arguments[1]", element, text)
    else:
        element.clear()
        element.send_keys(text)


def _submit(driver: Any, task: str) -> Any:
    """Open the tab, submit its form, and wait for a result or an error; returns the result element."""
    _all(driver, f"#tab-{task}")[0].click()
    result = _all(driver, f"#panel-{task} .result")[0]
    driver.execute_script("arguments[0].replaceChildren()", result)
    _all(driver, f"#panel-{task} button[type=submit]")[0].click()
    _wait_for(driver, f"#panel-{task} .result .meta, #panel-{task} .result .error")
    return result


def _screenshot(driver: Any, task: str) -> None:
    """The whole page (beyond the window), as a palette PNG: a page of flat colours, a fraction of the size."""
    if not SCREENSHOTS:
        return
    import base64

    folder = Path(SCREENSHOTS)
    folder.mkdir(parents=True, exist_ok=True)
    width, height = driver.execute_script(
        "return [document.documentElement.clientWidth, document.querySelector('main').getBoundingClientRect().bottom"
        " + window.scrollY + 20]"
    )
    clip = {"x": 0, "y": 0, "width": width, "height": min(int(height), 3000), "scale": 1}
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"captureBeyondViewport": True, "clip": clip})
    path = folder / f"{task}.png"
    path.write_bytes(base64.b64decode(shot["data"]))
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(path) as image:
        image.convert("RGB").quantize(colors=128).save(path, optimize=True)


def _no_horizontal_overflow(driver: Any) -> None:
    width = driver.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], f"the page is wider than the window: {width}"


@pytest.mark.integration
def test_tabs_are_the_served_tasks(page: Any, api: httpx.Client) -> None:
    tasks = {model["task"] for model in api.get("/models").json()["models"]}
    assert {button.get_attribute("data-task") for button in _all(page, "#tabs button")} == tasks
    assert tasks == {"classify", "qa", "ner", "embed", "fill-mask", "rerank"}


@pytest.mark.integration
def test_classify_shows_the_apis_labels(page: Any, api: httpx.Client) -> None:
    text = "A gripping, beautifully acted film with a story that stays with you."
    _type(page, "classify", "text", text)
    _type(page, "classify", "text_pair", "")
    result = _submit(page, "classify")
    expected = api.post("/classify", json={"inputs": text, "top_k": None})
    names = [_text(name) for name in result.find_elements("css selector", ".bar-name")]
    assert names == [label["label"] for label in expected.json()]
    assert _text(result.find_element("css selector", ".meta-model")) == expected.headers["x-model"]
    legend = _text(result.find_element("css selector", ".timing-legend"))
    assert "inference" in legend and "queue" in legend and "tokenize" in legend
    _screenshot(page, "classify")


@pytest.mark.integration
def test_qa_highlights_the_answer(page: Any, api: httpx.Client) -> None:
    question = "Where did Ada Lovelace work?"
    # an emoji before the answer: offsets are code points, one emoji is two UTF-16 units in the browser
    context = (
        "Ada Lovelace was an English mathematician. 😀 She worked in London with Charles Babbage on the "
        "Analytical Engine, and she published the first algorithm meant for a machine in 1843."
    )
    _type(page, "qa", "question", question)
    _type(page, "qa", "context", context)
    _type(page, "qa", "top_k", "3")
    result = _submit(page, "qa")
    answers = api.post("/qa", json={"question": question, "context": context, "top_k": 3}).json()
    answers = [answer for answer in answers if answer["answer"]]
    assert answers, "the API found no answer to draw"
    assert _text(result.find_element("css selector", "mark.answer")) == answers[0]["answer"]
    assert _text(result.find_element("css selector", ".context")) == context
    listed = [_text(item) for item in result.find_elements("css selector", ".answers .answer-text")]
    assert listed == [answer["answer"] for answer in answers]
    if len(answers) > 1:  # choosing another answer moves the highlight
        result.find_elements("css selector", ".answers button")[1].click()
        assert _text(result.find_element("css selector", "mark.answer")) == answers[1]["answer"]
        result.find_elements("css selector", ".answers button")[0].click()
    _screenshot(page, "qa")


@pytest.mark.integration
def test_ner_marks_every_entity(page: Any, api: httpx.Client) -> None:
    text = (
        "Ada Lovelace worked with Charles Babbage in London. 😀 The Royal Society in England later honoured "
        "her, and Microsoft named a programming language after her."
    )
    _type(page, "ner", "text", text)
    result = _submit(page, "ner")
    entities = api.post("/ner", json={"inputs": text, "aggregation_strategy": "simple"}).json()
    entities.sort(key=lambda entity: entity["start"])
    assert entities, "the API found no entity to draw"
    marks = result.find_elements("css selector", "mark.entity")
    assert [_text(mark) for mark in marks] == [entity["word"] for entity in entities]
    assert [mark.get_attribute("data-type") for mark in marks] == [entity["entity_group"] for entity in entities]
    legend = {item.get_attribute("data-type") for item in result.find_elements("css selector", ".legend li")}
    assert legend == {entity["entity_group"] for entity in entities}
    assert _text(result.find_element("css selector", ".marked-text")) == text
    _screenshot(page, "ner")


@pytest.mark.integration
def test_embeddings_heatmap_holds_the_similarities(page: Any, api: httpx.Client) -> None:
    sentences = [
        "A man is playing a guitar.",
        "Someone plays an instrument.",
        "The new movie is awesome.",
        "The film was great fun to watch.",
        "It will rain in Berlin tomorrow.",
    ]
    _type(page, "embed", "sentences", "\n".join(sentences))
    result = _submit(page, "embed")
    vectors = np.asarray(api.post("/embed", json={"inputs": sentences, "normalize": True}).json())
    similarity = vectors @ vectors.T / np.outer(np.linalg.norm(vectors, axis=1), np.linalg.norm(vectors, axis=1))
    rows = result.find_elements("css selector", "table.heatmap tbody tr")
    assert len(rows) == len(sentences)
    for i, row in enumerate(rows):
        cells = [float(_text(cell)) for cell in row.find_elements("css selector", "td")]
        assert cells == pytest.approx(similarity[i], abs=0.006)
    _screenshot(page, "embed")


@pytest.mark.integration
def test_fill_mask_shows_the_top_tokens_per_mask(page: Any, api: httpx.Client) -> None:
    text = "Paris is the [MASK] of France, and Berlin is the [MASK] of Germany."
    _type(page, "fill-mask", "text", text)
    _type(page, "fill-mask", "top_k", "4")
    result = _submit(page, "fill-mask")
    masks = api.post("/fill-mask", json={"inputs": text, "top_k": 4}).json()
    cards = result.find_elements("css selector", ".mask-card")
    assert len(cards) == len(masks) == 2
    for card, fills in zip(cards, masks, strict=True):
        assert [_text(name) for name in card.find_elements("css selector", ".bar-name")] == [
            fill["token_str"] for fill in fills
        ]
    _screenshot(page, "fill-mask")


@pytest.mark.integration
def test_rerank_lists_the_passages_in_the_apis_order(page: Any, api: httpx.Client) -> None:
    query = "Where did the committee meet?"
    passages = ["The committee met in the town hall.", "Paris is the capital of France.", "Prices fell on Monday."]
    _type(page, "rerank", "query", query)
    _type(page, "rerank", "passages", "\n".join(passages))
    result = _submit(page, "rerank")
    ranks = api.post("/rerank", json={"query": query, "texts": passages}).json()
    shown = [_text(item) for item in result.find_elements("css selector", ".ranking .passage")]
    assert shown == [passages[rank["index"]] for rank in ranks]
    _screenshot(page, "rerank")


@pytest.mark.integration
def test_empty_input_shows_the_servers_message(page: Any, api: httpx.Client) -> None:
    _type(page, "classify", "text", "")
    result = _submit(page, "classify")
    expected = api.post("/classify", json={"inputs": "", "top_k": None})
    assert expected.status_code == 422
    assert _text(result.find_element("css selector", ".error-message")) == expected.json()["error"]["message"]
    assert "422" in _text(result.find_element("css selector", ".error-status"))
    _screenshot(page, "error")


@pytest.mark.integration
def test_long_and_many_inputs_scroll_inside_their_boxes(page: Any) -> None:
    text = " ".join(["Ada Lovelace worked with Charles Babbage in London."] * 80)
    _type(page, "ner", "text", text)
    result = _submit(page, "ner")
    box = result.find_element("css selector", ".marked-text")
    assert page.execute_script("return arguments[0].scrollHeight > arguments[0].clientHeight", box)
    _no_horizontal_overflow(page)
    sentences = [f"Sentence number {i} is a rather long line, about nothing in particular." for i in range(40)]
    _type(page, "embed", "sentences", "\n".join(sentences))
    result = _submit(page, "embed")
    assert len(result.find_elements("css selector", "table.heatmap tbody td")) == 40 * 40
    _no_horizontal_overflow(page)
    _screenshot(page, "many-inputs")


# ---- a server that requires an API key ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def keyed_server(tiny_bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("playground-keyed") / "server.log"
    with serving(
        [tiny_bundles["classify"]], log, {"BERTSERVE_API_KEY": API_KEY, "BERTSERVE_PUBLIC_DOCS": "true"}
    ) as process:
        yield process


@pytest.mark.integration
def test_api_key_is_asked_for_and_a_wrong_one_is_refused(browser: Any, keyed_server: ServerProcess) -> None:
    browser.get(keyed_server.url + "/playground")
    browser.execute_script("sessionStorage.clear()")
    browser.get(keyed_server.url + "/playground")
    message = _wait_for(browser, "#status .error-message")
    assert "API key" in _text(message)
    key = _wait_for(browser, "#key-form input[name=key]")
    key.send_keys("not-the-key")
    browser.execute_script("document.getElementById('status').replaceChildren()")
    _all(browser, "#key-form button")[0].click()
    _wait_for(browser, "#status .error-message")
    assert "401" in _text(_all(browser, "#status .error-status")[0])
    assert not _all(browser, "#tabs button")
    _screenshot(browser, "api-key")
    key.clear()
    key.send_keys(API_KEY)
    _all(browser, "#key-form button")[0].click()
    _wait_for(browser, "#tab-classify")
    assert not _all(browser, "#status .error")
    _type(browser, "classify", "text", "a gentle, funny film")
    result = _submit(browser, "classify")
    assert result.find_elements("css selector", ".bar-name")
    browser.execute_script("sessionStorage.clear()")
