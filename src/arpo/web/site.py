"""A corpus as a web site: every document a page at a path, pages rendered as real HTML (with the
navigation, related links and footer a reader's extractor has to see through), and search over the
corpus's BM25 index.

    site = Site.from_index(default_index())            # the built-in HotpotQA: /wiki/Ed_Wood_(film), ...
    site = Site.from_corpus(["my.jsonl"], index_dir)   # rows {title, text, url?}: url's path is the page's path
    site.page(path) -> index of the doc or None;  site.search(q, k) -> [(doc index, score)]
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote, urlsplit

from arpo.data.sources import iter_rows
from arpo.errors import ArpoError

if TYPE_CHECKING:
    from arpo.web.corpus import Merged


def slug(title: str) -> str:
    """Wikipedia's way: spaces to underscores, then percent-encoding of what a path cannot hold."""
    return quote(title.strip().replace(" ", "_"), safe="()_,'-.!:;~*$@&+=")


class Site:
    def __init__(self, index, urls: dict[str, str] | None = None, name: str = "corpus"):
        """`index`: an arpo.retrieval.index.Index; `urls`: doc id -> the URL (or path) it is served at."""
        self.index, self.name = index, name
        self.merged: Merged | None = None  # a user corpus: what web/corpus.py merged (paragraphs -> pages)
        self.paths: list[str] = []
        self.by_path: dict[str, int] = {}
        urls = urls or {}
        for i, d in enumerate(index.docs):
            given = urls.get(d.id)
            path = urlsplit(given).path if given else "/wiki/" + slug(d.title or d.id)
            if not path.startswith("/"):
                path = "/" + path
            base, n = path, 1
            while unquote(path) in self.by_path:  # two documents, one title: the later one gets a suffix
                n += 1
                path = f"{base}_({n})"
            self.paths.append(path)
            self.by_path[unquote(path)] = i

    def __len__(self) -> int:
        return len(self.paths)

    @classmethod
    def from_index(cls, index, name: str = "hotpotqa") -> Site:
        return cls(index, name=name)

    @classmethod
    def from_corpus(cls, specs: list[str], index_dir: str | Path) -> Site:
        """Index the documents of `specs` (JSONL rows {title, text, url?} or any layout arpo index
        reads) into `index_dir` and serve them; a row's `url` gives its page's path. Every paragraph is
        served: paragraphs that share a title are sections of that title's page (web/corpus.py), and
        `site.merged` says how many."""
        from arpo.retrieval.index import Index  # noqa: PLC0415 - loads numpy; kept out of this light module's import
        from arpo.web.corpus import load_pages  # noqa: PLC0415 - loads numpy; kept out of this light module's import

        docs, merged = load_pages([str(s) for s in specs])
        urls: dict[str, str] = {}
        for spec in specs:
            for where, row in iter_rows(spec):
                u = row.get("url")
                if u is None:
                    continue
                if not isinstance(u, str) or not u.strip():
                    raise ArpoError(f"{where}: field 'url' must be a non-empty string")
                urls.setdefault(str(row.get("id", row.get("title", ""))), u.strip())
        index = Index.build(docs, index_dir, progress=False, sources=[str(s) for s in specs])
        site = cls(index, urls, name=", ".join(Path(str(s)).name for s in specs))
        site.merged = merged
        return site

    def page(self, path: str) -> int | None:
        return self.by_path.get(unquote(path))

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        if not query.strip():
            return []
        hits = self.index.search([query], k=k)[0]
        ids = self._ids()
        return [(ids[h.id], h.score) for h in hits]

    def _ids(self) -> dict[str, int]:
        if not hasattr(self, "_id_map"):
            self._id_map = {d.id: i for i, d in enumerate(self.index.docs)}
        return self._id_map


# ---- HTML -------------------------------------------------------------------------------------------
_STYLE = ("body{font-family:sans-serif;max-width:50em;margin:auto;padding:1em;color:#222}"
          "nav,footer,aside{color:#666;font-size:90%}a{color:#0645ad}")


def _frame(title: str, body: str, site_name: str) -> str:
    e = html.escape
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{e(title)}</title>"
            f"<style>{_STYLE}</style></head><body>\n"
            f"<header><nav><a href=\"/\">arpo local web</a> · <form action=\"/search\" method=\"get\" "
            f"style=\"display:inline\"><input name=\"q\" placeholder=\"Search\"></form></nav></header>\n"
            f"{body}\n<footer><p>Served by <code>arpo web serve</code> from the {e(site_name)} corpus.</p>"
            f"</footer>\n</body></html>\n")


def _paragraphs(text: str) -> str:
    paras = [p.strip() for p in re.split(r"\n\s*\n|\n", text) if p.strip()]
    return "\n".join(f"<p>{html.escape(p)}</p>" for p in paras)


def render_page(site: Site, i: int, related: list[int]) -> str:
    d = site.index.docs[i]
    e = html.escape
    name = [x.title or x.id for x in site.index.docs]
    links = "".join(f"<li><a href=\"{e(site.paths[j])}\">{e(name[j])}</a></li>" for j in related if j != i)
    aside = f"<aside><h2>Related pages</h2><ul>{links}</ul></aside>" if links else ""
    body = f"<main><article><h1>{e(d.title or d.id)}</h1>\n{_paragraphs(d.text)}\n</article>\n{aside}</main>"
    return _frame(d.title or d.id, body, site.name)


def render_results(site: Site, query: str, hits: list[tuple[int, float]], snippet_chars: int = 300) -> str:
    e = html.escape
    items = "".join(f"<li><a href=\"{e(site.paths[i])}\">{e(site.index.docs[i].title or site.index.docs[i].id)}</a>"
                    f"<p>{e(snippet(site.index.docs[i].text, snippet_chars))}</p></li>" for i, _ in hits)
    body = f"<main><h1>Results for {e(query)}</h1><ol>{items}</ol></main>" if items else \
        f"<main><h1>No results for {e(query)}</h1></main>"
    return _frame(f"{query} - search", body, site.name)


def render_home(site: Site) -> str:
    body = (f"<main><h1>arpo local web</h1><p>{len(site)} pages from the {html.escape(site.name)} corpus. "
            f"Search them above, or through the JSON API: <code>/search?q=...&amp;format=json</code> "
            f"(SearXNG's).</p></main>")
    return _frame("arpo local web", body, site.name)


def snippet(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n].rsplit(" ", 1)[0] + " …"


def searxng_json(site: Site, base_url: str, query: str, hits: list[tuple[int, float]], pageno: int,
                 snippet_chars: int) -> dict:
    """The response of SearXNG's `/search?format=json` for these hits."""
    results = [{"url": base_url.rstrip("/") + site.paths[i], "title": site.index.docs[i].title or site.index.docs[i].id,
                "content": snippet(site.index.docs[i].text, snippet_chars), "engine": "arpo-local",
                "engines": ["arpo-local"], "positions": [r], "score": round(float(s), 4), "category": "general"}
               for r, (i, s) in enumerate(hits, 1)]
    return {"query": query, "number_of_results": len(results), "results": results, "answers": [],
            "corrections": [], "infoboxes": [], "suggestions": [], "unresponsive_engines": [], "pageno": pageno}
