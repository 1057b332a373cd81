"""Entropy-based adaptive rollout (spec §2) — the ARPO branch rule, in one place.

Per prompt: start N global samples (`initial_rollouts`). For each, H_initial = entropy of its first
k generated tokens. After each tool result t, H_t = entropy of the first k tokens that follow it;
ΔH_t = H_t − H_initial; with α ~ U(0, 1), branch if  P_t = α + β·ΔH_t > τ,  i.e. with probability
clip(1 − τ + β·ΔH_t, 0, 1). A branch forks Z new partial trajectories right after the tool result
(the engine shares the KV cache: nothing is recomputed). Branching stops once M (`group_size`)
trajectories exist; if every path ends with fewer, fresh global samples fill the group up.

GRPO is this scheduler with N = M (the budget is full from the start: no branching).

`mode: reference` reproduces the reference code's rule, not the paper's:
  * timing: the decision at tool call t uses the entropy measured after the *previous* tool result
    (ΔH = 0 at the first call);
  * the rule: the reference code branches when U − β·ΔH ≤ τ (U ~ U(0,1)), i.e. with probability
    clip(τ + β·ΔH, 0, 1), where the paper's P = α + β·ΔH > τ gives clip(1 − τ + β·ΔH, 0, 1); the
    two agree only at τ = 0.5 (the default);
  * fill-up: once every path of a prompt has ended with fewer than M trajectories, one fresh global
    sample is added per round, and it may branch like any other (paper mode adds all M − n at once).
Pair it with `entropy_estimator: topk`, `entropy_reduction: sum`, `entropy_normalize: true` for its
numbers. The reference's stale per-batch-slot H_initial is a bug and is not reproduced: H_initial
always belongs to the trajectory. What the reference's slots do within one rollout is reproduced: a
fork gets a new slot, whose H_initial is the entropy of the fork's own first segment (the one after
the branch point), so a fork's first decision uses ΔH = 0 (paper mode: forks inherit H_initial).

AEPO options (spec §7): `dynamic_budget` picks N per prompt from a probe rollout's entropies (a
separate pass before the rollout; the probe is discarded, so exactly N globals start);
`consecutive_branch_penalty` scales the branch score α + β·ΔH by max(0, 1 − c·l), l = how many
consecutive rounds (tool-call depths) right before this one the prompt branched in (the AEPO code).

Randomness is keyed, not streamed (`rollout_key`): every global's and fork's sampling seed and every
branch decision's uniform is a hash of (seed, prompt index, what it is for, the trajectory's lineage,
the decision's index), so the order in which trajectories reach their decisions — the order in which
tool results arrive — cannot change them. With `agent.tool_delivery: step` (rollout/agent.py) that
order, and who shares a decode batch, are fixed too, and a seed gives the same trees on one machine
(docs/reproducibility.md).

Staged branch rules (`branch_rule: zscore | top_entropy | outcome_open`, rollout/staged_rules.py) do
not decide online: the N initial samples run to their end, then all their decision points are decided
at once (`_expand`), forks run without branching again, and fill-up globals complete the group.

`mode: tree_grpo` is Tree-GRPO's node expansion (Ji et al., arXiv 2509.21240, "Tree Search for LLM
Agent Reinforcement Learning"), entropy-blind: the N initial chains (`initial_rollouts`, Tree-GRPO's
M trees) run to their end; then, round after round while the group has fewer than M
(`group_size`) trajectories, each chain's tree (the chain and every branch grown from it) expands
`nodes_per_round` of its non-leaf nodes picked uniformly at random (pick_nodes) — a node is the
state right after one of the tree's tool results — by forking `branch_factor` continuations from
each (`_expand_nodes`); the branches run to their end and become expandable in the next round. The
group ends with exactly M trajectories (the last fork takes what room is left); a group with no tool
result to expand from fills up with fresh chains (`fill_up`). Pair it with the `tree_grpo`
advantage estimator (algos/advantages.py: intra-tree plus inter-tree GRPO), e.g. `algo.preset:
tree_grpo`. Its draws are keyed like the rest: a node's draw is a hash of (seed, prompt, NODE, round,
the chain's lineage, the result index), so a seed gives the same trees.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

from arpo.engine.base import Engine
from arpo.engine.rng import fold_key, key_seed, key_uniform
from arpo.errors import ArpoError
from arpo.rollout.agent import AgentLoop, TrajState
from arpo.rollout.branch_rules import BranchContext
from arpo.rollout.staged_rules import (
    DecisionPoint,
    GroupContext,
    branch_order,
    final_answer,
    open_shares,
)
from arpo.rollout.tree import RolloutTree, TreeTrajectory
from arpo.settings import AgentConfig, RolloutConfig, load_branch_rule
from arpo.tools.registry import ToolRegistry


# ---- the math, as pure functions ------------------------------------------------------------------
def segment_entropy(entropies: list[float], k: int, reduction: str, normalize: bool, vocab_size: int) -> float:
    """Entropy of a segment's first min(k, len) tokens (spec §2, 'Entropy definition')."""
    xs = entropies[:k]
    if not xs:
        return 0.0
    h = sum(xs) if reduction == "sum" else sum(xs) / len(xs)
    return h / math.log(vocab_size) if normalize else h


