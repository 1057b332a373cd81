"""What `arpo view` shows, read on demand from run directories and rollout files.

A source is a training run directory (RUN_DIR/metrics.jsonl, RUN_DIR/rollouts/step_N.jsonl.gz and
rollouts/entropy.jsonl, written by training/rollout_log.py) or one rollouts file: a step file, or an
`arpo rollout` dump (one trajectory per line, grouped here into trees). Nothing is read up front: a
step's file is read when one of its pages or trees is asked for, and only its trees' summaries are
parsed for a page (each line starts with one; training/rollout_log.tree_summary), so a run of 1,000
steps × 64 trees opens as fast as a small one. The last few steps read stay cached.

Every answer is a plain dict, addressed by a path (`Catalog.get("runs/0/steps/3/page/0")`): the web
server serves these paths under /api/ and `--export` writes the same answers as files.

Broken input is reported, never fatal: a line that is not JSON (a half-written file, a cut gzip
stream) is skipped and named in the answer's `skipped` list.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from arpo.analysis.entropy import entropy_by_position
from arpo.errors import ArpoError
from arpo.eval.deep_search import WEB_TOOLS, trajectory_stats
from arpo.training.rollout_log import STEP_FILE, step_files, tree_summary

PAGE = 24  # trees per page of a step
CACHED_STEPS = 4
_SUMMARY_HEAD = '{"summary": '
_DECODER = json.JSONDecoder()


class NotFound(ArpoError):
    """A path that names no run, step, page or tree (the server answers 404)."""


@dataclass
class Source:
    name: str
    path: Path
    kind: str  # run (a training run directory) | file (one rollouts file)


def open_source(spec: str) -> Source:
    """`PATH` or `LABEL=PATH`: a run directory or a rollouts file (.jsonl / .jsonl.gz)."""
    label, _, raw = spec.rpartition("=") if "=" in spec and not Path(spec).exists() else ("", "", spec)
    p = Path(raw).expanduser()
    if not p.exists():
        raise ArpoError(f"{p} does not exist (give a run directory of `arpo train` or a rollouts .jsonl file)")
    if p.is_dir():
        if not (p / "metrics.jsonl").is_file() and not (p / "rollouts").is_dir():
            raise ArpoError(f"{p}: no metrics.jsonl and no rollouts/ (is it a run directory of `arpo train`?)")
        return Source(label or p.name, p, "run")
    if not (p.name.endswith(".jsonl") or p.name.endswith(".jsonl.gz")):
        raise ArpoError(f"{p}: not a .jsonl or .jsonl.gz rollouts file")
    return Source(label or p.name.split(".jsonl")[0], p, "file")


# ---- reading files ------------------------------------------------------------------------------
def read_lines(path: Path) -> tuple[list[tuple[int, str, bool]], list[str]]:
    """(line number, text, ended with a newline) of the non-blank lines, and problems found. A cut
    gzip stream keeps the lines before the cut."""
    opener = gzip.open if path.name.endswith(".gz") else open
    out, problems, data = [], [], ""
    try:
        with opener(path, "rb") as f:
            data = f.read().decode("utf-8", errors="replace")
    except (EOFError, zlib.error, OSError) as e:  # truncated or corrupt gzip: keep what decompressed
        data = _partial_gunzip(path)
        problems.append(f"{path.name}: compressed stream cut or corrupt ({e}); read what came before")
    lines = data.split("\n")
    for i, text in enumerate(lines, 1):
        if text.strip():
            out.append((i, text, i < len(lines)))
    return out, problems


def _partial_gunzip(path: Path) -> str:
    d = zlib.decompressobj(wbits=31)
    raw = path.read_bytes()
    try:
        return d.decompress(raw).decode("utf-8", errors="replace")
    except zlib.error:
        return ""


def _summary_of(text: str) -> dict:
    """The summary at the head of a tree line (parsed alone), else the whole line's."""
    if text.startswith(_SUMMARY_HEAD):
        return _DECODER.raw_decode(text, len(_SUMMARY_HEAD))[0]
    return tree_summary(json.loads(text))


