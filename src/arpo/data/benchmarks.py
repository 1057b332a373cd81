"""The paper's 13 benchmarks by name (ARPO, Dong et al. 2025, Tables 1-2), as data specs:

    bench:aime24                 the benchmark's Hugging Face split, through `datasets` (needs network
                                 once; extra `hf`); gated ones (GAIA, HLE) need `huggingface-cli login`
    bench:bamboogle:dev          the dev slice that ships inside arpo (where the license allows)
    bench:gaia@./gaia_val.parquet   a local copy in any on-disk format `datasets` reads (parquet,
                                 jsonl/json, csv, a `save_to_disk` or data folder), same field mapping
    bench:math500[0:50]          any of these, rows 0..49 (a Python slice, as for every data spec)

Each benchmark names its Hub id, config and split, how its columns map onto arpo's example fields
(`question`, `answer`/`answers`, `id`), an optional row filter (GAIA and HLE: text-only questions,
as the paper used, and exactly the questions the paper evaluated: their ids ship in BENCH_DIR,
`gaia.paper_ids.txt`, `hle.paper_ids.txt`) and value transform (MATH: the `\\boxed{}` answer of the
solution; xbench: the published XOR decryption with each row's canary), the license stated on the dataset card, and the
metric the paper reports for it: token F1 for the four Wikipedia multi-hop QA sets, LLM-as-judge
(`arpo eval --judge`) for the rest. The paper's WebWalker (Table 1) and WebWalkerQA (Table 2) are one
dataset: `bench:webwalker` is an alias of `bench:webwalkerqa`.

How each Hub id, config, split and column name was checked (sources, and what could not be checked
without network): docs/benchmark_sources.md.

Dev slices: the first 20 questions of the paper's own evaluation files (RUC-NLPIR/ARPO @ a95cd08,
`evaluation/data/NAME/test.jsonl`) for the benchmarks whose license allows redistribution; none
for AIME (no license stated), GAIA, HLE and xbench-DeepSearch (gated or published encrypted so that
they stay out of training data: do not republish them in plain text).
"""

from __future__ import annotations

import base64
import functools
import os
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from arpo.errors import ArpoError
from arpo.jsonl import iter_jsonl
from arpo.rewards.answer import extract_boxed

BENCH_DIR = Path(__file__).parent / "builtin" / "bench"
PREFIX = "bench:"


@dataclass(frozen=True)
class Benchmark:
    title: str
    domain: str  # math | knowledge | deep-search (the paper's three groups)
    hf_id: str
    config: str | None
    split: str
    fields: dict  # arpo field -> the dataset's column: question, answer | answers, id
    license: str
    metric: str  # f1 | llm-judge (the paper's)
    task: str  # math | qa (arpo's prompt template and rule-based reward)
    paper: str  # what the paper evaluated
    filter: str | None = None  # text_only_gaia | text_only_hle
    subset: str | None = None  # file under BENCH_DIR: ids (one a line, '#' comments) of the rows the paper evaluated
    transform: str | None = None  # boxed_solution | xbench_decrypt
    gated: bool = False
    dev: str | None = None  # file under BENCH_DIR
    dev_license: str | None = None
    extra: dict = field(default_factory=dict)


_FLASHRAG = "RUC-NLPIR/FlashRAG_datasets"
_QA_FIELDS = {"question": "question", "answers": "golden_answers", "id": "id"}

