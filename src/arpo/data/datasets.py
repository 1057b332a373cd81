"""Datasets: GSM8K, HotpotQA, FlashRAG (`id, question, golden_answers`: Bamboogle, 2Wiki, MuSiQue,
NQ ...) and generic JSONL/parquet rows `{question, answer | answers, task}`, as plain examples.

An example is `{"id", "question", "answers": [str, ...], "task": "math" | "qa"}`. The task picks the
prompt template and the reward. A row may declare its `cluster` (any string): questions that share
everything but a detail (hop2: the three attributes asked of one town and relation) are one unit of
the experiments' statistics (experiments/clustered.py); a row without one is its own cluster.
A malformed row is an error naming file, line and field.
"""

from __future__ import annotations

import sys
from pathlib import Path

from arpo.data.sources import example_id_prefix, is_builtin, iter_rows, split_slice
from arpo.errors import ArpoError

TASKS = ("math", "qa")


def _answer_text(a) -> str:
    """A numeric answer as the text a model would write: 504.0 -> '504' (SVAMP stores floats)."""
    if isinstance(a, float) and a.is_integer():
        return str(int(a))
    return str(a)


def _with_aliases(where: str, row: dict, answers: list[str]) -> list[str]:
    """`answers` and MuSiQue's `answer_aliases` (other spellings of the answer: each a gold answer)."""
    al = row.get("answer_aliases")
    if al is None:
        return answers
    if not isinstance(al, list) or not all(isinstance(a, (str, int, float)) and not isinstance(a, bool) for a in al):
        raise ArpoError(f"{where}: field 'answer_aliases' must be a list of strings")
    return list(dict.fromkeys([*answers, *(s for s in map(_answer_text, al) if s.strip())]))


def _example(where: str, i: int, row: dict, task: str | None, id_prefix: str) -> dict:
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
        answers = [_answer_text(a) for a in answers]
        if not any(a.strip() for a in answers):
            raise ArpoError(f"{where}: field {key!r} holds only empty answers (nothing could ever match them)")
    elif "answer" in row:
        a = row["answer"]
        if not isinstance(a, (str, int, float)) or isinstance(a, bool):
            raise ArpoError(f"{where}: field 'answer' must be a string or number")
        a = _answer_text(a)
        if "####" in a:  # GSM8K: the final answer follows '#### ' on the last line
            a = a.rsplit("####", 1)[1].strip().replace(",", "")
        if not a.strip():
            raise ArpoError(f"{where}: field 'answer' is empty (nothing could ever match it)")
        answers = [a]
    else:
        raise ArpoError(f"{where}: needs a field 'answer', 'answers' or 'golden_answers'")
    answers = _with_aliases(where, row, answers)
    t = task or row.get("task") or ("math" if "####" in str(row.get("answer", "")) else "qa")
    if t not in TASKS:
        raise ArpoError(f"{where}: field 'task' is {t!r}; expected one of {', '.join(TASKS)}")
    ex = {"id": str(row["id"]) if row.get("id") is not None else f"{id_prefix}-{i}", "question": q.strip(),
          "answers": answers, "task": t}
    if "answer" in row and "####" in str(row["answer"]):
        ex["solution"] = str(row["answer"])  # GSM8K worked solution, for cold-start SFT data
    if isinstance(row.get("equation"), str):
        ex["equation"] = row["equation"]  # SVAMP: the python expression of the answer, for cold-start SFT data
    sup = supporting_titles(row)
    if sup:
        ex["supporting"] = sup  # the pages a multi-hop answer rests on (deep-search metrics, eval/deep_search.py)
    # an environment's task (which episode a trajectory plays), a reasoning-gym entry (its grader's input)
    ex.update({k: row[k] for k in ("env", "rg", "vf") if isinstance(row.get(k), dict)})
    if row.get("cluster") is not None:  # questions that share all but a detail (experiments/clustered.py)
        ex["cluster"] = str(row["cluster"])
    return ex


