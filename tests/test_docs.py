"""The docs: generated pages match the code, every page is in the site's nav, the README stays a front door, and
the measurement blocks are refilled from artifacts only where those exist (docgen/pages.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from docgen import pages as docs_pages

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return docs_pages.code_pages()


def test_generated_reference_pages_match_the_code(generated: dict[str, str]) -> None:
    stale = docs_pages.stale_pages(DOCS)
    assert not stale, (
        f"out of date with the code: {', '.join('docs/' + name for name in stale)}; "
        f"run `{docs_pages.REGENERATE}` and commit the result"
    )


def test_the_check_names_a_page_that_differs(tmp_path: Path, generated: dict[str, str]) -> None:
    for name, text in generated.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert docs_pages.stale_pages(tmp_path) == []
    settings = tmp_path / "reference/settings.md"
    settings.write_text(settings.read_text().replace("`max_batch_size`", "`max_batch_size_old`"))
    (tmp_path / "reference/errors.md").unlink()
    assert docs_pages.stale_pages(tmp_path) == ["reference/settings.md", "reference/errors.md"]


def test_the_reference_pages_cover_every_setting_error_and_command(generated: dict[str, str]) -> None:
    from service.errors import ServiceError
    from service.settings import ServiceSettings

    for name in ServiceSettings.model_fields:
        assert f"| `{name}` | `BERTSERVE_{name.upper()}` |" in generated["reference/settings.md"]
    for klass in docs_pages.error_classes():
        assert issubclass(klass, ServiceError)
        assert f"| `{klass.__name__}` | `{klass.code}` |" in generated["reference/errors.md"]
    overloaded = "| `Overloaded` | `overloaded` | `ServiceError` | 429 | RESOURCE_EXHAUSTED |"
    assert overloaded in generated["reference/errors.md"]
    for command in ("serve", "export", "loadtest", "finetune qa", "pretrain"):
        assert f"## `bertserve {command}`" in generated["reference/cli.md"]


def test_table_cells_escape_markup_outside_code() -> None:
    assert docs_pages.cell("a | b <key> `<key> x*y` *z*") == "a \\| b &lt;key&gt; `<key> x*y` \\*z\\*"


def _nav_files(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [name for item in nav for name in _nav_files(item)]
    if isinstance(nav, dict):
        return [name for value in nav.values() for name in _nav_files(value)]
    return []


def test_every_page_is_in_the_nav_and_every_nav_entry_exists() -> None:
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    excluded = set(config.get("exclude_docs", "").split())
    pages = {str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md")} - excluded
    in_nav = _nav_files(config["nav"])
    assert len(in_nav) == len(set(in_nav)), "a page is twice in the nav"
    assert pages == set(in_nav)
    assert set(docs_pages.CODE_PAGES) <= set(in_nav)


def test_readme_is_a_front_door() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; reference and figures belong in docs/"
    shared = [line for line in lines if "../shared" in line]
    assert all("reproduce" in line.lower() for line in shared), shared
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", "\n".join(lines)):
        if "://" not in target:
            assert (REPO / target).exists(), f"README.md links to {target}, which does not exist"


def test_blocks_are_refilled_only_from_artifacts_that_exist(tmp_path: Path) -> None:
    page = "intro\n<!-- generated:bench-model -->\ncommitted table\n<!-- /generated:bench-model -->\nafter\n"
    assert docs_pages.fill_blocks(page, tmp_path) == page  # no artifacts here: the committed block stays
    (tmp_path / "artifacts/bench").mkdir(parents=True)
    (tmp_path / "artifacts/bench/bench-model.md").write_text("| runner | ms |\n|---|---|\n| cpu-fp32 | 9.9 |\n")
    filled = docs_pages.fill_blocks(page, tmp_path)
    assert filled.startswith("intro\n<!-- generated:bench-model -->\nFrom `artifacts/bench/bench-model.md`")
    assert "| cpu-fp32 | 9.9 |\n<!-- /generated:bench-model -->\nafter\n" in filled
    assert "committed table" not in filled
    assert docs_pages.fill_blocks(filled, tmp_path) == filled  # refilling is stable


def _record(run_id: str, target: str, mix: str, ok_rps: float, tag: str) -> dict[str, object]:
    figures = {"error_rate": 0.0, "ok": 100, "ok_rps": ok_rps, "p50": 10.0, "p95": 20.0, "p99": 30.0, "requests": 100}
    return {
        "created": "2026-12-02T10:00:00+00:00",
        "figures": {mix.split("=")[0]: figures, "all": figures},
        "git": "abc1234",
        "machine": {"cpus": 2, "platform": "Linux"},
        "mix": mix,
        "profile": "steady",
        "run_id": run_id,
        "shape": "32@65",
        "tag": tag,
        "target": target,
    }


def test_the_load_test_block_shows_the_latest_acceptance_run_of_each_mix(tmp_path: Path) -> None:
    records = [
        _record("old", "naive", "/classify=1", 50.0, "acceptance-classify"),
        _record("old", "ours-batching", "/classify=1", 300.0, "acceptance-classify"),
        _record("new", "naive", "/classify=1", 40.0, "acceptance-classify"),
        _record("new", "ours-batching", "/classify=1", 320.0, "acceptance-classify"),
        _record("probe", "ours-batching", "/classify=1", 999.0, "ab-test"),  # not an acceptance run
    ]
    history = tmp_path / "loadtests/results/history.jsonl"
    history.parent.mkdir(parents=True)
    history.write_text("".join(json.dumps(record) + "\n" for record in records))
    page = "<!-- generated:loadtest-acceptance -->\nold\n<!-- /generated:loadtest-acceptance -->\n"
    filled = docs_pages.fill_blocks(page, tmp_path)
    assert "Run `new`" in filled and "Run `old`" not in filled and "999.0" not in filled
    assert "| ours-batching | /classify | 320.0 | 10.0 | 30.0 | 0.00% | 8.00× | — |" in filled


def test_the_hostile_block_lists_every_bound_of_the_latest_hostile_run(tmp_path: Path) -> None:
    older = _record("old", "ours-batching", "/classify=1", 20.0, "hostile-default")
    newer = _record("new", "ours-batching", "/classify=1", 19.0, "hostile-default")
    for record in (older, newer):
        record["profile"] = "hostile"
        record["figures"] = {"max-size: small /classify": record["figures"]["all"], "all": record["figures"]["all"]}
    older["checks"] = [{"description": "old bound", "passed": True}]
    newer["checks"] = [
        {"description": "distinct: RSS growth +1.0 MB <= 50 MB", "passed": True},
        {"description": "max-size: small /classify p99 300 ms <= 250 ms", "passed": False},
    ]
    newer["machine"] = {"cpu": "AMD EPYC (Zen 3), 2 cores", "cpus": 2}
    history = tmp_path / "loadtests/results/history.jsonl"
    history.parent.mkdir(parents=True)
    history.write_text("".join(json.dumps(record) + "\n" for record in (older, newer)))
    page = "<!-- generated:loadtest-hostile -->\n<!-- /generated:loadtest-hostile -->\n"
    filled = docs_pages.fill_blocks(page, tmp_path)
    assert "Run `new`" in filled and "AMD EPYC (Zen 3)" in filled and "old bound" not in filled
    assert "| distinct: RSS growth +1.0 MB ≤ 50 MB | yes |" in filled
    assert "| max-size: small /classify p99 300 ms ≤ 250 ms | NO |" in filled
    assert "| max-size | 100 | 10.0 | 30.0 | 0.00% |" in filled
