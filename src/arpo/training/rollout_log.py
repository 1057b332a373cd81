"""Training keeps its rollouts: a step's trees in RUN_DIR/rollouts/step_N.jsonl.gz, for `arpo view`.

One JSON line per tree (format `arpo-rollouts/1`, written atomically):

    {summary, format, step, index, prompt_id, question, gold, task, prompt, preset, attribution, trained,
     trajectories: [{id, parent, branch_at, reward, correct, answer, format_error, finish_reason,
                     n_tokens, initial_entropy, step_entropies, decisions, tool_calls,
                     start, tokens, mask, entropy, logp, advantage}]}

`summary` comes first (tree_summary: what a list of trees shows), so a reader can list a step's
trees without parsing their tokens. A trajectory stores only its *own* tokens, positions [start,
n_tokens) with start = branch_at (0 for a global sample): the tokens before a branch point are its
parent's (rollout/tree.py), so the viewer rebuilds a path from its ancestors and nothing is stored
twice. `tokens` are the decoded text pieces (their concatenation is the response text), `mask` 1 on
generated tokens and 0 on tool results, `entropy` the sampling policy's per-token entropy (nats),
`logp` the old log-probs the step trained with, `decisions` the ARPO branch decisions at its tool
results ({tool_call_index, delta_entropy, probability, branched}; one per result block: a pause with
several json tool calls appends one block, and the last of its `tool_calls` carries the block's
result_span), `advantage` the per-token advantage it trained with over the whole response (soft or
hard attribution, AEPO's entropy-aware scaling applied; null if the tree was not trained). Tool
outputs are cut to TOOL_OUTPUT_CHARS here (the full result is in the tokens).

RUN_DIR/rollouts/entropy.jsonl gets one line per saved step: the paper's Fig. 1 curves (entropy by
position after the response start and after tool results, analysis/entropy.py) over *all* the
step's trees, so the run-level figure never needs the tree files.

Size: about 7 bytes per stored token after gzip, all fields included (measured: 5.4 on a SmolLM2
run, 6.1 on the tiny test run, 6.9 on random synthetic values; tests/training/test_rollout_log.py
keeps it under 12), so a step costs ≈ 7 B × rollout_trees × (tokens of a tree, shared prefixes
once): 8 trees × 16 trajectories × 300 own tokens ≈ 270 KB, 1,000 such steps ≈ 270 MB.
`run.save_rollouts` (every k steps, 0: off) and `run.rollout_trees` (trees kept per step, 0: all)
bound it. Writing costs about 50 µs per stored token (mostly decoding token texts; measured with
SmolLM2's tokenizer on a busy 2-core machine), ≈ 2 s for that step. Under torchrun, rank 0 writes the
trees of its own slice of the prompts.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

from arpo.analysis.entropy import entropy_by_position

FORMAT = "arpo-rollouts/1"
TOOL_OUTPUT_CHARS = 2000
STEP_FILE = re.compile(r"^step_(\d+)\.jsonl(\.gz)?$")
_WINDOW = 4  # tokens of left context when decoding one token's text piece


def token_texts(tokenizer, ids: list[int]) -> list[str]:
    """The text piece of each token, so that ''.join(pieces) == decode(ids). A piece is decode(window +
    token) minus decode(window), with a few tokens of left context (byte-level BPE merges and leading
    spaces depend on it); a character whose bytes span several tokens belongs to the last of them.
    Three decodes per call."""
    if not ids:
        return []
    starts = [max(0, i - _WINDOW) for i in range(len(ids))]
    with_tok = tokenizer.batch_decode([ids[s : i + 1] for i, s in enumerate(starts)])
    without = tokenizer.batch_decode([ids[s:i] for i, s in enumerate(starts)])
    out = []
    for full, head in zip(with_tok, without, strict=True):
        # a character split over tokens decodes as U+FFFD until its last byte: its text goes with that token
        full, head = full.rstrip("\ufffd"), head.rstrip("\ufffd")
        out.append(full[len(head):] if full.startswith(head) else full[-1:] if full else "")
    # a response that ends inside a character decodes with a trailing U+FFFD: it belongs to the last token
    whole, joined = tokenizer.decode(ids), "".join(out)
    if whole.startswith(joined) and len(whole) > len(joined):
        out[-1] += whole[len(joined):]
    return out


def _r(xs, nd: int) -> list[float]:
    return [round(float(x), nd) + 0.0 for x in xs]  # + 0.0: no "-0.0" in the file


def trajectory_record(t, tokenizer) -> dict:
    """One TreeTrajectory as stored (see the module docstring): its own tokens, the advantages and
    old log-probs it trained with (keep_trained_values; else no advantage and the engine's log-probs)."""
    tr = t.traj
    start = t.branch_token_index or 0
    res = getattr(t, "result", None)
    advantage = None if t.advantages is None else t.advantages.detach().float().cpu().tolist()
    logp = tr.logprobs if t.old_logprobs is None else t.old_logprobs.detach().float().cpu().tolist()
    return {
        "id": t.traj_id, "parent": t.parent_id, "branch_at": t.branch_token_index, "reward": t.reward,
        "correct": None if res is None else bool(res.correct), "answer": None if res is None else res.answer,
        "format_error": None if res is None else res.format_error, "finish_reason": tr.finish_reason,
        "n_tokens": len(tr.response_ids), "initial_entropy": t.initial_entropy,
        "step_entropies": list(t.step_entropies), "decisions": list(t.branch_decisions),
        "tool_calls": [{"tool": c.tool, "input": c.input, "output": c.output[:TOOL_OUTPUT_CHARS], "ok": c.ok,
                        "elapsed_s": round(c.elapsed_s, 4), "result_span": list(c.result_span)}
                       for c in tr.tool_calls],
        "start": start,
        "tokens": token_texts(tokenizer, tr.response_ids[start:]),
        "mask": list(tr.loss_mask[start:]),
        "entropy": _r(tr.entropies[start:], 3),
        "logp": _r(logp[start : len(tr.response_ids)], 4),
        "advantage": None if advantage is None else _r(advantage[: len(tr.response_ids)], 4),
    }


def tree_record(tree, tokenizer, step: int, index: int, meta=None) -> dict:
    """One RolloutTree as one JSON-able dict."""
    ex = tree.example or {}
    gold = ex.get("answers", ex.get("answer"))
    trajs = [trajectory_record(t, tokenizer) for t in tree.trajectories]
    rec = {"format": FORMAT, "step": step, "index": index, "prompt_id": tree.prompt_id,
           "question": ex.get("question"), "gold": gold, "task": ex.get("task"),
           **({"supporting": ex["supporting"]} if ex.get("supporting") else {}),
           "prompt": tokenizer.decode(tree.prompt_ids), **(meta or {}),
           **({"policy_version": tree.policy_version} if tree.policy_version is not None else {}),
           "trained": all(t.advantages is not None for t in tree.trajectories), "trajectories": trajs}
    return {"summary": tree_summary(rec), **rec}


def tree_summary(rec: dict) -> dict:
    """What a list of trees shows: stored first on each line, so a reader lists a step's trees without
    parsing their tokens (json.JSONDecoder.raw_decode stops after it)."""
    trajs = rec["trajectories"]
    rewards = [t.get("reward") for t in trajs]
    return {"index": rec.get("index", 0), "prompt_id": rec.get("prompt_id"),
            "question": (rec.get("question") or "")[:200],
            "trajectories": len(trajs), "branches": sum(t.get("parent") is not None for t in trajs),
            "rewards": [None if r is None else round(r, 4) for r in rewards],
            "correct": sum(bool(t.get("correct")) for t in trajs),
            "tool_calls": sum(len(t.get("tool_calls") or []) for t in trajs),
            "tokens": sum(len(t.get("tokens") or []) for t in trajs)}


def keep_trained_values(trees, batch) -> None:
    """Give each trajectory of `trees` (the trees `batch` was built from, in order) views of the
    per-token advantages and old log-probs it trains with (no copy: read only if the step is saved)."""
    for ti, tree in enumerate(trees):
        for i, t in enumerate(tree.trajectories):
            row, n = batch.rows[(ti, i)], len(t.traj.response_ids)
            t.advantages = None if batch.advantages is None else batch.advantages[row, :n]
            t.old_logprobs = None if batch.old_logp is None else batch.old_logp[row, :n]


def entropy_profile(trees, window: int = 50) -> dict:
    """Fig. 1 curves over the trees' global samples (analysis/entropy.entropy_by_position)."""
    recs = [{"entropies": t.traj.entropies, "loss_mask": t.traj.loss_mask, "parent_id": t.parent_id}
            for tree in trees for t in tree.trajectories]
    s = entropy_by_position(recs, window)
    return {k: s[k] for k in ("trajectories", "tool_results", "window", "initial", "after_tool",
                              "counts_initial", "counts_after_tool")} | {
        "after_tool_by_call": {str(j): c for j, c in list(s["after_tool_by_call"].items())[:3]}}


def step_file(root: Path, step: int) -> Path:
    return Path(root) / f"step_{step}.jsonl.gz"


def write_gz_atomic(path: Path, lines: list[str]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=6) as f:
        for line in lines:
            f.write(line + "\n")
    os.replace(tmp, path)


class RolloutLog:
    """Writes RUN_DIR/rollouts/ during `arpo train`. every: save the trees every k steps (0: never);
    max_trees: trees kept per step (0: all). A fresh run clears old step files; a resumed one (from
    step k) drops those after k, like the metrics log."""

    def __init__(self, run_dir, every: int, max_trees: int, tokenizer, resume_step: int | None = None,
                 enabled: bool = True, meta: dict | None = None):
        self.root = Path(run_dir) / "rollouts"
        self.every, self.max_trees, self.tok, self.meta = every, max_trees, tokenizer, meta or {}
        self.enabled = enabled and every > 0
        if not enabled or not self.root.is_dir():
            return
        keep = resume_step or 0
        for step, p in step_files(run_dir).items():
            if step > keep:
                p.unlink()
        prof = self.root / "entropy.jsonl"
        if prof.is_file():
            kept = [x for x in prof.read_text().splitlines() if (s := _step_of(x)) is not None and s <= keep]
            prof.write_text("".join(x + "\n" for x in kept))

    def due(self, step: int) -> bool:
        return self.enabled and step % self.every == 0

    def write(self, step: int, trees) -> Path | None:
        """Save step `step`'s trees (the first max_trees of them) if it is due: the trees train_step
        returns, i.e. those that trained (DAPO's dynamic sampling has dropped uniform-reward groups)."""
        if not self.due(step) or not trees:
            return None
        self.root.mkdir(parents=True, exist_ok=True)
        keep = trees if not self.max_trees else trees[: self.max_trees]
        lines = [json.dumps(tree_record(tr, self.tok, step, i, self.meta), ensure_ascii=False)
                 for i, tr in enumerate(keep)]
        path = step_file(self.root, step)
        write_gz_atomic(path, lines)
        with open(self.root / "entropy.jsonl", "a") as f:
            f.write(json.dumps({"step": step, **entropy_profile(trees)}) + "\n")
        return path


def _step_of(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def step_files(run_dir: str | Path) -> dict[int, Path]:
    """The step files a run kept (RUN_DIR/rollouts/step_N.jsonl[.gz]), by step, in step order."""
    root = Path(run_dir) / "rollouts"
    if not root.is_dir():
        return {}
    return dict(sorted((int(m.group(1)), p) for p in root.iterdir() if (m := STEP_FILE.match(p.name))))


def read_run_trees(run_dir: str | Path) -> list[dict]:
    """Every tree record a run kept, in step order (each record carries its `step`)."""
    out = []
    for p in step_files(run_dir).values():
        opener = gzip.open if p.name.endswith(".gz") else open
        with opener(p, "rt") as f:
            out += [json.loads(line) for line in f if line.strip()]
    return out
