"""An evaluation's finished answers on disk while it runs, so that an interrupted `arpo eval --out X.json`
(Ctrl-C, SIGTERM, a crash, a lost machine) continues where it stopped with `--resume` instead of starting
again.

X.partial.jsonl is append-only JSON lines: a header `{"arpo_eval_partial": 1, "settings": {...}}` (what
makes two runs' answers the same answers: model, data and a digest of its questions, samples, sampling,
agent, tools, reward), then one line per finished batch `{"dataset": spec, "start": j, "records": [...]}`
(j: the batch's first sample in the dataset's order), flushed and fsynced as the batch ends. A line a
crash cut short is dropped (that batch is answered again). A resumed run skips the samples finished
(whole batches, so the batches after them are the ones an uninterrupted run decodes) and refuses
other settings, naming the first that differs. The recipe removes the file once X.json holds the
finished evaluation.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from arpo.errors import ArpoError

VERSION = 1


def partial_path(out: str | Path) -> Path:
    """Where the finished answers of an evaluation written to `out` are kept while it runs."""
    return Path(out).expanduser().with_suffix(".partial.jsonl")


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """{dotted key: leaf value} of nested mappings (lists are leaves)."""
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def mismatch(then: dict, now: dict) -> str | None:
    """The first setting (a dotted key) whose value differs between two header settings, said as
    `key: A then, B now`; None when they agree."""
    a, b = flatten(then), flatten(now)
    for k in sorted(a.keys() | b.keys()):
        if a.get(k, "(unset)") != b.get(k, "(unset)"):
            return f"{k}: {json.dumps(a.get(k, '(unset)'))} then, {json.dumps(b.get(k, '(unset)'))} now"
    return None


def _read(path: Path) -> tuple[dict, list[dict]]:
    """(header settings, the intact batch lines) of a partial file; a broken line ends what is read."""
    header: dict | None = None
    batches: list[dict] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ArpoError(f"{path}: cannot read the interrupted evaluation's answers ({e}); delete it to start over") \
            from None
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            break  # the line a crash cut short, and nothing after it
        if i == 0:
            if not (isinstance(row, dict) and row.get("arpo_eval_partial") == VERSION):
                raise ArpoError(f"{path}:1: not the partial file of `arpo eval --out` (version {VERSION}); "
                                "move it away or choose another --out")
            header = row["settings"]
        elif isinstance(row, dict) and {"dataset", "start", "records"} <= row.keys():
            batches.append(row)
        else:
            break
    if header is None:
        raise ArpoError(f"{path}: empty or broken; delete it to start over")
    return header, batches


def finished(batches: list[dict]) -> dict[str, list[dict]]:
    """Each dataset's finished records, from its first sample on without a gap."""
    done: dict[str, list[dict]] = {}
    for b in batches:
        recs = done.setdefault(b["dataset"], [])
        if b["start"] == len(recs):
            recs.extend(b["records"])
    return done


class PartialRun:
    """The partial file of one evaluation: `done(spec)` its finished records, `add` a finished batch,
    `remove` once the final output is written. Use `open`."""

    def __init__(self, path: Path, settings: dict, done: dict[str, list[dict]]):
        self.path, self.settings, self._done = path, settings, done
        lines = [{"arpo_eval_partial": VERSION, "settings": settings}] + [
            {"dataset": d, "start": 0, "records": recs} for d, recs in done.items() if recs]
        # rewritten whole (a cut line dropped), then appended to
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            tmp.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8")
            os.replace(tmp, path)
            self._f = path.open("a", encoding="utf-8")
        except OSError as e:  # a full disk: said before the model loads
            tmp.unlink(missing_ok=True)
            raise ArpoError(f"{path}: cannot write the evaluation's partial file ({e.strerror or e})") from None
        self._failed = False

    @classmethod
    def open(cls, out: str | Path, settings: dict, resume: bool) -> tuple[PartialRun, int]:
        """The partial file next to `out` and how many finished answers it holds. `settings`: this run's
        (JSON values). Without `resume`, an existing file with answers (an interrupted run's) is an
        error, as is a file of other settings with it; a file without any is started over."""
        path = partial_path(out)
        settings = json.loads(json.dumps(settings))  # as they read back: tuples are lists
        done: dict[str, list[dict]] = {}
        if path.exists():
            then, batches = _read(path)
            done = finished(batches)
            n = sum(len(r) for r in done.values())
            if n == 0:  # a run that stopped before its first batch (a bad model, Ctrl-C while loading)
                done = {}
            elif not resume:
                raise ArpoError(f"{path} holds {n} finished answers of an interrupted evaluation: add --resume to "
                                "continue it, or delete that file to start over")
            elif (diff := mismatch(then, settings)) is not None:
                raise ArpoError(f"--resume: {path} is an evaluation with other settings ({diff}); run it with its "
                                "settings, or delete that file to start over")
        return cls(path, settings, done), sum(len(r) for r in done.values())

    def done(self, dataset: str) -> list[dict]:
        return list(self._done.get(dataset, []))

    def add(self, dataset: str, start: int, records: list[dict]) -> None:
        """Append one finished batch, on disk before this returns (a crash after it keeps the batch). A
        write that fails (a full disk) is said once and the evaluation goes on: its answers are still
        written to --out (or a temporary file) at the end, only a resume would start earlier."""
        if self._failed:
            return
        try:
            self._f.write(json.dumps({"dataset": dataset, "start": start, "records": records},
                                     ensure_ascii=False) + "\n")
            self._f.flush()
            os.fsync(self._f.fileno())
        except OSError as e:
            self._failed = True
            print(f"arpo eval: cannot append to {self.path} ({e.strerror or e}); the evaluation goes on, but a "
                  "--resume after an interruption would not find its later answers", file=sys.stderr)

    def close(self) -> None:
        try:
            self._f.close()
        except OSError:  # the last flush on a full disk: add() said so
            pass

    def remove(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
