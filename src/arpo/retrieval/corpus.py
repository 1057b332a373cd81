"""Corpus files: the documents of JSONL rows in the three layouts arpo reads (`{id, title, text}`,
HotpotQA, MuSiQue). Standard library only (no numpy), so that `arpo web serve` reads a corpus
without loading the search index's libraries."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from arpo.data.sources import iter_rows
from arpo.errors import ArpoError


@dataclass
class Doc:
    id: str
    title: str
    text: str



# ---- corpus files ---------------------------------------------------------------------------------
def _str_list(x) -> bool:
    return isinstance(x, list) and all(isinstance(s, str) for s in x)


def docs_of_row(row: dict, where: str) -> list[tuple[str, Doc]]:
    """(dedup key, Doc) pairs of one JSONL row; the layout is recognized from its keys."""
    if "context" in row:  # HotpotQA, Hugging Face layout: context{title[], sentences[][]}
        ctx = row["context"]
        if not (isinstance(ctx, dict) and _str_list(ctx.get("title"))
                and isinstance(ctx.get("sentences"), list) and all(_str_list(s) for s in ctx["sentences"])):
            raise ArpoError(f"{where}: HotpotQA field 'context' must be "
                            "{\"title\": [str, ...], \"sentences\": [[str, ...], ...]}")
        if len(ctx["title"]) != len(ctx["sentences"]):
            raise ArpoError(f"{where}: 'context' has {len(ctx['title'])} titles but "
                            f"{len(ctx['sentences'])} sentence lists")
        return [(t, Doc(t, t, "".join(s).strip())) for t, s in zip(ctx["title"], ctx["sentences"], strict=True)]
    if "paragraphs" in row:  # MuSiQue: paragraphs[{title, paragraph_text}]
        ps = row["paragraphs"]
        if not isinstance(ps, list):
            raise ArpoError(f"{where}: MuSiQue field 'paragraphs' must be a list")
        out = []
        for j, p in enumerate(ps):
            if not (isinstance(p, dict) and isinstance(p.get("paragraph_text"), str)
                    and isinstance(p.get("title", ""), str)):
                raise ArpoError(f"{where}: paragraphs[{j}] needs a string 'paragraph_text' (and 'title')")
            title, text = p.get("title", ""), p["paragraph_text"].strip()
            did = title or "p" + hashlib.sha1(text.encode()).hexdigest()[:12]  # untitled: by content
            out.append((did, Doc(did, title, text)))
        return out
    if "text" in row:  # plain {id, title, text}
        if not isinstance(row["text"], str) or not isinstance(row.get("title", ""), str):
            raise ArpoError(f"{where}: fields 'title' and 'text' must be strings")
        title = row.get("title", "")
        did = row.get("id", title)
        if did is None or did == "" or isinstance(did, (dict, list)):
            raise ArpoError(f"{where}: a row needs an 'id' (or a non-empty 'title')")
        return [(str(did), Doc(str(did), title, row["text"].strip()))]
    raise ArpoError(f"{where}: unknown row layout (keys: {', '.join(sorted(row)[:8])}); expected "
                    "{id, title, text}, a HotpotQA row (context) or a MuSiQue row (paragraphs)")


def load_corpus(paths: Sequence[str | Path] | str | Path) -> list[Doc]:
    """Documents from data specs (JSONL files, globs, built-in names such as `hotpotqa`; see
    arpo.data.sources), one of three layouts per row:

    - `{"id", "title", "text"}`: one document (deduplicated by id; a row without one has its title as
      its id, and a second such row with that title and another text is an error naming both rows);
    - HotpotQA (Hugging Face layout), `context{title[], sentences[][]}`: one document per
      paragraph, text = "".join(sentences), deduplicated by title (the first copy wins);
    - MuSiQue, `paragraphs[{title, paragraph_text}]`: one document per paragraph, deduplicated by title.

    Empty lines and empty paragraphs are skipped. A missing file, bad JSON or a row of an unknown
    layout raises ArpoError naming `file:line`.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    seen: dict[str, tuple[str, str]] = {}  # dedup key -> (where, text) of its first document
    docs: list[Doc] = []
    for path in paths:
        for where, row in iter_rows(path):
            by_title = "context" not in row and "paragraphs" not in row and "id" not in row  # its id is its title
            for key, d in docs_of_row(row, where):
                if not d.text:
                    continue
                if key in seen:
                    first, text = seen[key]
                    if by_title and text != d.text:  # a page with the title of another was dropped unseen
                        raise ArpoError(f"{where}: title (its id when a row has none) {key!r} is already the title of "
                                        f"{first}, with another text; give each row its own 'id' to keep both pages")
                    continue
                seen[key] = (where, d.text)
                docs.append(d)
    if not docs:
        raise ArpoError(f"no documents in {', '.join(map(str, paths)) or '(no files)'}")
    return docs