BENCHMARKS: dict[str, Benchmark] = {
    "aime24": Benchmark("AIME 2024", "math", "HuggingFaceH4/aime_2024", None, "train",
                        {"question": "problem", "answer": "answer", "id": "id"},
                        "none stated on the card (problems © MAA)", "llm-judge", "math", "all 30"),
    "aime25": Benchmark("AIME 2025", "math", "math-ai/aime25", None, "test",
                        {"question": "problem", "answer": "answer", "id": "id"},
                        "none stated on the card (problems © MAA)", "llm-judge", "math", "all 30"),
    "math500": Benchmark("MATH-500", "math", "HuggingFaceH4/MATH-500", None, "test",
                         {"question": "problem", "answer": "answer", "id": "unique_id"},
                         "MIT (PRM800K split of MATH, Hendrycks et al. 2021)", "llm-judge", "math", "all 500",
                         dev="math500.dev.jsonl.gz", dev_license="MIT"),
    "math": Benchmark("MATH", "math", "DigitalLearningGmbH/MATH-lighteval", "default", "test",
                      {"question": "problem", "answer": "solution"}, "MIT (Hendrycks et al. 2021)", "llm-judge", "math",
                      "test questions", transform="boxed_solution"),
    "gsm8k": Benchmark("GSM8K", "math", "openai/gsm8k", "main", "test", {"question": "question", "answer": "answer"},
                       "MIT", "llm-judge", "math", "test (the built-in gsm8k:test is the same split)"),
    "webwalkerqa": Benchmark("WebWalkerQA", "knowledge / deep-search", "callanwu/WebWalkerQA", None, "main",
                             {"question": "Question", "answer": "Answer"}, "Apache-2.0", "llm-judge", "qa",
                             "200 questions (Table 1 'WebWalker') / the main split (Table 2)",
                             dev="webwalkerqa.dev.jsonl.gz", dev_license="Apache-2.0"),
    "hotpotqa": Benchmark("HotpotQA", "knowledge", _FLASHRAG, "hotpotqa", "dev", dict(_QA_FIELDS), "CC BY-SA 4.0",
                          "f1", "qa", "200 dev questions", dev="hotpotqa.dev.jsonl.gz", dev_license="CC BY-SA 4.0"),
    "2wiki": Benchmark("2WikiMultihopQA", "knowledge", _FLASHRAG, "2wikimultihopqa", "dev", dict(_QA_FIELDS),
                       "Apache-2.0", "f1", "qa", "200 dev questions", dev="2wiki.dev.jsonl.gz",
                       dev_license="Apache-2.0"),
    "musique": Benchmark("MuSiQue", "knowledge", _FLASHRAG, "musique", "dev", dict(_QA_FIELDS), "CC BY 4.0", "f1", "qa",
                         "200 dev questions", dev="musique.dev.jsonl.gz", dev_license="CC BY 4.0"),
    "bamboogle": Benchmark("Bamboogle", "knowledge", _FLASHRAG, "bamboogle", "test", dict(_QA_FIELDS), "MIT", "f1",
                           "qa", "all 125", dev="bamboogle.dev.jsonl.gz", dev_license="MIT"),
    "gaia": Benchmark("GAIA", "deep-search", "gaia-benchmark/GAIA", "2023_all", "validation",
                      {"question": "Question", "answer": "Final answer", "id": "task_id"},
                      "gated; the authors ask not to reshare it in crawlable form", "llm-judge", "qa",
                      "the 103 text-only validation questions", filter="text_only_gaia",
                      subset="gaia.paper_ids.txt", gated=True),
    "hle": Benchmark("Humanity's Last Exam", "deep-search", "cais/hle", None, "test",
                     {"question": "question", "answer": "answer", "id": "id"},
                     "MIT, gated (canary: keep out of training)", "llm-judge", "qa",
                     "a 500-question text-only subset", filter="text_only_hle", subset="hle.paper_ids.txt",
                     gated=True),
    "xbench-deepsearch": Benchmark("xbench-DeepSearch", "deep-search", "xbench/DeepSearch", None, "train",
                                   {"question": "prompt", "answer": "answer", "id": "id"},
                                   "published encrypted (canary): do not republish decrypted", "llm-judge", "qa",
                                   "100 (the reference's file holds 99)", transform="xbench_decrypt"),
}
ALIASES = {"webwalker": "webwalkerqa", "xbench": "xbench-deepsearch", "2wikimultihopqa": "2wiki", "math-500": "math500"}


def is_bench(spec) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


def parse(spec: str) -> tuple[str, Benchmark, str | None, str | None]:
    """'bench:NAME[:dev][@LOCAL]' -> (name, benchmark, 'dev' or None, local path or None)."""
    body = spec[len(PREFIX):]
    body, _, local = body.partition("@")
    name, _, part = body.partition(":")
    name = ALIASES.get(name.lower(), name.lower())
    if name not in BENCHMARKS:
        raise ArpoError(f"{spec}: unknown benchmark {name!r}; the paper's benchmarks: "
                        f"{', '.join(PREFIX + n for n in BENCHMARKS)} (`arpo data list`)")
    if part and part != "dev":
        raise ArpoError(f"{spec}: after the name only ':dev' (the shipped slice) is allowed, got {part!r}")
    if part and local:
        raise ArpoError(f"{spec}: give either ':dev' or '@LOCAL_COPY', not both")
    b = BENCHMARKS[name]
    if part and not b.dev:
        raise ArpoError(f"{spec}: {b.title} has no dev slice in arpo ({b.license}); use {PREFIX}{name} "
                        f"(downloads {b.hf_id}) or {PREFIX}{name}@LOCAL_COPY")
    return name, b, part or None, local or None


