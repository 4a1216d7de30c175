"""The generated tables and numbers of docs/*.md still match the raw files they come from (CPU only, fast)."""

import importlib
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tables():
    sys.path.insert(0, str(ROOT))
    try:
        yield importlib.import_module("docs.tables")
    finally:
        sys.path.remove(str(ROOT))


def test_every_generated_block_matches_its_raw_files(tables):
    assert tables.stale_blocks() == [], "run `uv run python -m docs.tables` and commit the result"


def test_every_registered_generator_is_used(tables):
    used = {m["name"] for path in tables.markdown_files() for m in tables.MARKER.finditer(path.read_text())}
    tables._load_generators()
    assert set(tables.REGISTRY) - used == set()


def test_a_changed_number_is_reported(tables, tmp_path, monkeypatch):
    doc = tmp_path / "x.md"
    fresh = tables.render("a <!-- gen:matmul-rate -->0 TFLOP/s<!-- /gen --> b\n")
    doc.write_text(fresh.replace("TFLOP/s", "TFLOP/s!", 1))
    monkeypatch.setattr(tables, "markdown_files", lambda: [doc])
    monkeypatch.setattr(tables, "ROOT", tmp_path)
    assert tables.stale_blocks() == ["x.md: matmul-rate"]
    doc.write_text(fresh)
    assert tables.stale_blocks() == []


def test_unknown_block_names_fail_loudly(tables):
    with pytest.raises(KeyError, match="no-such-block"):
        tables.render("<!-- gen:no-such-block --><!-- /gen -->")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_the_index_links_to_existing_sections():
    index = (ROOT / "docs/README.md").read_text()
    links = re.findall(r"\]\(([\w.-]+\.md)(?:#([\w-]+))?\)", index)
    assert len(links) > 30
    for name, anchor in links:
        doc = ROOT / "docs" / name
        assert doc.exists(), name
        if anchor:
            headings = {_anchor(h) for h in re.findall(r"^#+ (.+)$", doc.read_text(), re.MULTILINE)}
            assert anchor in headings, f"{name}#{anchor}"