def dump_to_trees(records: list[dict]) -> list[dict]:
    """`arpo rollout` dump records (one per trajectory, RolloutTree.to_records) as tree records of the
    training format: grouped by prompt, each trajectory's own tokens from its branch point on."""
    groups: OrderedDict[str, list[dict]] = OrderedDict()
    for r in records:
        groups.setdefault(str(r.get("prompt_id")), []).append(r)
    trees = []
    for k, (pid, rs) in enumerate(groups.items()):
        trajs = []
        for r in sorted(rs, key=lambda x: x.get("traj_id", 0)):
            start = r.get("branch_token_index") or 0
            n = len(r.get("response_token_ids") or r.get("loss_mask") or [])
            toks = r.get("tokens")
            trajs.append({
                "id": r.get("traj_id", 0), "parent": r.get("parent_id"), "branch_at": r.get("branch_token_index"),
                "reward": r.get("reward"), "correct": r.get("correct"), "answer": r.get("answer"),
                "format_error": r.get("format_error"), "finish_reason": r.get("finish_reason"), "n_tokens": n,
                "initial_entropy": r.get("initial_entropy"), "step_entropies": r.get("step_entropies") or [],
                "decisions": r.get("branch_decisions") or [], "tool_calls": r.get("tool_calls") or [],
                "start": start, "tokens": None if toks is None else toks[start:],
                "mask": (r.get("loss_mask") or [])[start:], "entropy": (r.get("entropies") or [])[start:],
                "logp": (r.get("logprobs") or [])[start:], "advantage": None,
                "text": None if toks is not None else r.get("text"),
            })
        rec = {"format": "arpo-rollout-dump", "step": 0, "index": k, "prompt_id": pid, "question": None, "gold": None,
               "task": None, "prompt": None, "trained": False, "trajectories": trajs}
        trees.append({"summary": tree_summary(rec), **rec})
    return trees


@dataclass
class StepData:
    """One step's trees: their raw lines (parsed when a tree is asked for) or, for a dump, the trees."""

    path: Path
    lines: list[str] = field(default_factory=list)
    summaries: list[dict] = field(default_factory=list)
    trees: list[dict] | None = None  # set for dumps (already parsed)
    skipped: list[str] = field(default_factory=list)

    def tree(self, i: int) -> dict:
        if self.trees is not None:
            return self.trees[i]
        return json.loads(self.lines[i])


def _is_dump(rows) -> bool:
    for _, text, _ in rows:
        try:
            row = json.loads(text)
        except json.JSONDecodeError:
            continue
        return isinstance(row, dict) and "traj_id" in row and "trajectories" not in row
    return False


def load_step(path: Path) -> StepData:
    rows, problems = read_lines(path)
    sd = StepData(path, skipped=problems)
    if rows and not rows[0][1].startswith(_SUMMARY_HEAD) and _is_dump(rows):  # an `arpo rollout` dump
        recs = []
        for n, text, _ in rows:
            try:
                recs.append(json.loads(text))
            except json.JSONDecodeError as e:
                sd.skipped.append(f"{path.name}:{n}: invalid JSON ({e.msg}), line skipped")
        sd.trees = dump_to_trees(recs)
        sd.summaries = [t["summary"] for t in sd.trees]
        return sd
    for n, text, ended in rows:
        try:
            if not ended:  # the last line without its newline: maybe cut while written, check it whole
                json.loads(text)
            summary = _summary_of(text)
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            sd.skipped.append(f"{path.name}:{n}: {getattr(e, 'msg', 'not a tree record')}, line skipped")
            continue
        summary["index"] = len(sd.lines)
        sd.lines.append(text)
        sd.summaries.append(summary)
    return sd


# ---- the catalog: every answer of the viewer -----------------------------------------------------
ROUTES = [
    (re.compile(r"^runs$"), "runs"),
    (re.compile(r"^runs/(\d+)/metrics$"), "metrics"),
    (re.compile(r"^runs/(\d+)/steps$"), "steps"),
    (re.compile(r"^runs/(\d+)/entropy$"), "run_entropy"),
    (re.compile(r"^runs/(\d+)/steps/(\d+)/page/(\d+)$"), "page"),
    (re.compile(r"^runs/(\d+)/steps/(\d+)/trees/(\d+)$"), "tree"),
    (re.compile(r"^runs/(\d+)/steps/(\d+)/entropy$"), "step_entropy"),
]