# data/sources.py imports this module (lazily, for bench: specs); this module never imports it back.
# ---- rows: filters and transforms (pure) ----------------------------------------------------------------
def xor_decrypt(b64: str, key: str) -> str:
    """xbench's published scheme: base64-decode, XOR with the row's canary string (repeated), UTF-8."""
    data, k = base64.b64decode(b64), key.encode("utf-8")
    return bytes(c ^ k[i % len(k)] for i, c in enumerate(data)).decode("utf-8")


def xor_encrypt(text: str, key: str) -> str:
    """The inverse of xor_decrypt (for tests and local copies)."""
    data, k = text.encode("utf-8"), key.encode("utf-8")
    return base64.b64encode(bytes(c ^ k[i % len(k)] for i, c in enumerate(data))).decode("ascii")


@functools.cache
def subset_ids(name: str) -> frozenset:
    """The ids listed in BENCH_DIR/name (one a line; blank lines and '#' comments skipped)."""
    lines = (BENCH_DIR / name).read_text(encoding="utf-8").splitlines()
    return frozenset(t for t in (x.strip() for x in lines) if t and not t.startswith("#"))


def _keep(b: Benchmark, row: dict) -> bool:
    if b.subset and str(row.get(b.fields.get("id", "id"), "")) not in subset_ids(b.subset):
        return False
    if b.filter == "text_only_gaia":
        return not (row.get("file_name") or "").strip()
    if b.filter == "text_only_hle":
        return not (row.get("image") or "")
    return True


def map_row(b: Benchmark, row: dict, where: str) -> dict | None:
    """A dataset row as arpo's raw example fields {question, answer|answers, id?, task}; None when the
    benchmark's filter drops it. A missing column is an error naming it and the columns there are."""
    out: dict = {"task": b.task}
    for target, col in b.fields.items():
        if col not in row:
            if target == "id":
                continue
            raise ArpoError(f"{where}: no column {col!r} for {target} (columns: {', '.join(map(str, row))}); "
                            f"a local copy of {b.hf_id} must keep the Hub's column names")
        out[target] = row[col]
    if not _keep(b, row):
        return None
    if b.transform == "xbench_decrypt":
        key = row.get("canary")
        if not key:
            raise ArpoError(f"{where}: xbench rows need their 'canary' column to decrypt prompt and answer")
        out["question"], out["answer"] = xor_decrypt(out["question"], key), xor_decrypt(out["answer"], key)
    if b.transform == "boxed_solution":
        boxed = extract_boxed(str(out["answer"]))
        if boxed is None:
            raise ArpoError(f"{where}: no \\boxed{{}} answer in the solution")
        out["answer"] = boxed
    return out


# ---- loading -------------------------------------------------------------------------------------------
def iter_rows(spec: str) -> Iterator[tuple[str, dict]]:
    """(where, row) of a bench: spec, rows already mapped to arpo's fields."""
    name, b, part, local = parse(spec)
    if part == "dev":
        assert b.dev is not None  # parse() refuses ':dev' for a benchmark without a shipped slice
        yield from iter_jsonl(BENCH_DIR / b.dev, "dev slice")
        return
    ds = _load_local(spec, b, local) if local else _load_hub(spec, b)
    read = kept = 0
    for i, row in enumerate(ds, 1):
        read, where = i, f"{spec} row {i}"
        mapped = map_row(b, dict(row), where)
        if mapped is not None:
            kept += 1
            yield where, mapped
    if read and not kept and b.subset:
        raise ArpoError(f"{spec}: none of its {read} rows is among the {len(subset_ids(b.subset))} questions the "
                        f"paper evaluated (their {b.fields.get('id', 'id')!r} values: {BENCH_DIR / b.subset}); "
                        f"is this a copy of {b.hf_id} split {b.split!r}?")


def _datasets(spec: str):
    try:
        import datasets
    except ImportError as e:
        raise ArpoError(f"{spec}: the paper's benchmarks load through the `datasets` library "
                        "(pip install 'arpo[hf]')") from e
    datasets.logging.set_verbosity_error()
    return datasets


