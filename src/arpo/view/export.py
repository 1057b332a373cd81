"""`arpo view ... --export DIR`: the viewer as a static site that works from file://.

Browsers refuse fetch() of file:// URLs, so every answer the page may ask for is written as a small
script, DIR/data/<path with / as _>.js, that hands its JSON to the page (`ARPO.put(path, data)`);
the page loads them with <script> tags. Same answers as the server (data.Catalog.get).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from arpo.errors import ArpoError
from arpo.view.data import Catalog, NotFound
from arpo.view.server import STATIC

EXPORT_FLAG = "<!--arpo-export-->"


def data_file(path: str) -> str:
    return path.replace("/", "_") + ".js"


def export_paths(catalog: Catalog, steps: set[int] | None = None):
    """Every data path of the site (steps: only these saved steps; None: all)."""
    yield "runs"
    for r, _ in enumerate(catalog.sources):
        yield from (f"runs/{r}/metrics", f"runs/{r}/steps", f"runs/{r}/entropy")
        for s in catalog.get(f"runs/{r}/steps")["steps"]:
            step = s["step"]
            if steps is not None and step not in steps:
                continue
            first = catalog.get(f"runs/{r}/steps/{step}/page/0")
            yield f"runs/{r}/steps/{step}/entropy"
            for p in range(first["pages"]):
                yield f"runs/{r}/steps/{step}/page/{p}"
            for t in range(first["total"]):
                yield f"runs/{r}/steps/{step}/trees/{t}"


def export_site(catalog: Catalog, out: str | Path, steps: set[int] | None = None) -> dict:
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not (out / "index.html").is_file():
        raise ArpoError(f"--export {out}: exists and is not an exported site; choose an empty or new directory")
    (out / "data").mkdir(parents=True, exist_ok=True)
    for name in ("app.js", "style.css"):
        shutil.copyfile(STATIC / name, out / name)
    html = (STATIC / "index.html").read_text()
    html = html.replace(EXPORT_FLAG, "<script>window.ARPO_EXPORT = true;</script>").replace('"static/', '"')
    (out / "index.html").write_text(html)
    n = size = 0
    for path in export_paths(catalog, steps):
        try:
            data = catalog.get(path)
        except NotFound:
            continue
        text = f"ARPO.put({json.dumps(path)}, {json.dumps(data, ensure_ascii=False)});\n"
        (out / "data" / data_file(path)).write_text(text, encoding="utf-8")
        n += 1
        size += len(text.encode())
    return {"dir": str(out), "files": n, "bytes": size}
