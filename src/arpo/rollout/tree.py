"""The rollout tree of one prompt: what flows from rollout to reward to advantage to loss.

Each trajectory is a root-to-leaf path: the prompt, then response tokens. A branch (fork) shares its
parent's response tokens up to `branch_token_index` (just after a tool result, spec §2) and continues
on its own. Tokens carry id, loss mask (1 generated, 0 tool result), the sampling policy's log-prob
and entropy. `nodes()` splits the tree into segments shared by a set of trajectories, which is what
hard attribution (spec §3) and tree-packed training reduce over.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from arpo.rewards import RewardResult
from arpo.rollout.agent import Trajectory


@dataclass
class TreeTrajectory:
    traj: Trajectory
    traj_id: int  # index within its prompt's tree
    parent_id: int | None  # None for a global sample
    branch_token_index: int | None  # index into the parent's response tokens where this one diverges
    initial_entropy: float | None = None  # H_initial (inherited by forks)
    step_entropies: list[float] = field(default_factory=list)  # H_t, one per tool result
    # {tool_call_index, delta_entropy, probability, branched}, one per tool call
    branch_decisions: list[dict] = field(default_factory=list)
    reward: float | None = None
    result: RewardResult | None = None  # the reward's full result (set with `reward` by rewards.score_trees)
    # what its tokens weigh in the loss: 0 drops the trajectory from the loss (DAPO's overlong filter,
    # reward.overlong_filter: set by rewards.score_trees); its reward still counts in its group's baseline
    loss_weight: float = 1.0
    # what the policy update trained this trajectory with, per response token (views into the step's
    # batch; set by training/rollout_log.keep_trained_values, read when RUN_DIR/rollouts is written)
    advantages: object = None  # (T,) tensor: soft/hard attribution, AEPO's entropy scaling applied
    old_logprobs: object = None  # (T,) tensor: the behaviour policy's log-probs


@dataclass
class Node:
    """A maximal run of response positions [start, end) shared by exactly the trajectories `members`
    (its owner's tokens); `parent` is the node that precedes it (None: it follows the prompt)."""

    owner: int
    start: int
    end: int
    members: tuple[int, ...]
    parent: int | None


@dataclass
class RolloutTree:
    prompt_id: str
    prompt_ids: list[int]
    trajectories: list[TreeTrajectory]
    example: dict | None = None  # the dataset row (question, answers, task)
    budget: dict | None = None  # AEPO dynamic budget: {h_root, h_tool, initial_rollouts} of the probe pass
    # the policy version (updates applied) whose weights generated every token of the tree; set by the
    # off-policy pipeline (training/pipeline.py), None in a synchronous run
    policy_version: int | None = None

    def __len__(self) -> int:
        return len(self.trajectories)

    @property
    def parents(self) -> list[int]:
        return [-1 if t.parent_id is None else t.parent_id for t in self.trajectories]

    @property
    def branch_at(self) -> list[int]:
        return [0 if t.branch_token_index is None else t.branch_token_index for t in self.trajectories]

    def shared_with(self, i: int, pos: int) -> set[int]:
        """Trajectories whose response token at `pos` is the same tree token as trajectory i's."""
        # climb to the trajectory that generated this token
        owner = i
        while (parent := self.trajectories[owner].parent_id) is not None and pos < self.branch_at[owner]:
            owner = parent
        members = {owner}
        changed = True
        while changed:  # every descendant that forked at or after pos shares it
            changed = False
            for j, t in enumerate(self.trajectories):
                if j not in members and t.parent_id in members and pos < self.branch_at[j]:
                    members.add(j)
                    changed = True
        return members

    def nodes(self) -> list[Node]:
        """Split every trajectory at the fork points inside its own tokens; each piece is a node."""
        out: list[Node] = []
        node_of_end: dict[tuple[int, int], int] = {}
        order = sorted(range(len(self)), key=lambda i: self._depth(i))
        for i in order:
            t = self.trajectories[i]
            own_start = self.branch_at[i]
            cuts = sorted({self.branch_at[j] for j, c in enumerate(self.trajectories) if self._forks_from(j, i)})
            n = len(t.traj.response_ids)
            bounds = [own_start] + [c for c in cuts if own_start < c < n] + [n]
            prev, anc = None, t.parent_id
            while anc is not None and own_start > 0:  # the node that ends where this one starts
                if (anc, own_start) in node_of_end:
                    prev = node_of_end[(anc, own_start)]
                    break
                anc = self.trajectories[anc].parent_id
            for a, b in zip(bounds, bounds[1:], strict=False):  # consecutive bounds: one span each
                if a == b:
                    continue
                members = tuple(sorted(self.shared_with(i, a)))
                out.append(Node(owner=i, start=a, end=b, members=members, parent=prev))
                prev = len(out) - 1
                node_of_end[(i, b)] = prev
        return out

    def validate(self) -> None:
        """Structural invariants; raises AssertionError naming the broken one."""
        for i, t in enumerate(self.trajectories):
            assert t.traj_id == i, f"traj_id {t.traj_id} at position {i}"
            if t.parent_id is None:
                assert t.branch_token_index is None, f"global sample {i} has a branch point"
                continue
            p = self.trajectories[t.parent_id]
            b = t.branch_token_index
            assert b is not None, f"trajectory {i} has a parent but no branch point"
            assert t.parent_id < i, f"trajectory {i} forked from a later one"
            assert p.traj.response_ids[:b] == t.traj.response_ids[:b], \
                f"trajectory {i} differs from its parent before {b}"
            assert b >= self.branch_at[t.parent_id], f"trajectory {i} forks inside tokens its parent inherited"

    def _forks_from(self, j: int, i: int) -> bool:
        return self.trajectories[j].parent_id == i

    def _depth(self, i: int) -> int:
        d = 0
        while (parent := self.trajectories[i].parent_id) is not None:
            i = parent
            d += 1
        return d

    def to_training(self) -> tuple[dict, list[list[int]]]:
        """The tree as training/packing.py takes it, and each trajectory's loss mask."""
        tree = {"prompt": list(self.prompt_ids), "responses": [list(t.traj.response_ids) for t in self.trajectories],
                "parent": self.parents, "branch_at": self.branch_at}
        return tree, [list(t.traj.loss_mask) for t in self.trajectories]

    def to_records(self) -> list[dict]:
        """One JSON-able dict per trajectory: the `arpo rollout` dump format."""
        recs = []
        for t in self.trajectories:
            d = t.traj.to_dict()
            recs.append({
                "prompt_id": self.prompt_id,
                "traj_id": t.traj_id,
                "parent_id": t.parent_id,
                "branch_token_index": t.branch_token_index,
                "response_token_ids": t.traj.response_ids,
                "loss_mask": t.traj.loss_mask,
                "logprobs": [round(x, 5) for x in t.traj.logprobs],
                "entropies": [round(x, 5) for x in t.traj.entropies],
                "text": d["text"],
                "tool_calls": d["tool_calls"],
                "initial_entropy": t.initial_entropy,
                "step_entropies": t.step_entropies,
                "branch_decisions": t.branch_decisions,
                "finish_reason": t.traj.finish_reason,
                "n_generated_tokens": d["n_generated_tokens"],
                **({"reward": t.reward} if t.reward is not None else {}),
                **({"format_error": t.result.format_error, "answer": t.result.answer, "correct": t.result.correct}
                   if t.result is not None else {}),
            })
        return recs
