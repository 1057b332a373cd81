"""The pages of a user corpus for `arpo web serve`: every paragraph served. MuSiQue's paragraphs are
sections of Wikipedia articles, so many share a title ("Green" four times, with four texts); keeping
the first of each title (what a search index does, retrieval/index.py `load_corpus`) dropped 408 of
3,141 distinct paragraphs of 200 dev questions, 78 of them supporting (issue 62's count). Here a title is one page and
each distinct paragraph under it one of its sections, in the order the files give them:

    docs, merged = load_pages(["my_musique.jsonl"])
    merged.line()  ->  "6 paragraphs on 5 pages: 1 paragraphs share a title ... (e.g. 'The Collegian': 2)"

Rows `{id?, title, text}` are pages as they are (one page per id; two texts under one title without
ids stay the error of `load_corpus`). HotpotQA rows (`context`) and MuSiQue rows (`paragraphs`) give
paragraphs; a paragraph whose text is already a section of its title's page is a copy (the same
paragraph in another question's row) and is served once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from arpo.data.sources import iter_rows
from arpo.errors import ArpoError
from arpo.retrieval.corpus import Doc, docs_of_row


@dataclass
class Merged:
    """What `load_pages` did: paragraphs read (distinct texts), pages made, and the sections of each
    page that holds more than one paragraph."""
    paragraphs: int = 0
    pages: int = 0
    sections: dict[str, int] = field(default_factory=dict)  # title -> its distinct paragraphs (only when > 1)

    def line(self) -> str:
        head = f"{self.paragraphs:,} paragraphs on {self.pages:,} pages"
        if not self.sections:
            return head + " (one page each)"
        extra = sum(self.sections.values()) - len(self.sections)
        top = sorted(self.sections.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
        eg = ", ".join(f"{t!r}: {n}" for t, n in top)
        return (f"{head}: {extra:,} paragraphs share a title with another and are sections of that title's page "
                f"({len(self.sections):,} pages of several sections, e.g. {eg})")


def load_pages(specs: list[str]) -> tuple[list[Doc], Merged]:
    """(one Doc per page, the report of what was merged). A page's text is its sections' texts, in
    file order, separated by a blank line."""

    pages: dict[str, Doc] = {}
    texts: dict[str, list[str]] = {}  # page key -> its sections' texts
    first: dict[str, str] = {}  # page key -> where its first text was read (plain rows)
    for spec in specs:
        for where, row in iter_rows(spec):
            plain = "context" not in row and "paragraphs" not in row
            by_title = plain and "id" not in row
            for key, d in docs_of_row(row, where):
                if not d.text:
                    continue
                if key not in pages:
                    pages[key], texts[key], first[key] = Doc(d.id, d.title, d.text), [d.text], where
                elif d.text in texts[key]:
                    continue  # the same paragraph again (it appears in several questions' rows)
                elif by_title:
                    raise ArpoError(f"{where}: title (its id when a row has none) {key!r} is already the title of "
                                    f"{first[key]}, with another text; give each row its own 'id' to keep both pages")
                elif plain:
                    continue  # the same id again: the first row wins (as `arpo index build`)
                else:
                    texts[key].append(d.text)
    if not pages:
        raise ArpoError(f"no documents in {', '.join(map(str, specs)) or '(no files)'}")
    docs = [Doc(p.id, p.title, "\n\n".join(texts[k])) for k, p in pages.items()]
    merged = Merged(paragraphs=sum(map(len, texts.values())), pages=len(docs),
                    sections={pages[k].title or k: len(t) for k, t in texts.items() if len(t) > 1})
    return docs, merged
