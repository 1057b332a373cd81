"""What `arpo eval` says it uses: rows without a task and without --tools are searched in the built-in
HotpotQA index, and the line says so; with the web tools the line names the deep_search template and
the web tools (it said "prompt template default" and the task note "search tool, search prompt")."""

import json

import pytest

pytest.importorskip("httpx")
pytest.importorskip("trafilatura")
from web_servers import uvicorn_app

from arpo.cli import main


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    d = tmp_path_factory.mktemp("notes")
    f = d / "q.jsonl"
    f.write_text(json.dumps({"question": "Which star is the brightest?", "answer": "Sirius"}) + "\n")
    corpus = d / "pages.jsonl"
    corpus.write_text(json.dumps({"title": "Sirius", "text": "Sirius is the brightest star in the night sky."}) + "\n")
    return f, corpus, d


def _eval(f, *flags):
    return main(["eval", "--model", "tiny-random", "--data", str(f), "--max-response-tokens", "4", *flags])


def test_without_tools_the_builtin_index_is_named(rows, capsys):
    f, _, _ = rows
    assert _eval(f) == 0
    err = capsys.readouterr().err
    assert "tools search (the built-in HotpotQA index; --search-index DIR for yours)" in err, err
    assert "prompt template search (" in err and "search tool, search prompt" not in err, err


def test_with_the_web_tools_the_note_names_what_is_used(rows, capsys):
    from arpo.web.server import create_app
    from arpo.web.site import Site

    f, corpus, d = rows
    site = Site.from_corpus([str(corpus)], d / "index")
    with uvicorn_app(create_app(site)) as url:
        assert _eval(f, "--tools", "web_search,browse", "--web-url", url) == 0
    err = capsys.readouterr().err
    assert "prompt template deep_search (" in err and "tools web_search,browse" in err, err
    assert "template default" not in err and "search prompt" not in err, err