def _load_local(spec: str, b: Benchmark, local: str):
    """A local copy in any format `datasets` reads: a parquet / jsonl / json / csv file, a folder of
    them, or a `save_to_disk` folder; the benchmark's split if it has several."""
    datasets = _datasets(spec)
    p = Path(local).expanduser()
    if not p.exists():
        raise ArpoError(f"{spec}: local copy {p} does not exist")
    builder = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv", ".gz": "json"}
    try:
        if p.is_file():
            if p.suffix not in builder:
                raise ArpoError(f"{spec}: {p.name}: expected a .parquet, .jsonl, .json or .csv file")
            return datasets.load_dataset(builder[p.suffix], data_files=str(p), split="train")
        if (p / "dataset_dict.json").exists() or (p / "state.json").exists():
            ds = datasets.load_from_disk(str(p))
        else:
            ds = datasets.load_dataset(str(p))
    except ArpoError:
        raise
    except Exception as e:
        raise ArpoError(f"{spec}: cannot read the local copy {p} ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''})") from e
    if isinstance(ds, datasets.DatasetDict):
        if b.split in ds:
            return ds[b.split]
        if len(ds) == 1:
            return next(iter(ds.values()))
        raise ArpoError(f"{spec}: {p} has splits {', '.join(ds)}, none of them {b.split!r}")
    return ds


def hub_host() -> tuple[str, int]:
    """The host and port `datasets` downloads from ($HF_ENDPOINT, default https://huggingface.co)."""
    u = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return u.hostname or "huggingface.co", u.port or (443 if u.scheme == "https" else 80)


def hub_reachable(timeout: float = 3.0) -> bool:
    host, port = hub_host()
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def offline_message(spec: str, b: Benchmark, offline_mode: bool = False) -> str:
    """What to do without network: where the data comes from, and the two ways to run offline."""
    host, port = hub_host()
    name = spec[len(PREFIX):].split("@")[0]
    what = f"{b.hf_id}{':' + b.config if b.config else ''} split {b.split!r}"
    head = (f"{spec}: HF_HUB_OFFLINE is set and the Hugging Face cache does not hold {what}." if offline_mode else
            f"{spec}: no network — cannot reach the Hugging Face Hub ({host}:{port}) to download {what}.")
    gated = (" It is gated: accept its terms on the Hub page and log in (`huggingface-cli login` or $HF_TOKEN)."
             if b.gated else "")
    return (f"{head}{gated} On a machine with network, `arpo data show {PREFIX}{name} --limit 1` downloads it into "
            "the Hugging Face cache (then HF_HUB_OFFLINE=1 uses that cache); or copy the data over and pass "
            f"{PREFIX}{name}@PATH (parquet, jsonl, csv or a save_to_disk folder, the Hub's column names)."
            + (f" Offline right now: {PREFIX}{name}:dev ships inside arpo." if b.dev else ""))


def _load_hub(spec: str, b: Benchmark):
    datasets = _datasets(spec)
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0") or \
        os.environ.get("HF_DATASETS_OFFLINE", "0") not in ("", "0")
    if not offline and not hub_reachable():
        raise ArpoError(offline_message(spec, b))
    try:
        return datasets.load_dataset(b.hf_id, b.config, split=b.split)
    except Exception as e:
        msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        low = msg.lower()
        if b.gated and any(w in low for w in ("gated", "401", "403", "authenticat", "access")):
            raise ArpoError(f"{spec}: {b.hf_id} is gated: accept its terms on https://huggingface.co/datasets/"
                            f"{b.hf_id} and log in (`huggingface-cli login` or $HF_TOKEN) ({msg})") from e
        if offline or any(w in low for w in ("couldn't reach", "offline", "connection", "resolve", "timed out")):
            raise ArpoError(offline_message(spec, b, offline_mode=offline) + f" ({msg})") from e
        raise ArpoError(f"{spec}: cannot load {b.hf_id} ({msg})") from e


def listing() -> list[dict]:
    """One row per benchmark for `arpo data list`."""
    def count_rows(path):
        return sum(1 for _ in iter_jsonl(path, "dev slice"))

    out = []
    for n, b in BENCHMARKS.items():
        aliases = [a for a, t in ALIASES.items() if t == n]
        out.append({"name": PREFIX + n, "aliases": [PREFIX + a for a in aliases], "title": b.title,
                    "domain": b.domain, "hf_id": b.hf_id, "config": b.config, "split": b.split,
                    "fields": {k: v for k, v in b.fields.items()}, "filter": b.filter, "transform": b.transform,
                    "paper_ids": len(subset_ids(b.subset)) if b.subset else None,
                    "license": b.license, "metric": b.metric, "task": b.task, "paper": b.paper, "gated": b.gated,
                    "dev": PREFIX + n + ":dev" if b.dev else None,
                    "dev_rows": count_rows(BENCH_DIR / b.dev) if b.dev else 0, "dev_license": b.dev_license})
    return out


def metric_of(spec) -> str | None:
    """The paper's metric for a bench: spec (f1 | llm-judge), None for any other spec."""
    if not is_bench(str(spec)):
        return None
    return parse(re.sub(r"\[\d*:\d*\]$", "", str(spec)))[1].metric  # without a row slice