def _consecutive_rounds(branched_at: set[int], t: int) -> int:
    """AEPO's l for a decision in round t: how many rounds right before t (t − 1, t − 2, ...) this
    prompt branched in. A round is a tool-call depth: the AEPO code generates one segment per active
    trajectory per round, so round t holds every trajectory's decision after its t-th tool result; it
    counts a round once however many branches it made, and a round without one resets l to 0."""
    consec = 0
    while t - 1 - consec in branched_at:
        consec += 1
    return consec


def dynamic_initial_rollouts(m: int, h_root: float, h_tool: float) -> int:
    """AEPO (spec §7): N = clamp(int(M·σ(0.5·(H_root − H_tool))) + 1, 1, M)."""
    sig = 1.0 / (1.0 + math.exp(-0.5 * (h_root - h_tool)))
    return max(1, min(m, int(m * sig) + 1))


# what a keyed draw is for (rollout_key's `what`)
GLOBAL, PROBE, DECISION, FORK, NODE = 1, 2, 3, 4, 5


def rollout_key(seed: int, prompt: int, what: int, *path: int) -> int:
    """The 64-bit key of one random choice of a rollout: fold_key(seed, prompt, what, *path)
    (engine/rng.py), `prompt` the group's index in the step's prompt list. The keys:
      k-th global sample of the prompt (fill-ups continue k):   (GLOBAL, k)        -> its sampling seed
      AEPO's probe trajectory:                                   (PROBE,)           -> its sampling seed
      decision after tool result t of the trajectory L:         (DECISION, *L, t)  -> its uniform u
      j-th fork made by that decision:                          (FORK, *L, t, j)   -> its sampling seed
      tree_grpo mode: node (after result t of L) in round r:     (NODE, r, *L, t)   -> its uniform (pick_nodes)
    where L, the lineage, is (k,) for the k-th global and L + (t, j) for that fork. A decision
    branches iff u < P (rollout/branch_rules.py), u = key_uniform(key); a seed is key_seed(key)."""
    return fold_key(seed, prompt, what, *path)


def pick_nodes(draws: list[float], n: int) -> list[int]:
    """Tree-GRPO's node sampling: the indices of n of the nodes, uniformly without replacement, as the
    n smallest of their keyed uniform draws (ties: lower index), in that order. [0.7, 0.2, 0.9, 0.4], 2 -> [1, 3]."""
    return sorted(range(len(draws)), key=lambda i: (draws[i], i))[:max(0, n)]