class Catalog:
    def __init__(self, specs: list[str]):
        if not specs:
            raise ArpoError("give at least one run directory or rollouts file")
        self.sources = [open_source(s) for s in specs]
        names = [s.name for s in self.sources]
        for s in self.sources:  # two runs called `arpo` in different folders: use parent/name
            if names.count(s.name) > 1 and s.kind == "run":
                s.name = f"{s.path.parent.name}/{s.path.name}"
        self._cache: OrderedDict[Path, tuple[tuple, StepData]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: str) -> dict:
        """The answer at `path` (see ROUTES); NotFound if it names nothing."""
        for pattern, name in ROUTES:
            m = pattern.match(path.strip("/"))
            if m:
                return getattr(self, name)(*[int(g) for g in m.groups()])
        raise NotFound(f"no such view data: {path}")

    # -- runs and their metrics
    def _src(self, r: int) -> Source:
        if not 0 <= r < len(self.sources):
            raise NotFound(f"no run {r} (there are {len(self.sources)})")
        return self.sources[r]

    def runs(self) -> dict:
        return {"runs": [{"id": i, "name": s.name, "path": str(s.path), "kind": s.kind, "config": self._config(s),
                          "saved_steps": len(self._step_files(s))} for i, s in enumerate(self.sources)],
                "page_size": PAGE}

    def _config(self, s: Source) -> dict:
        p = s.path / "config.yaml"
        if s.kind != "run" or not p.is_file():
            return {}

        try:
            c = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError:
            return {}
        pick = {"model": ("model", "name"), "preset": ("algo", "preset"), "attribution": ("algo", "attribution"),
                "group_size": ("rollout", "group_size"), "initial_rollouts": ("rollout", "initial_rollouts"),
                "steps": ("steps",), "prompts_per_step": ("prompts_per_step",)}
        out = {}
        for k, keys in pick.items():
            v = c
            for key in keys:
                v = v.get(key) if isinstance(v, dict) else None
            if v is not None:
                out[k] = v
        return out

    def metrics(self, r: int) -> dict:
        s = self._src(r)
        rows, skipped = [], []
        p = s.path / "metrics.jsonl"
        if s.kind == "run" and p.is_file():
            for n, text, _ in read_lines(p)[0]:
                try:
                    row = json.loads(text)
                except json.JSONDecodeError as e:
                    skipped.append(f"metrics.jsonl:{n}: invalid JSON ({e.msg}), line skipped")
                    continue
                if isinstance(row.get("trajectories"), (int, float)) and row["trajectories"]:
                    row["branch_rate"] = row.get("branches", 0) / row["trajectories"]
                rows.append({k: v if not isinstance(v, float) or math.isfinite(v) else None for k, v in row.items()})
        return {"run": r, "rows": rows, "skipped": skipped}

    # -- steps
    def _step_files(self, s: Source) -> dict[int, Path]:
        if s.kind == "file":
            m = STEP_FILE.match(s.path.name)
            return {int(m.group(1)) if m else 0: s.path}
        return step_files(s.path)

    def steps(self, r: int) -> dict:
        files = self._step_files(self._src(r))
        return {"run": r, "steps": [{"step": k, "bytes": p.stat().st_size} for k, p in files.items()]}

    def _step(self, r: int, step: int) -> StepData:
        files = self._step_files(self._src(r))
        if step not in files:
            raise NotFound(f"run {r} has no saved trees for step {step}")
        p = files[step]
        st = p.stat()
        key = (st.st_mtime_ns, st.st_size)
        with self._lock:
            hit = self._cache.get(p)
            if hit and hit[0] == key:
                self._cache.move_to_end(p)
                return hit[1]
        data = load_step(p)
        with self._lock:
            self._cache[p] = (key, data)
            while len(self._cache) > CACHED_STEPS:
                self._cache.popitem(last=False)
        return data

    def page(self, r: int, step: int, page: int) -> dict:
        sd = self._step(r, step)
        n = len(sd.summaries)
        pages = max(1, -(-n // PAGE))
        if page >= pages:
            raise NotFound(f"step {step} has {pages} page(s) of trees")
        return {"run": r, "step": step, "page": page, "pages": pages, "total": n, "page_size": PAGE,
                "trees": sd.summaries[page * PAGE : (page + 1) * PAGE], "skipped": sd.skipped}

    def tree(self, r: int, step: int, index: int) -> dict:
        sd = self._step(r, step)
        if index >= len(sd.summaries):
            raise NotFound(f"step {step} has {len(sd.summaries)} trees")
        t = dict(sd.tree(index))
        t.update(run=r, step=step, index=index, trees_in_step=len(sd.summaries), skipped=sd.skipped)
        if any(c.get("tool") in WEB_TOOLS for tr in t.get("trajectories") or [] for c in tr.get("tool_calls") or []):
            # deep search: per path, searches, pages read, supporting pages opened, the answer's page
            t["trajectories"] = [{**tr, "deep_search": trajectory_stats(tr.get("tool_calls") or [], tr.get("answer"),
                                                                        t.get("supporting"))}
                                 for tr in t["trajectories"]]
        return t

    # -- entropy after tool results (paper Fig. 1)
    def _profiles(self, s: Source) -> dict[int, dict]:
        p = s.path / "rollouts" / "entropy.jsonl"
        out = {}
        if s.kind == "run" and p.is_file():
            for _, text, _ in read_lines(p)[0]:
                try:
                    row = json.loads(text)
                    out[int(row["step"])] = row
                except (json.JSONDecodeError, KeyError, ValueError):
                    continue
        return out

    def step_entropy(self, r: int, step: int) -> dict:
        prof = self._profiles(self._src(r)).get(step)
        if prof is None:  # a file without the run's profile: compute it from the trees
            sd = self._step(r, step)
            recs = []
            for i in range(len(sd.summaries)):
                for t in sd.tree(i)["trajectories"]:
                    if t.get("parent") is None and t.get("start", 0) == 0:
                        recs.append({"entropies": t["entropy"], "loss_mask": t["mask"], "parent_id": None})
            prof = {"step": step, **entropy_by_position(recs)}
            prof["after_tool_by_call"] = {str(j): c for j, c in list(prof["after_tool_by_call"].items())[:3]}
        return {"run": r, "scope": "step", **{k: v for k, v in prof.items() if not k.endswith("first20_mean")}}

    def run_entropy(self, r: int) -> dict:
        """The saved steps' curves merged (position means weighted by their counts), and per step the
        mean entropy of the first 20 tokens at the response start and after tool results."""
        s = self._src(r)
        profs = self._profiles(s)
        if not profs and s.kind == "file":
            return {**self.step_entropy(r, next(iter(self._step_files(s)))), "scope": "run"}
        per_step = [{"step": k, "initial": _head(p["initial"], p["counts_initial"]),
                     "after_tool": _head(p["after_tool"], p["counts_after_tool"])} for k, p in sorted(profs.items())]
        window = max((p["window"] for p in profs.values()), default=50)
        return {"run": r, "scope": "run", "steps": len(profs), "window": window,
                "trajectories": sum(p["trajectories"] for p in profs.values()),
                "tool_results": sum(p["tool_results"] for p in profs.values()),
                "initial": _merge(profs.values(), "initial", "counts_initial", window),
                "after_tool": _merge(profs.values(), "after_tool", "counts_after_tool", window),
                "after_tool_by_call": {}, "per_step": per_step}


def _merge(profs, key: str, counts: str, window: int) -> list[float | None]:
    out = []
    for d in range(window):
        tot = n = 0.0
        for p in profs:
            if d < len(p[key]) and p[key][d] is not None:
                tot += p[key][d] * p[counts][d]
                n += p[counts][d]
        out.append(tot / n if n else None)
    return out


def _head(curve: list, counts: list, k: int = 20) -> float | None:
    pts = [(y, c) for y, c in zip(curve[:k], counts[:k], strict=True) if y is not None and c]
    return sum(y * c for y, c in pts) / sum(c for _, c in pts) if pts else None

