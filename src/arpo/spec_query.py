"""The `?key=value&...` options of a data, tool or reward spec (`rg:…`, `env:…`, `vf:…`, `hf:…`, `judge:…`).

A spec is typed on a command line, not sent by a browser: `+` is a plus (`operators=["+","-"]`), not
the space that form encoding makes of it; `%XX` escapes still decode (`%26` for a literal `&`).
"""

from __future__ import annotations

from urllib.parse import parse_qsl


def query_pairs(query: str) -> list[tuple[str, str]]:
    """'a=1&ops=["+","-"]' -> [('a', '1'), ('ops', '["+","-"]')]: parse_qsl with `+` kept literal."""
    return parse_qsl(query.replace("+", "%2B"), keep_blank_values=True)
