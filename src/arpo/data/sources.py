"""Where data comes from. A *data spec* is accepted wherever a data file is (`--data`, `data.path`,
`validation.path`, `arpo sft-data --data`, `arpo index build`, the benchmarks):

    gsm8k:test                       a built-in dataset shipped inside arpo (`arpo data list`)
    hotpotqa                         a built-in dataset's every split (corpus files for the index)
    bench:gaia  bench:bamboogle:dev  one of the paper's 13 benchmarks (data/benchmarks.py): its
                                     Hugging Face split, the slice shipped in arpo, or @LOCAL_COPY
    hf:openai/gsm8k:main:test        a Hugging Face dataset: hf:NAME[:CONFIG]:SPLIT (extra `hf`)
    hf:./my_saved_ds:train?question=problem&answer=solution
                                     ... a local `save_to_disk` / parquet folder, with the fields
                                     that hold the question and the answer(s) renamed
    data/train.jsonl  data/*.jsonl   files (JSONL, JSONL.gz, parquet) and globs
    svamp:train[2000:2400]           any of these, rows 2000..2399 only (Python slice, 0-based)

`iter_rows(spec)` yields `(where, row)` with `where` naming the file and line (or dataset and row)
for error messages; `data_files(spec)` resolves a spec to local files (not for `hf:`).
"""

from __future__ import annotations

import glob
import gzip
import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from urllib.parse import parse_qsl

from arpo.errors import ArpoError

BUILTIN_DIR = Path(__file__).parent / "builtin"


@dataclass(frozen=True)
class Builtin:
    splits: dict  # split -> file name under BUILTIN_DIR/<name>/
    license: str
    source: str
    task: str  # math | qa


BUILTIN: dict[str, Builtin] = {
    "gsm8k": Builtin({"train": "train.jsonl.gz", "test": "test.jsonl.gz"}, "MIT",
                     "Cobbe et al. 2021, openai/grade-school-math", "math"),
    "hotpotqa": Builtin({"train": "train.jsonl.gz", "dev": "dev.jsonl.gz", "test": "test.jsonl.gz"}, "CC BY-SA 4.0",
                        "Yang et al. 2018, distractor setting, official validation questions via megagonlabs/RPT",
                        "qa"),
    "svamp": Builtin({"train": "train.jsonl.gz", "test": "test.jsonl.gz"}, "MIT",
                     "Patel et al. 2021, arkilpatel/SVAMP (train: MAWPS + ASDiv-A; test: SVAMP challenge)", "math"),
}


def builtin_path(name: str, split: str) -> Path:
    return BUILTIN_DIR / name / BUILTIN[name].splits[split]


def _builtin(spec: str) -> list[Path] | None:
    """The files of a built-in name (`gsm8k:test`, or `hotpotqa` = every split), None if not one."""
    name, _, split = spec.partition(":")
    if name not in BUILTIN or "/" in spec:
        return None
    b = BUILTIN[name]
    if not split:
        return [builtin_path(name, s) for s in b.splits]
    if split not in b.splits:
        raise ArpoError(f"built-in dataset {name!r} has no split {split!r}; choose "
                        f"{', '.join(f'{name}:{s}' for s in b.splits)}")
    return [builtin_path(name, split)]


def is_builtin(spec: str | Path) -> bool:
    """Whether `spec` names a built-in dataset (a row slice allowed: svamp:train[0:10])."""
    if not isinstance(spec, str):
        return False
    try:
        return _builtin(str(split_slice(spec)[0])) is not None
    except ArpoError:
        return False


def data_files(spec: str | Path) -> list[Path]:
    """Local files of a spec: a built-in name, a glob or a path (which must exist)."""
    if isinstance(spec, Path):
        spec = str(spec)
    if spec.startswith(("hf:", "bench:")):
        raise ArpoError(f"{spec}: a Hugging Face dataset is not a local file here; use a JSONL/parquet file "
                        "or a built-in name")
    files = _builtin(spec)
    if files is not None:
        return files
    p = Path(spec).expanduser()
    if any(c in spec for c in "*?["):
        found = sorted(Path(f) for f in glob.glob(str(p)))
        if not found:
            raise ArpoError(f"no file matches {spec!r}")
        return found
    if not p.exists():
        known = ", ".join(f"{n}:{s}" for n, b in BUILTIN.items() for s in b.splits)
        raise ArpoError(f"data file {p} does not exist (built-in datasets: {known}; `arpo data list`)")
    if p.is_dir():
        raise ArpoError(f"data file {p} is a directory; give a JSONL/parquet file (or hf:{spec}:SPLIT for a "
                        "saved Hugging Face dataset)")
    return [p]


def describe(spec: str | Path) -> str:
    """A short label for tables: the built-in name, or the file name."""
    s = str(spec)
    return s if is_builtin(s) or s.startswith(("hf:", "bench:")) else Path(s).name


def _file_rows(path: Path) -> Iterator[tuple[str, dict]]:
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise ArpoError(f"{path}: reading parquet needs pyarrow (pip install 'arpo[train]')") from e
        for i, row in enumerate(pq.read_table(path).to_pylist(), 1):
            yield f"{path}:{i}", row
        return
    from arpo.jsonl import iter_jsonl

    yield from iter_jsonl(path, "data file")


