"""Datasets: GSM8K, HotpotQA, FlashRAG (`id, question, golden_answers`: Bamboogle, 2Wiki, MuSiQue,
NQ ...) and generic JSONL/parquet rows `{question, answer | answers, task}`, as plain examples.

An example is `{"id", "question", "answers": [str, ...], "task": "math" | "qa"}`. The task picks the
prompt template and the reward. A malformed row is an error naming file, line and field.
"""

from __future__ import annotations

from pathlib import Path

from arpo.errors import ArpoError
from arpo.jsonl import iter_jsonl

TASKS = ("math", "qa")


def _rows(path: Path):
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise ArpoError(f"{path}: reading parquet needs pyarrow (pip install 'arpo[train]')") from e
        for i, row in enumerate(pq.read_table(path).to_pylist(), 1):
            yield i, row
        return
    for where, row in iter_jsonl(path, "dataset file"):
        yield int(where.rsplit(":", 1)[1]), row


def _example(path: Path, i: int, row: dict, task: str | None) -> dict:
    where = f"{path}:{i}"
    q = row.get("question")
    if not isinstance(q, str) or not q.strip():
        raise ArpoError(f"{where}: field 'question' is missing or not a non-empty string")
    key = "answers" if "answers" in row else "golden_answers" if "golden_answers" in row else None  # FlashRAG
    if key:
        answers = row[key]
        if isinstance(answers, str):
            answers = [answers]
        if not isinstance(answers, list) or not answers or not all(isinstance(a, (str, int, float)) for a in answers):
            raise ArpoError(f"{where}: field {key!r} must be a non-empty list of strings")
        answers = [str(a) for a in answers]
    elif "answer" in row:
        a = row["answer"]
        if not isinstance(a, (str, int, float)):
            raise ArpoError(f"{where}: field 'answer' must be a string or number")
        a = str(a)
        if "####" in a:  # GSM8K: the final answer follows '#### ' on the last line
            a = a.rsplit("####", 1)[1].strip().replace(",", "")
        answers = [a]
    else:
        raise ArpoError(f"{where}: needs a field 'answer', 'answers' or 'golden_answers'")
    t = row.get("task") or task or ("math" if "####" in str(row.get("answer", "")) else "qa")
    if t not in TASKS:
        raise ArpoError(f"{where}: field 'task' is {t!r}; expected one of {', '.join(TASKS)}")
    ex = {"id": str(row.get("id", f"{path.stem}-{i}")), "question": q.strip(), "answers": answers, "task": t}
    if "answer" in row and "####" in str(row["answer"]):
        ex["solution"] = str(row["answer"])  # GSM8K worked solution, for cold-start SFT data
    return ex


def load_examples(path: str | Path, limit: int | None = None, task: str | None = None) -> list[dict]:
    """Examples from a JSONL or parquet file (GSM8K, HotpotQA, or `{question, answer|answers, task}`)."""
    p = Path(path)
    if not p.exists():
        raise ArpoError(f"data file {p} does not exist")
    out = []
    for i, row in _rows(p):
        out.append(_example(p, i, row, task))
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise ArpoError(f"{p}: no examples")
    return out
