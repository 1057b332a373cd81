"""Retrieval infrastructure for the `search` tool: the local index over a corpus (index.py: BM25,
dense, hybrid; `arpo index build`) and the retrieval server that shares one index over HTTP
(server.py: `arpo serve retriever`). The tool that reads them is tools/search.py.

This module stays light (the index, with numpy, bm25s and transformers, is imported on use)."""

from __future__ import annotations

from arpo.errors import ArpoError


def default_index_dir():
    from arpo.retrieval.index import default_index_dir  # noqa: PLC0415 - loads numpy; kept out of this light module's import

    return default_index_dir()


def load_index(path: str | None = None):
    """The index at `path`, or the default one (built on first use from the built-in HotpotQA)."""
    from arpo.retrieval.index import Index, default_index  # noqa: PLC0415 - loads numpy; kept out of this light module's import

    if path is None:
        return default_index()
    try:
        return Index.load(path)
    except Exception as e:
        raise ArpoError(f"search index {path!r} cannot be loaded ({e}); build one with "
                        f"`arpo index build FILES --out {path}`, leave the index unset for the default "
                        "(built-in HotpotQA) or pass --search-url") from e
