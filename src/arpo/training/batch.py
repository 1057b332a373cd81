"""A training batch of rollout trees, its log-probs under a model (tree-packed or flat), and the
backward pass through them in bounded memory.

    batch = TreeBatch.from_trees(trees, masks)                # layout: one row per trajectory
    old_logp, _ = token_logprobs(model, batch)                # no grad: the behaviour policy
    loss, diag = loss_and_backward(model, batch, loss_fn)     # grads accumulate in model params

`loss_and_backward` computes the loss on the flat (B, T) log-probs (so every loss and aggregation
of algos/losses.py applies as written), takes dL/d logp there, then re-runs the model one
micro-batch of packs at a time and back-propagates `Σ logp · dL/dlogp`: exact for any loss (the
loss depends on the parameters only through logp and entropy), with activation memory bounded by
one micro-batch instead of the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from arpo.training.packing import Pack, pack_trees, packed_token_logprobs, unpack
from arpo.training.tree_attention import use_tree_attention


@dataclass
class TreeBatch:
    trees: list[dict]  # {prompt, responses, parent, branch_at} (see packing.pack_trees)
    rows: dict[tuple[int, int], int]  # (tree, traj) -> row of the flat (B, T) tensors
    lengths: torch.Tensor  # (B,) response lengths
    # (B, T) float loss weights: 1 on generated tokens (1/d on a token d trajectories share, under hard
    # attribution), 0 on tool results / padding
    mask: torch.Tensor
    advantages: torch.Tensor | None = None  # (B, T)
    old_logp: torch.Tensor | None = None  # (B, T)
    ref_logp: torch.Tensor | None = None  # (B, T)
    extras: dict = field(default_factory=dict)

    @classmethod
    def from_trees(cls, trees: list[dict], masks: list[list[list[int]]]) -> TreeBatch:
        """masks[t][i]: loss mask of trajectory i of tree t: 1 on generated tokens, 0 on tool results.
        Required: a default of all ones trained the policy on tool output when a caller forgot it
        (`all_generated(trees)` says so explicitly for trees without tool results)."""
        rows: dict[tuple[int, int], int] = {}
        lengths: list[int] = []
        for ti, tr in enumerate(trees):
            for i, r in enumerate(tr["responses"]):
                rows[(ti, i)] = len(lengths)
                lengths.append(len(r))
        t_max = max(lengths, default=0)
        mask = torch.zeros(len(lengths), t_max)
        for (ti, i), row in rows.items():
            m = masks[ti][i]
            if len(m) != lengths[row]:
                raise ValueError(f"tree {ti} trajectory {i}: mask has {len(m)} entries for {lengths[row]} tokens")
            mask[row, : len(m)] = torch.tensor(m, dtype=torch.float32)
        return cls(trees=trees, rows=rows, lengths=torch.tensor(lengths, dtype=torch.long), mask=mask)

    @staticmethod
    def all_generated(trees: list[dict]) -> list[list[list[int]]]:
        """The masks of trees whose every response token was generated (no tool results in them)."""
        return [[[1] * len(r) for r in tr["responses"]] for tr in trees]

    @property
    def width(self) -> int:
        return self.mask.shape[1]

    def n_tokens(self, packed: bool) -> int:
        """Tokens the model must process for this batch: packed counts each shared token once."""
        if packed:
            return sum(len(t["prompt"]) + sum(len(r) - (b if p != -1 else 0)
                       for r, p, b in zip(t["responses"], t["parent"], t["branch_at"], strict=True))
                       for t in self.trees)
        return sum(len(t["prompt"]) * len(t["responses"]) + sum(len(r) for r in t["responses"]) for t in self.trees)

    def to(self, device) -> TreeBatch:
        """The batch's (B, T) tensors on `device` (e.g. the policy's GPU), in place; returns self.
        `lengths` stays on the CPU (it indexes Python-side layouts)."""
        for name in ("mask", "advantages", "old_logp", "ref_logp"):
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, t.to(device))
        return self

    def subset(self, tree_ids: list[int]) -> TreeBatch:
        """The batch restricted to some trees (a mini-batch), tensors sliced consistently."""
        keep_rows = [self.rows[(t, i)] for t in tree_ids for i in range(len(self.trees[t]["responses"]))]
        new_rows: dict[tuple[int, int], int] = {}
        for nt, t in enumerate(tree_ids):
            for i in range(len(self.trees[t]["responses"])):
                new_rows[(nt, i)] = len(new_rows)
        idx = torch.tensor(keep_rows, dtype=torch.long)
        width = int(self.lengths[idx].max()) if len(idx) else 0

        def sl(x):
            return None if x is None else x[idx.to(x.device), :width]

        return TreeBatch(trees=[self.trees[t] for t in tree_ids], rows=new_rows, lengths=self.lengths[idx],
                         mask=sl(self.mask), advantages=sl(self.advantages), old_logp=sl(self.old_logp),
                         ref_logp=sl(self.ref_logp))


def _micro_packs(batch: TreeBatch, packed: bool, max_tokens: int) -> list[list[Pack]]:
    """Packs grouped into micro-batches of about max_tokens model tokens each. The flat path is
    packing with every trajectory its own root (nothing shared)."""
    trees = batch.trees
    if not packed:
        trees = [{"prompt": t["prompt"], "responses": [r], "parent": [-1], "branch_at": [0]}
                 for t in batch.trees for r in t["responses"]]
    packs = pack_trees(trees, max_tokens=max_tokens if packed else None)
    if not packed:  # re-key members to the (tree, traj) of the original batch
        keys = [(ti, i) for ti, t in enumerate(batch.trees) for i in range(len(t["responses"]))]
        for p in packs:
            p.members = [keys[p.members[0][0]]]
    groups: list[list[Pack]] = []
    cur: list[Pack] = []
    n = 0
    for p in packs:
        if cur and n + p.n_tokens > max_tokens:
            groups.append(cur)
            cur, n = [], 0
        cur.append(p)
        n += p.n_tokens
    if cur:
        groups.append(cur)
    return groups


def token_logprobs(model, batch: TreeBatch, *, packed: bool = True, max_tokens: int = 4096,
                   with_entropy: bool = False, temperature: float = 1.0, chunk_size: int = 1024,
                   pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Flat (B, T) log-probs (and entropies) of every response token, without gradient."""
    lps, ens, all_packs = [], [], []
    with torch.no_grad():
        for group in _micro_packs(batch, packed, max_tokens):
            for (lp, en), p in zip(packed_token_logprobs(model, group, with_entropy=with_entropy,
                                                         chunk_size=chunk_size, temperature=temperature,
                                                         pad_id=pad_id), group, strict=True):
                lps.append(lp)
                ens.append(en)
                all_packs.append(p)
    dev = batch.mask.device  # results live where the batch lives (TreeBatch.to), whatever the model's device
    logp = unpack(all_packs, lps, batch.rows, batch.width).to(dev)
    ent = unpack(all_packs, ens, batch.rows, batch.width).to(dev) if with_entropy else None
    return logp, ent