_SLICE = re.compile(r"\[(\d*):(\d*)\]$")


def split_slice(spec: str | Path) -> tuple[str | Path, int, int | None]:
    """'svamp:train[10:20]' -> ('svamp:train', 10, 20); no slice -> (spec, 0, None)."""
    if not isinstance(spec, str) or (m := _SLICE.search(spec)) is None:
        return spec, 0, None
    start, stop = int(m.group(1) or 0), int(m.group(2)) if m.group(2) else None
    if stop is not None and stop <= start:
        raise ArpoError(f"{spec}: empty row range [{start}:{stop}]")
    return spec[: m.start()], start, stop


def iter_rows(spec: str | Path) -> Iterator[tuple[str, dict]]:
    """(where, row) for every row of a data spec (see the module docstring)."""
    base, start, stop = split_slice(spec)
    if isinstance(base, str) and base.startswith("hf:"):
        rows = _hf_rows(base)
    elif isinstance(base, str) and base.startswith("bench:"):
        from arpo.data.benchmarks import iter_rows as bench_rows

        rows = bench_rows(base)
    else:
        rows = (r for f in data_files(base) for r in _file_rows(f))
    yield from itertools.islice(rows, start, stop)


def example_id_prefix(spec: str | Path, path_where: str) -> str:
    """The id prefix of rows without an `id`: the built-in name (`svamp:train`) or the file's stem."""
    spec = split_slice(spec)[0]
    if is_builtin(str(spec)) and ":" in str(spec):
        return str(spec)
    if str(spec).startswith("hf:"):
        return str(spec).split("?", 1)[0][3:]
    if str(spec).startswith("bench:"):
        return str(spec).split("@", 1)[0]
    return Path(path_where.rsplit(":", 1)[0]).name.removesuffix(".gz").removesuffix(".jsonl").removesuffix(
        ".parquet")


# ---- Hugging Face datasets ------------------------------------------------------------------------
def parse_hf(spec: str) -> tuple[str, str | None, str, dict]:
    """'hf:NAME[:CONFIG]:SPLIT[?question=F&answer=F]' -> (name, config, split, field renames)."""
    body, _, query = spec[3:].partition("?")
    parts = body.split(":")
    if len(parts) == 2:
        (name, split), config = parts, None
    elif len(parts) == 3:
        name, config, split = parts
    else:
        raise ArpoError(f"{spec}: expected hf:NAME:SPLIT or hf:NAME:CONFIG:SPLIT "
                        "(e.g. hf:openai/gsm8k:main:test)")
    fields = dict(parse_qsl(query, strict_parsing=False)) if query else {}
    bad = set(fields) - {"question", "answer", "answers", "id", "task"}
    if bad:
        raise ArpoError(f"{spec}: unknown field option(s) {', '.join(sorted(bad))}; "
                        "use question=, answer=, answers=, id=, task=")
    if not name or not split:
        raise ArpoError(f"{spec}: the dataset name and the split must not be empty")
    return name, config or None, split, fields


def _hf_rows(spec: str) -> Iterator[tuple[str, dict]]:
    name, config, split, fields = parse_hf(spec)
    try:
        import datasets
    except ImportError as e:
        raise ArpoError(f"{spec}: Hugging Face datasets need the `datasets` library "
                        "(pip install 'arpo[hf]')") from e
    datasets.logging.set_verbosity_error()
    local = Path(name).expanduser()
    try:
        if local.is_dir() and ((local / "dataset_dict.json").exists() or (local / "state.json").exists()):
            ds = datasets.load_from_disk(str(local))
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise ArpoError(f"{spec}: no split {split!r} in {local} (has {', '.join(ds)})")
                ds = ds[split]
        else:
            ds = datasets.load_dataset(str(local) if local.is_dir() else name, config, split=split)
    except ArpoError:
        raise
    except Exception as e:  # hub unreachable, unknown dataset/config/split: one clear line
        raise ArpoError(f"{spec}: cannot load the Hugging Face dataset ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''})") from e
    for target, src in fields.items():
        if src not in ds.column_names:
            raise ArpoError(f"{spec}: no column {src!r} for {target}= (columns: {', '.join(ds.column_names)})")
    for i, row in enumerate(ds, 1):
        row = dict(row)
        for target, src in fields.items():
            row[target] = row.pop(src) if src != target else row[src]
        yield f"{spec} row {i}", row


def count_rows(path: Path) -> int:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def input_paths(specs) -> list[Path]:
    """The local files and directories behind input specs (data specs with a row slice, files, globs,
    run dirs); specs that name no local path (a Hugging Face dataset, a URL, a missing file) are skipped."""
    out = []
    for spec in specs:
        if spec is None:
            continue
        spec = str(spec)
        p = Path(spec).expanduser()
        if p.is_dir():
            out.append(p)
            continue
        try:
            out += data_files(split_slice(spec)[0])
        except ArpoError:
            continue
    return [p.resolve() for p in out]