def _calls_through_result(calls, t: int) -> int:
    """How many call records belong up to tool result t (a json turn's several calls share one result
    block, held by the turn's last record; the others have an empty span)."""
    seen = 0
    for i, rec in enumerate(calls):
        if rec.result_span[1] > 0:
            if seen == t:
                return i + 1
            seen += 1
    return len(calls)


def _result_blocks(calls) -> list[str]:
    """One string per tool result: the calls (tool and input) whose results it holds (staged rules'
    siblings: samples that made the same calls, open_shares)."""
    out, lo = [], 0
    for t in range(sum(rec.result_span[1] > 0 for rec in calls)):
        hi = _calls_through_result(calls, t)
        out.append("\x1f".join(f"{rec.tool}\x1e{rec.input}" for rec in calls[lo:hi]))
        lo = hi
    return out


# ---- the scheduler -------------------------------------------------------------------------------
@dataclass
class _Traj(TrajState):
    group: int = 0
    parent_sid: int | None = None
    branch_token_index: int | None = None
    initial_entropy: float | None = None
    initial_from: int | None = None  # reference-mode fork: H_initial := step_entropies[initial_from] (own 1st segment)
    step_entropies: list[float] = field(default_factory=list)
    decided: int = 0  # tool results whose branch decision is done (or inherited)
    lineage: tuple[int, ...] = ()  # (k,) for the k-th global; a fork: its parent's + (t, j) (rollout_key)
    decisions: list[dict] = field(default_factory=list)


@dataclass
class _Group:
    prompt: list[int]
    seed: int  # the rollout's seed and the prompt's index: the first two parts of every rollout_key
    index: int
    sids: list[int] = field(default_factory=list)
    n_globals: int = 0  # global samples started so far (the k of the next one's key)
    target_globals: int = 0
    branched_at: set[int] = field(default_factory=set)  # tool-call depths t at which this prompt branched
    expanded: bool = False  # staged rules: the initial samples' decision points were decided
    points: list[tuple[int, int, int, float]] = field(default_factory=list)  # staged: (sid, t, start, ΔH)
    rounds: int = 0  # tree_grpo mode: expansion rounds so far
    node_forks: dict[tuple[int, int], int] = field(default_factory=dict)  # tree_grpo: forks made from (sid, t)
    example: dict | None = None  # the prompt's example, for tools that play its task (an environment)


def _h_initial(sid: int, st: _Traj) -> float:
    """H_initial, which is recorded before any H_t (from the first segment, or a reference-mode
    fork's inherited H_t); an error if a decision asks for it earlier."""
    if st.initial_entropy is None:
        raise RuntimeError(f"trajectory {sid}: a branch decision needs H_initial, which is not recorded yet")
    return st.initial_entropy


def _generated_run(ents: list[float], mask: list[int], start: int, k: int) -> list[float]:
    """Entropies of up to k generated tokens from `start`, stopping at the next tool result."""
    out = []
    for e, m in zip(ents[start : start + k], mask[start : start + k], strict=True):
        if not m:
            break
        out.append(e)
    return out