def rollout_logprobs(batch: TreeBatch, values: dict[tuple[int, int], tuple[list[float], list[float]]]
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat (B, T) log-probs and entropies from what the rollout engine recorded while sampling:
    values[(tree, traj)] = (logprobs, entropies), one entry per response token (0 on tool results).
    Where the engine computed them exactly as token_logprobs would (full softmax(logits / T) of the
    same weights, no top-k/top-p), this replaces the behaviour policy's no-grad forward."""
    lp = torch.zeros(batch.mask.shape, dtype=torch.float32)
    ent = torch.zeros(batch.mask.shape, dtype=torch.float32)
    for key, row in batch.rows.items():
        lps, ents = values[key]
        n = int(batch.lengths[row])
        if len(lps) != n or len(ents) != n:
            raise ValueError(f"tree {key[0]} trajectory {key[1]}: {len(lps)} log-probs for {n} tokens")
        lp[row, :n] = torch.tensor(lps, dtype=torch.float32)
        ent[row, :n] = torch.tensor(ents, dtype=torch.float32)
    return lp.to(batch.mask.device), ent.to(batch.mask.device)


def loss_and_backward(model, batch: TreeBatch, loss_fn, *, packed: bool = True, max_tokens: int = 4096,
                      need_entropy: bool = False, temperature: float = 1.0, chunk_size: int = 1024,
                      pad_id: int = 0, current: tuple[torch.Tensor, torch.Tensor | None] | None = None,
                      scale: float = 1.0, record: torch.Tensor | None = None, linear: bool = False,
                      on_micro=None):
    """loss_fn(logp (B,T), entropy (B,T)|None) -> (loss, diagnostics). Accumulates
    scale · dloss/dθ into the parameters' .grad and returns (loss, diagnostics).

    `current`: the batch's log-probs (and entropies) under the current parameters when already
    known (e.g. on-policy, where they equal old_logp), saving the first forward.
    `record` (B, T): filled with the log-probs of the backward's own forward (the training forward),
    e.g. to compare with what the rollout engine recorded (train–inference mismatch).
    `linear`: loss_fn is linear in logp and ignores the entropy (SFT's NLL), so dL/dlogp is the same at
    any logp: it is taken at logp = 0, the no-grad forward is skipped (a quarter of an SFT step) and the
    loss is evaluated on the log-probs of the training forward itself.
    `on_micro(done, total)`: called with done=0 before the first micro-batch's forward, then after each
    micro-batch's backward (progress within a step: training/progress.py MicroBatches)."""
    if linear:
        if need_entropy or current is not None:
            raise ValueError("linear=True takes no `current` and no entropy")
        own = torch.zeros(batch.mask.shape, dtype=torch.float64, device=batch.mask.device)
        loss_and_backward(model, batch, loss_fn, packed=packed, max_tokens=max_tokens, temperature=temperature,
                          chunk_size=chunk_size, pad_id=pad_id, current=(torch.zeros_like(own), None), scale=scale,
                          record=own, on_micro=on_micro)
        if record is not None:
            record.copy_(own)
        loss, diag = loss_fn(own, None)
        return loss.detach(), diag
    if current is None:
        current = token_logprobs(model, batch, packed=packed, max_tokens=max_tokens, with_entropy=need_entropy,
                                 temperature=temperature, chunk_size=chunk_size, pad_id=pad_id)
    lp = current[0].detach().clone().requires_grad_(True)
    en = current[1].detach().clone().requires_grad_(True) if current[1] is not None else None
    loss, diag = loss_fn(lp, en)
    grads = torch.autograd.grad(loss * scale, [lp] + ([en] if en is not None else []), allow_unused=True)
    g_lp = grads[0] if grads[0] is not None else torch.zeros_like(lp)
    g_en = grads[1] if en is not None else None
    groups = list(_micro_packs(batch, packed, max_tokens))
    if on_micro is not None:
        on_micro(0, len(groups))
    for i, group in enumerate(groups, 1):
        with use_tree_attention(model):  # also for layers recomputed in the backward (activation checkpointing)
            _backward_group(model, batch, group, g_lp, g_en, chunk_size, temperature, pad_id, record)
        if on_micro is not None:
            on_micro(i, len(groups))
    return loss.detach(), diag


def _backward_group(model, batch, group, g_lp, g_en, chunk_size, temperature, pad_id, record) -> None:
    """Forward one micro-batch of packs with gradient and back-propagate Σ logp · dL/dlogp (+ entropy)."""
    outs = packed_token_logprobs(model, group, with_entropy=g_en is not None, chunk_size=chunk_size,
                                 temperature=temperature, pad_id=pad_id)
    terms = []
    for (plp, pen), p in zip(outs, group, strict=True):
        # a pair may belong to several rows (shared tokens): index_add sums their gradients
        g = torch.zeros_like(plp)
        ge = torch.zeros_like(pen) if (g_en is not None and pen is not None) else None
        for key, pi in zip(p.members, p.pair_index, strict=True):
            r, n = batch.rows[key], len(pi)
            pi = pi.to(plp.device)
            g.index_add_(0, pi, g_lp[r, :n].to(plp.device, plp.dtype))
            if record is not None:
                record[r, :n] = plp.detach()[pi].to(record.device, record.dtype)
            if ge is not None and g_en is not None:  # (g_en is set whenever ge is)
                ge.index_add_(0, pi, g_en[r, :n].to(pen.device, pen.dtype))
        terms.append((plp * g).sum())
        if ge is not None:
            terms.append((pen * ge).sum())
    if terms:
        torch.stack(terms).sum().backward()