def supporting_titles(row: dict) -> list[str]:
    """The titles of the pages a row's answer rests on, in order, without repeats: its `supporting`
    list of titles; HotpotQA's `supporting_facts` (`{title: [...], ...}` or `[[title, sentence], ...]`);
    MuSiQue's `paragraphs` marked `is_supporting`. [] when the row says nothing about them."""
    sup = row.get("supporting")
    if isinstance(sup, list) and all(isinstance(t, str) for t in sup):
        return list(dict.fromkeys(sup))
    sf = row.get("supporting_facts")
    titles: list = []
    if isinstance(sf, dict) and isinstance(sf.get("title"), list):
        titles = sf["title"]
    elif isinstance(sf, list):
        titles = [f[0] for f in sf if isinstance(f, (list, tuple)) and f]
    elif isinstance(row.get("paragraphs"), list):
        titles = [p.get("title") for p in row["paragraphs"] if isinstance(p, dict) and p.get("is_supporting")]
    return list(dict.fromkeys(t for t in titles if isinstance(t, str) and t))


def load_examples(spec: str | Path, limit: int | None = None, task: str | None = None) -> list[dict]:
    """Examples from a data spec (data/sources.py): a built-in name (`svamp:test`), `hf:NAME:SPLIT`,
    a JSONL(.gz)/parquet file or a glob; rows are GSM8K, HotpotQA, FlashRAG or
    `{question, answer|answers, task}`. `task` (math | qa) wins over the rows' own; rows without
    one are inferred (a GSM8K `####` answer: math; else qa) and a line on stderr says so."""
    if limit is not None and limit < 1:
        raise ArpoError(f"limit must be >= 1 (or unset for every row), got {limit}")
    if task is not None and task not in TASKS:
        raise ArpoError(f"task {task!r}: choose one of {', '.join(TASKS)}")
    out = []
    prefix = None
    inferred: dict[str, int] = {}
    seen: dict[str, str] = {}  # id -> where it was first read
    for i, (where, row) in enumerate(iter_rows(spec), split_slice(spec)[1] + 1):  # ids count from the file's start
        prefix = prefix or example_id_prefix(spec, where)
        ex = _example(where, i, row, task, prefix)
        if ex["id"] in seen:  # results are keyed by id: two rows would count as one question
            raise ArpoError(f"{where}: id {ex['id']!r} is already the id of {seen[ex['id']]}: give each row its own "
                            "'id' (or drop the field: ids default to FILE-LINE)")
        seen[ex["id"]] = where
        if task is None and not row.get("task"):
            inferred[ex["task"]] = inferred.get(ex["task"], 0) + 1
        out.append(ex)
        if limit is not None and len(out) >= limit:
            break
    if not out:
        base, start, stop = split_slice(spec)
        if start:  # a slice past the end reads nothing: say how many rows there are
            n = sum(1 for _ in iter_rows(base))
            if start >= n:
                raise ArpoError(f"{spec}: no examples: the row slice [{start}:{'' if stop is None else stop}] starts "
                                f"past the end of {base}, which has {n} rows (0..{n - 1})")
        raise ArpoError(f"{spec}: no examples")
    if inferred and not is_builtin(spec):
        print(f"arpo: {spec}: {task_note(inferred, len(out))}", file=sys.stderr)
    return out


# what the task decides: the scoring (the tools and the prompt are the command's, and eval / chat
# print theirs; the note said "search tool, search prompt" while the web tools and deep_search ran)
TASK_MEANS = {"math": "math-equivalence scoring", "qa": "token-F1 scoring"}


def task_note(inferred: dict[str, int], n: int) -> str:
    """What a command says about rows whose task it inferred."""
    parts = "; ".join(f"{c} taken as {t} ({TASK_MEANS[t]})" for t, c in sorted(inferred.items()))
    return (f"{sum(inferred.values())} of {n} rows have no 'task' field: {parts}. Set the task with --task "
            "math|qa (eval), data.task=math|qa (configs), or a 'task' field per row")