class ARPORollout:
    def __init__(self, engine: Engine, tools: ToolRegistry, agent: AgentConfig | None = None,
                 cfg: RolloutConfig | None = None):
        self.cfg = (cfg or RolloutConfig()).with_defaults()  # AEPO's options unset: off (arpo train sets the preset's)
        self.cfg.validate()
        if self.cfg.entropy_estimator == "topk" and engine.topk_entropy == 0:
            # the engine records no top-k entropies: every H would be measured on an empty segment
            raise ArpoError("rollout.entropy_estimator: topk, but the engine records no top-k entropies "
                            "(engine option topk_entropy: 0); set topk_entropy >= 1 (e.g. 10) or use "
                            "entropy_estimator: full")
        self.loop = AgentLoop(engine, tools, agent)
        self.engine = engine
        self.vocab = len(engine.tokenizer)
        # staged: it decides once the initial samples finished (rollout/staged_rules.py)
        self.rule, self.staged = load_branch_rule(self.cfg.branch_rule, self.cfg.mode, self.cfg.penalty)
        self.nodes = self.cfg.mode == "tree_grpo"  # Tree-GRPO's random node expansion instead of entropy decisions

    def run(self, prompts: list[list[int]], prompt_ids: list[str] | None = None, seed: int | None = None,
            group_offset: int = 0, examples: list[dict] | None = None, on_step=None) -> list[RolloutTree]:
        """One tree per prompt. Group i keys its randomness with (seed, group_offset + i) (rollout_key),
        so a rank that rolls out prompts[k:] of a step's list with group_offset=k gets the trees the
        whole list gives for them (a distributed step does not depend on the number of ranks).
        `on_step(outs, states)`: called after each engine step, once this rollout took its decisions
        (arpo train's heartbeat within the generation: training/progress.py generation_beat)."""
        c = self.cfg
        base = c.seed if seed is None else seed
        groups = [_Group(p, int(base), group_offset + i) for i, p in enumerate(prompts)]
        for g, ex in zip(groups, examples or [], strict=False):  # envs: each trajectory plays its example
            g.example = ex
        budgets: list[dict | None] = list(self._probe(groups)) if c.dynamic_budget else [None] * len(groups)
        states: dict[int, _Traj] = {}
        for gi, g in enumerate(groups):
            budget = budgets[gi]
            g.target_globals = c.initial_rollouts if budget is None else budget["initial_rollouts"]
            for _ in range(g.target_globals):
                self._add_global(gi, g, states)
        try:
            def step(outs, st) -> None:
                self._on_step(outs, st, groups)
                if on_step is not None:
                    on_step(outs, st)

            self.loop.drive(states, on_step=step)
        finally:  # python sessions end with their trajectories (also when the rollout raised)
            self.loop.tools.end_sessions(list(states))
        trees = []
        for gi, g in enumerate(groups):
            trees.append(self._tree(gi, g, states, None if prompt_ids is None else prompt_ids[gi]))
            trees[-1].budget = budgets[gi]
            for sid in g.sids:
                self.engine.release(sid)
        return trees

    def _probe(self, groups: list[_Group]) -> list[dict]:
        """AEPO's dynamic budget (spec §7), in a pass of its own before the rollout, as the AEPO code
        does: one probe trajectory per prompt runs to its end without branching; H_root = its initial
        entropy, H_tool = the mean of its post-tool-result entropies (H_root when it made no call);
        N = dynamic_initial_rollouts(M, H_root, H_tool). The probe is then discarded, so exactly N
        global samples start (the probe is not one of them and never uses the branch budget); its
        seed has a key of its own (PROBE), so the globals' seeds do not depend on whether it ran.
        Returns one {h_root, h_tool, initial_rollouts, tool_calls} per group: tool_calls are the
        calls the probe ran, which count in the step's tool_calls_issued (training/rollout_metrics.py)."""
        c = self.cfg
        states: dict[int, _Traj] = {}
        sids = []
        for gi, g in enumerate(groups):
            sids.append(self._start(gi, g, states, rollout_key(g.seed, g.index, PROBE), ()))

        def on_step(outs, st) -> None:
            for sid in {o.sid for o in outs if o.sid in st}:
                self._record_entropies(sid, st[sid])

        try:
            self.loop.drive(states, on_step=on_step)
        finally:
            self.loop.tools.end_sessions(list(states))
        out = []
        for sid in sids:
            st = states[sid]
            h_root = st.initial_entropy or 0.0
            h_tool = sum(st.step_entropies) / len(st.step_entropies) if st.step_entropies else h_root
            out.append({"h_root": h_root, "h_tool": h_tool,
                        "initial_rollouts": dynamic_initial_rollouts(c.group_size, h_root, h_tool),
                        "tool_calls": len(st.calls)})
            self.engine.release(sid)
        return out

    def _add_global(self, gi: int, g: _Group, states) -> None:
        k = g.n_globals
        g.n_globals += 1
        g.sids.append(self._start(gi, g, states, rollout_key(g.seed, g.index, GLOBAL, k), (k,)))

    def _start(self, gi: int, g: _Group, states, key: int, lineage: tuple[int, ...]) -> int:
        sid = self.engine.add(g.prompt, self.loop.params(len(g.prompt), key_seed(key)))
        states[sid] = _Traj(seg_start=len(g.prompt), group=gi, lineage=lineage)
        if g.example is not None:
            self.loop.tools.bind_sessions({sid: g.example})
        return sid

    def _entropies(self, sid: int) -> list[float]:
        s = self.engine.seq(sid)
        return s.topk_entropies if self.cfg.entropy_estimator == "topk" else s.entropies

    def _h(self, xs: list[float]) -> float:
        c = self.cfg
        return segment_entropy(xs, c.entropy_tokens, c.entropy_reduction, c.entropy_normalize, self.vocab)

    def _on_step(self, outs, states, groups) -> None:
        for sid in {o.sid for o in outs if o.sid in states}:
            self._measure(sid, states[sid], states, groups)
        for gi, g in enumerate(groups):
            if self.staged and not g.expanded and self._all_finished(g):
                self._expand(g, states, groups)
            if self.nodes and self._all_finished(g):
                self._expand_nodes(g, states)
            if self._all_finished(g):
                self._refill(gi, g, states)

    def _all_finished(self, g: _Group) -> bool:
        return all(self.engine.seq(s).status == "finished" for s in g.sids)

    def _measure(self, sid: int, st: _Traj, states, groups) -> None:
        """Record H_initial / H_t once k tokens (or the whole segment) follow the start / a tool result;
        take the branch decision that goes with it."""
        c = self.cfg
        starts, n_results = self._record_entropies(sid, st)
        # decisions: paper mode decides at result t with H_t; reference mode with H_{t-1} (0 at t=0)
        while st.decided < n_results:
            t = st.decided
            if c.mode == "paper":
                if t >= len(st.step_entropies):
                    break
                dh = st.step_entropies[t] - _h_initial(sid, st)
            else:
                if t > 0 and t - 1 >= len(st.step_entropies):
                    break
                dh = 0.0 if t == 0 else st.step_entropies[t - 1] - _h_initial(sid, st)
            st.decided += 1
            self._decide(sid, st, t, starts[t + 1], dh, states, groups[st.group])

    def _record_entropies(self, sid: int, st: _Traj) -> tuple[list[int], int]:
        """Record H_initial and the H_t that are complete; returns the response index where each
        segment starts (0, then after each tool result) and the number of tool results."""
        c, s = self.cfg, self.engine.seq(sid)
        ended = s.status != "running"
        ents = self._entropies(sid)
        starts = [0] + [rec.result_span[1] for rec in st.calls if rec.result_span[1] > 0]
        n_results = len(starts) - 1
        if st.initial_entropy is None and st.initial_from is None:
            seg = _generated_run(ents, s.gen_mask, 0, c.entropy_tokens)
            if len(seg) >= c.entropy_tokens or ended or n_results:
                st.initial_entropy = self._h(seg)
        r = len(st.step_entropies)
        if r < n_results:
            seg = _generated_run(ents, s.gen_mask, starts[r + 1], c.entropy_tokens)
            if len(seg) >= c.entropy_tokens or (seg and (ended or n_results > r + 1)):
                st.step_entropies.append(self._h(seg))
        if st.initial_entropy is None and st.initial_from is not None and len(st.step_entropies) > st.initial_from:
            st.initial_entropy = st.step_entropies[st.initial_from]  # so its first decision has ΔH = 0
        return starts, n_results

    def _decide(self, sid, st: _Traj, t: int, start: int, dh: float, states, g: _Group) -> None:
        c = self.cfg
        if self.nodes:  # tree_grpo: no decision at a tool result; nodes are expanded once the group finished
            return
        if self.staged:  # an initial sample's point waits for the stage; later ones are not decision points
            if not g.expanded:
                g.points.append((sid, t, start, dh))
            return
        room = c.group_size - len(g.sids)
        if room <= 0:
            return  # branching stops once M trajectories exist
        consec = _consecutive_rounds(g.branched_at, t)
        ctx = BranchContext(dh, c.entropy_weight, c.branch_threshold, depth=t, consecutive=consec,
                            penalty=c.penalty, initial_entropy=st.initial_entropy,
                            step_entropy=st.step_entropies[t] if t < len(st.step_entropies) else None)
        p = float(self.rule(ctx))
        if not 0.0 <= p <= 1.0:  # also NaN
            raise ArpoError(f"rollout.branch_rule {c.branch_rule!r} returned {p}, not a probability in [0, 1]")
        branched = key_uniform(rollout_key(g.seed, g.index, DECISION, *st.lineage, t)) < p
        st.decisions.append({"tool_call_index": t, "probability": round(p, 6), "delta_entropy": round(dh, 6),
                             "branched": branched, "consecutive": consec})
        if not branched:
            return
        self._fork(sid, st, t, start, min(c.branch_factor, room), states, g)

    def _fork(self, sid, st: _Traj, t: int, start: int, n: int, states, g: _Group, first: int = 0) -> None:
        """n forks of trajectory `sid` right after its tool result t (response index `start`), numbered
        j = first, ..., first + n − 1 (a node expanded again continues the numbering: new keys)."""
        c = self.cfg
        g.branched_at.add(t)
        at = self.engine.seq(sid).prompt_len + start
        js = range(first, first + n)
        seeds = [key_seed(rollout_key(g.seed, g.index, FORK, *st.lineage, t, j)) for j in js]
        for j, k in zip(js, self.engine.fork(sid, n, at=at, seeds=seeds), strict=True):
            # the tools' sessions fork with the sequence (same event, any engine)
            self.loop.tools.fork_sessions(sid, k, st.calls[: _calls_through_result(st.calls, t)])
            # paper: a fork inherits H_initial; reference: the code keys H_initial by batch slot and a
            # fork's new slot takes its first own segment's entropy, so its first decision has ΔH = 0
            ref = c.mode == "reference"
            states[k] = _Traj(
                seg_start=at, calls=copy.deepcopy(st.calls[: _calls_through_result(st.calls, t)]), group=st.group,
                parent_sid=sid,
                branch_token_index=start, initial_entropy=None if ref else st.initial_entropy,
                initial_from=t if ref else None,
                step_entropies=list(st.step_entropies[:t]), decided=t + 1, lineage=st.lineage + (t, j),
            )
            g.sids.append(k)

    def _expand(self, g: _Group, states, groups) -> None:
        """A staged rule's stage (rollout/staged_rules.py): every initial sample of the group has
        finished; take all their decision points' branch decisions at once and fork the branched ones,
        highest P first (branch_order), while the group has room."""
        c = self.cfg
        for sid in list(g.sids):  # every decision point measured (a finished sample's last ones included)
            st = states[sid]
            while True:
                before = (len(st.step_entropies), st.decided, len(g.points))
                self._measure(sid, st, states, groups)
                if (len(st.step_entropies), st.decided, len(g.points)) == before:
                    break
        g.expanded = True
        order = {sid: i for i, sid in enumerate(g.sids)}
        paths = [_result_blocks(states[sid].calls) for sid in g.sids]
        answers = [final_answer(self.loop.tok.decode(self.engine.seq(sid).response), states[sid].finish_reason or "")
                   for sid in g.sids]
        shares = open_shares(paths, answers)
        pts = sorted(g.points, key=lambda p: (order[p[0]], p[1]))
        points = [DecisionPoint(dh, t, rollout_key(g.seed, g.index, DECISION, *states[sid].lineage, t),
                                shares[order[sid]][t] if t < len(shares[order[sid]]) else 0.0)
                  for sid, t, _, dh in pts]
        room = c.group_size - len(g.sids)
        probs = [float(p) for p in self.rule(points, GroupContext(c.entropy_weight, c.branch_threshold,
                                                                  math.ceil(max(0, room) / c.branch_factor)))]
        if len(probs) != len(points) or not all(0.0 <= p <= 1.0 for p in probs):
            raise ArpoError(f"rollout.branch_rule {c.branch_rule!r} returned {probs} for {len(points)} decision "
                            "points: one probability in [0, 1] per point")
        forked = set()
        for i in branch_order(points, probs):
            if room > 0 and key_uniform(points[i].key) < probs[i]:
                sid, t, start, _ = pts[i]
                n = min(c.branch_factor, room)
                self._fork(sid, states[sid], t, start, n, states, g)
                room -= n
                forked.add(i)
        for i, (sid, t, _, dh) in enumerate(pts):
            states[sid].decisions.append({"tool_call_index": t, "probability": round(probs[i], 6),
                                          "delta_entropy": round(dh, 6), "branched": i in forked, "consecutive": 0,
                                          "open_share": round(points[i].open_share, 6)})

    def _expand_nodes(self, g: _Group, states) -> None:
        """tree_grpo mode, one round (module docstring): every trajectory of the group has finished;
        each chain's tree forks `branch_factor` continuations from each of `nodes_per_round` of its
        nodes (pick_nodes), chains in the order they started, while the group has room."""
        c = self.cfg
        room = c.group_size - len(g.sids)
        if room <= 0:
            return
        trees: dict[int, list[tuple[int, int, int]]] = {}  # chain -> its nodes: (sid, result t, response index)
        for sid in g.sids:
            st = states[sid]
            own = st.branch_token_index or 0  # results before a branch point are its parent's nodes
            ends = [rec.result_span[1] for rec in st.calls if rec.result_span[1] > 0]
            trees.setdefault(st.lineage[0], []).extend((sid, t, e) for t, e in enumerate(ends) if e > own)
        for chain in sorted(trees):
            nodes = trees[chain]
            draws = [key_uniform(rollout_key(g.seed, g.index, NODE, g.rounds, *states[sid].lineage, t))
                     for sid, t, _ in nodes]
            for i in pick_nodes(draws, c.nodes_per_round):
                if room <= 0:
                    break
                sid, t, start = nodes[i]
                n = min(c.branch_factor, room)
                first = g.node_forks.get((sid, t), 0)
                self._fork(sid, states[sid], t, start, n, states, g, first=first)
                g.node_forks[(sid, t)] = first + n
                room -= n
        g.rounds += 1

    def _refill(self, gi: int, g: _Group, states) -> None:
        """All paths of this prompt ended: fill the group up to M with fresh global samples (spec §2, step 4)."""
        c = self.cfg
        if not c.fill_up:
            n_new = 0
        else:  # reference: one fresh global per round (it may branch); paper: all M − n at once
            n_new = min(1, c.group_size - len(g.sids)) if c.mode == "reference" else c.group_size - len(g.sids)
        for _ in range(max(0, n_new)):
            self._add_global(gi, g, states)

    def _tree(self, gi: int, g: _Group, states, prompt_id) -> RolloutTree:
        index = {sid: i for i, sid in enumerate(g.sids)}
        out = []
        for i, sid in enumerate(g.sids):
            st = states[sid]
            out.append(TreeTrajectory(
                traj=self.loop.trajectory(sid, st), traj_id=i,
                parent_id=None if st.parent_sid is None else index[st.parent_sid],
                branch_token_index=st.branch_token_index, initial_entropy=st.initial_entropy,
                step_entropies=list(st.step_entropies), branch_decisions=list(st.decisions),
            ))
        return RolloutTree(prompt_id=str(gi) if prompt_id is None else prompt_id, prompt_ids=g.prompt, trajectories=out)
