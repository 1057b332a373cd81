"""A fetched page's readable text: HTML through trafilatura, text and JSON as they are.

The page names its own charset, and a page is hostile input: only the web's text encodings (the
WHATWG Encoding Standard's, as Python codecs) are used to decode it; any other name (punycode: 31.7 s
a MB, idna, the escape codecs, ...) or an unknown one decodes as UTF-8 with replacement characters.
"""

from __future__ import annotations

import codecs
import re

from arpo.tools.web.webhttp import WebError

_WEB_CHARSETS = frozenset(codecs.lookup(n).name for n in (
    "utf-8 utf-16-le utf-16-be utf-16 cp866 iso8859-1 iso8859-2 iso8859-3 iso8859-4 iso8859-5 iso8859-6 iso8859-7 "
    "iso8859-8 iso8859-10 iso8859-13 iso8859-14 iso8859-15 iso8859-16 koi8-r koi8-u mac-roman mac-cyrillic cp874 "
    "cp1250 cp1251 cp1252 cp1253 cp1254 cp1255 cp1256 cp1257 cp1258 gbk gb2312 gb18030 big5 big5hkscs euc_jp "
    "iso2022_jp shift_jis cp932 euc_kr cp949 ascii").split())
_CHARSET = re.compile(r"charset=[\"']?([\w.:-]+)", re.I)


def charset(content_type: str) -> str:
    """The Python codec for the Content-Type's charset: one of the web's text encodings, else utf-8."""
    m = _CHARSET.search(content_type or "")
    label = m.group(1).lower() if m else "utf-8"
    label = {"windows-874": "cp874", "x-sjis": "shift_jis", "x-gbk": "gbk"}.get(label, label)
    try:
        name = codecs.lookup(label).name
    except LookupError:
        return "utf-8"
    return name if name in _WEB_CHARSETS else "utf-8"


def extract_text(body: bytes, content_type: str, url: str) -> tuple[str, str]:
    """(title, readable text) of a response body. HTML: trafilatura's main text (its plain-text
    conversion when it finds no main text); text and JSON: decoded as is. Raises WebError for other types."""
    ctype = (content_type or "").split(";")[0].strip().lower()
    enc = charset(content_type)
    if ctype in ("text/html", "application/xhtml+xml", "") or (not ctype and body.lstrip()[:1] == b"<"):
        import trafilatura

        html = body.decode(enc, errors="replace")
        text = trafilatura.extract(html, url=url, include_comments=False, include_tables=True, favor_recall=True)
        if not text:
            text = trafilatura.html2txt(html) or ""
        meta = trafilatura.extract_metadata(html)
        title = (meta.title if meta is not None and meta.title else "") or ""
        return title, text.strip()
    if ctype.startswith("text/") or ctype in ("application/json", "application/xml") or ctype.endswith("+json"):
        return "", body.decode(enc, errors="replace").strip()
    raise WebError(f"cannot read content type {ctype} (only HTML, text and JSON pages)")
