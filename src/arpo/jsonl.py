"""JSON Lines in and out, the one way arpo reads and writes them.

Reading names the place of every problem as `file:line` (a missing file, invalid JSON, a line that
is not an object, bytes that are not UTF-8); writing is atomic (a temp file, then a rename), so a
crash never leaves half a file behind.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from arpo.errors import ArpoError


def iter_jsonl(path: str | Path, what: str = "file") -> Iterator[tuple[str, dict]]:
    """Yield (`file:line`, row) for every non-blank line (`.gz` files are decompressed); `what`
    names the file in errors."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ArpoError(f"{what} {p} does not exist")
    i = 0
    try:
        with (gzip.open(p, "rt", encoding="utf-8") if p.suffix == ".gz" else open(p, encoding="utf-8")) as f:
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{p}:{i}"
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ArpoError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from e
                if not isinstance(row, dict):
                    raise ArpoError(f"{where}: expected a JSON object, got {type(row).__name__}")
                yield where, row
    except UnicodeDecodeError as e:
        raise ArpoError(f"{p}:{i + 1}: not UTF-8 text ({e.reason})") from e
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
        reason = e.strerror if isinstance(e, OSError) and e.strerror else e
        raise ArpoError(f"{what} {p} cannot be read: {reason}") from e


def read_jsonl(path: str | Path, what: str = "file") -> list[dict]:
    return [row for _, row in iter_jsonl(path, what)]


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> Path:
    """Write rows atomically (parents created)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    except OSError as e:  # a full disk: the old file stays, the half-written copy goes, the error names the file
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(out)) from e
    os.replace(tmp, out)
    return out


def prepare_output(path: str | Path, flag: str = "--out", inputs=(), directory: bool = False) -> Path:
    """Check an output path before the work that fills it starts (every command with an output calls
    this first): its folder is created and must be writable (a long run must not die at the end on a
    missing or read-only directory), and no output may overwrite an input: the output is none of
    `inputs` (resolved paths: data.sources.input_paths of the input specs), and an output `directory`
    holds none of them (pass inputs for a directory that is written as a whole)."""
    out = Path(path).expanduser()
    target = out.resolve()
    for src in inputs:
        if src == target or (directory and target in src.parents):
            raise ArpoError(f"{flag} {out} would overwrite the input {src}; write the output somewhere else")
    if directory:
        if out.exists() and not out.is_dir():
            raise ArpoError(f"{flag} {out} is a file; give a directory")
    elif out.is_dir():
        raise ArpoError(f"{flag} {out} is a directory; give a file path")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)  # an output directory itself is left to its writer
        for d in ([out.parent] + ([out] if out.is_dir() else []) if directory else [out.parent]):
            probe = d / f".{out.name}.probe-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
    except OSError as e:
        raise ArpoError(f"{flag} {out}: cannot write there ({e.strerror or e})") from e
    return out


def read_jsonl_gz(path: Path) -> list[dict]:
    """The rows of a gzip-compressed JSONL file (the generated built-in datasets: hop2, webhop)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def jsonl_gz_bytes(rows: list[dict]) -> bytes:
    """Deterministic gzip (mtime 0, no file name) of JSONL rows with sorted keys: a generator that
    writes its files with this reproduces them byte for byte."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, filename="") as f:
        f.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode())
    return buf.getvalue()
