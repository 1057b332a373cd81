"""Tree packing: every token of a rollout tree is computed once, in training as in generation.

An ARPO tree's M trajectories share the prompt and everything before each branch point. The flat
way to train on them pads M sequences `prompt + response_i` and runs the model over all of them,
recomputing every shared token once per sharer. Packing lays the tree out as one sequence

    [prompt][own tokens of traj 0][own tokens of traj 1]...

(each trajectory's *own* tokens are those after its branch point), with a tree attention mask: a
token attends to the prompt and to its own ancestors only, and its position id is its depth
(prompt length + index in the response), so each packed token sees exactly the context it had in
its trajectory and gets exactly the hidden state the flat forward would give it.

Log-probs are per *(context, next token)* pair, not per packed position: at a branch point the
last shared token predicts the parent's next token and the branch's next token, two pairs on one
hidden state. A pack lists its unique pairs; `pair_index[i][t]` maps token t of trajectory i to its
pair, so per-trajectory (flat) log-probs are a gather, and any loss written for flat (B, T)
tensors (algos/losses.py) applies unchanged — with gradients that equal the flat computation.

Trees that do not fit `max_tokens` are split into several packs along their root groups (a global
sample and its branches), each pack repeating the prompt once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from arpo.algos.logprobs import token_logprobs
from arpo.training.tree_attention import skips_masked_blocks, use_tree_attention


@dataclass
class Pack:
    """One packed sequence holding the trajectories `traj_ids` of one tree (or several small trees)."""

    input_ids: torch.Tensor  # (S,) long
    position_ids: torch.Tensor  # (S,) long: depth of each token in its trajectory (prompt included)
    allowed: torch.Tensor  # (S, S) bool: allowed[q, k] = query q may attend to key k
    context: torch.Tensor  # (K,) long: packed index of the token whose hidden state predicts pair k
    targets: torch.Tensor  # (K,) long: the token pair k predicts
    members: list[tuple[int, int]]  # (tree index, traj index) for each trajectory in the pack
    pair_index: list[torch.Tensor]  # per member, (L_i,) long index into the K pairs

    @property
    def n_tokens(self) -> int:
        return int(self.input_ids.numel())


def _depth_order(parent: list[int]) -> list[int]:
    def depth(i: int) -> int:
        d = 0
        while parent[i] != -1:
            i, d = parent[i], d + 1
        return d

    return sorted(range(len(parent)), key=lambda i: (depth(i), i))


def _check(responses: list[list[int]], parent: list[int], branch_at: list[int]) -> None:
    for i, (p, b) in enumerate(zip(parent, branch_at, strict=True)):
        if p == -1:
            if b != 0:
                raise ValueError(f"trajectory {i} is a root but branch_at={b}")
            continue
        if not 0 <= p < len(responses) or p == i:
            raise ValueError(f"trajectory {i}: bad parent {p}")
        if not 0 <= b <= min(len(responses[i]), len(responses[p])):
            raise ValueError(f"trajectory {i}: branch_at={b} out of range")
        if responses[i][:b] != responses[p][:b]:
            raise ValueError(f"trajectory {i} does not share its first {b} tokens with its parent {p}")


def root_groups(parent: list[int]) -> list[list[int]]:
    """Trajectories grouped by the global sample they descend from (roots in order)."""
    root = []
    for i in range(len(parent)):
        r = i
        while parent[r] != -1:
            r = parent[r]
        root.append(r)
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(root):
        groups.setdefault(r, []).append(i)
    return list(groups.values())


class _Builder:
    """Accumulates trajectories (parents before children) into one packed sequence."""

    def __init__(self):
        self.tokens: list[int] = []
        self.positions: list[int] = []
        self.rows: list[tuple[list[int], list[int], int]] = []  # (own packed idx, visible idx, offset)
        self.context: list[int] = []
        self.targets: list[int] = []
        self.members: list[tuple[int, int]] = []
        self.pair_index: list[torch.Tensor] = []

    def add_prompt(self, prompt: list[int]) -> list[int]:
        start = len(self.tokens)
        idx = list(range(start, start + len(prompt)))
        self.tokens += prompt
        self.positions += list(range(len(prompt)))
        self.rows.append((idx, idx, 0))  # causal within the prompt
        return idx

    def add_traj(self, key: tuple[int, int], prompt_idx: list[int], resp: list[int], inherited_idx: list[int],
                 inherited_pairs: list[int]) -> tuple[list[int], list[int]]:
        """Append trajectory `resp` whose first len(inherited_idx) tokens already live in the pack."""
        b = len(inherited_idx)
        p_len = len(prompt_idx)
        start = len(self.tokens)
        own = list(range(start, start + len(resp) - b))
        idx = inherited_idx + own
        self.tokens += resp[b:]
        self.positions += list(range(p_len + b, p_len + len(resp)))
        self.rows.append((own, prompt_idx + idx, p_len + b))
        pairs = list(inherited_pairs)
        for t in range(b, len(resp)):
            pairs.append(len(self.targets))
            self.context.append(idx[t - 1] if t > 0 else prompt_idx[-1])
            self.targets.append(resp[t])
        self.members.append(key)
        self.pair_index.append(torch.tensor(pairs, dtype=torch.long))
        return idx, pairs

    def build(self) -> Pack:
        s = len(self.tokens)
        allowed = torch.zeros(s, s, dtype=torch.bool)
        for own, visible, offset in self.rows:
            if not own:
                continue
            # own token j (at depth offset + j) sees visible[: offset + j + 1]
            n_vis = torch.arange(len(own)) + offset + 1  # (n_own,)
            tri = torch.arange(len(visible))[None, :] < n_vis[:, None]  # (n_own, n_visible)
            allowed[torch.tensor(own)[:, None], torch.tensor(visible)[None, :]] = tri
        return Pack(
            input_ids=torch.tensor(self.tokens, dtype=torch.long),
            position_ids=torch.tensor(self.positions, dtype=torch.long),
            allowed=allowed,
            context=torch.tensor(self.context, dtype=torch.long),
            targets=torch.tensor(self.targets, dtype=torch.long),
            members=self.members,
            pair_index=self.pair_index,
        )


def pack_trees(trees: list[dict], max_tokens: int | None = None) -> list[Pack]:
    """Pack trees into sequences of at most `max_tokens` tokens (None: one pack per tree).

    Each tree is a dict {prompt: [ids], responses: [[ids]...], parent: [int] (-1 root),
    branch_at: [int]} (RolloutTree.to_training() gives this). A root group that alone exceeds
    max_tokens gets a pack of its own (packing never splits a group: its tokens share prefixes).
    """
    packs: list[Pack] = []
    for ti, tree in enumerate(trees):
        prompt, resp = list(tree["prompt"]), [list(r) for r in tree["responses"]]
        parent, branch_at = list(tree["parent"]), list(tree["branch_at"])
        _check(resp, parent, branch_at)
        if not prompt:
            raise ValueError(f"tree {ti}: empty prompt (the first response token needs a context)")
        order = _depth_order(parent)
        groups = root_groups(parent)
        own = [sum(len(resp[i]) - branch_at[i] for i in g) for g in groups]
        chunks: list[list[list[int]]] = []
        cur: list[list[int]] = []
        n_cur = len(prompt)
        for g, n in zip(groups, own, strict=True):
            if cur and max_tokens is not None and n_cur + n > max_tokens:
                chunks.append(cur)
                cur, n_cur = [], len(prompt)
            cur.append(g)
            n_cur += n
        chunks.append(cur)
        for chunk in chunks:
            keep = {i for g in chunk for i in g}
            b = _Builder()
            p_idx = b.add_prompt(prompt)
            placed: dict[int, tuple[list[int], list[int]]] = {}
            for i in order:
                if i not in keep:
                    continue
                n_inh = branch_at[i] if parent[i] != -1 else 0
                inh_idx, inh_pairs = (placed[parent[i]][0][:n_inh], placed[parent[i]][1][:n_inh]) if n_inh else ([], [])
                placed[i] = b.add_traj((ti, i), p_idx, resp[i], inh_idx, inh_pairs)
            packs.append(b.build())
    return packs


def collate(packs: list[Pack], pad_id: int = 0, one_row: bool = False) -> dict:
    """Right-pad packs into one model batch with a 4D boolean tree mask (B, 1, S, S).
    Padding rows attend to themselves only (no all-masked row, hence no NaN).
    one_row: the packs end to end in a single row (1, 1, ΣS, ΣS) with a block-diagonal mask, no
    padding; `offsets` gives where each pack starts. With block-sparse attention (tree_attention.py,
    CPU) the blocks between packs cost nothing, so no token is computed for padding."""
    if one_row and len(packs) > 1:
        n = sum(p.n_tokens for p in packs)
        mask = torch.zeros(1, 1, n, n, dtype=torch.bool)
        offsets, o = [], 0
        for p in packs:
            mask[0, 0, o:o + p.n_tokens, o:o + p.n_tokens] = p.allowed
            offsets.append(o)
            o += p.n_tokens
        return {"input_ids": torch.cat([p.input_ids for p in packs])[None],
                "position_ids": torch.cat([p.position_ids for p in packs])[None], "attention_mask": mask,
                "offsets": offsets}
    s = max(p.n_tokens for p in packs)
    bsz = len(packs)
    ids = torch.full((bsz, s), pad_id, dtype=torch.long)
    pos = torch.zeros((bsz, s), dtype=torch.long)
    mask = torch.eye(s, dtype=torch.bool).repeat(bsz, 1, 1)
    for b, p in enumerate(packs):
        n = p.n_tokens
        ids[b, :n], pos[b, :n] = p.input_ids, p.position_ids
        mask[b, :n, :n] = p.allowed
    return {"input_ids": ids, "position_ids": pos, "attention_mask": mask[:, None],
            "offsets": [b * s for b in range(bsz)]}


def packed_token_logprobs(model, packs: list[Pack], *, with_entropy: bool = False, chunk_size: int = 1024,
                          temperature: float = 1.0, pad_id: int = 0):
    """Log-probs (and entropies) of every pair of every pack, in one batched forward.
    Returns a list with one (logp (K_b,), entropy (K_b,) | None) per pack; carries gradient when
    grad is enabled."""
    get_base = getattr(model, "get_base_model", None)  # a peft wrapper: LoRA layers live inside
    model = get_base() if get_base is not None else model
    # packs are built on the CPU; the model may be on a GPU (FSDP's train view says where: its shards may be
    # offloaded to the CPU)
    dev = getattr(model, "device", None) or model.get_output_embeddings().weight.device
    # one unpadded row where the attention skips the blocks between packs (SDPA on the CPU); dense
    # attention (a GPU, eager) would pay for them, so there the packs are padded rows
    batch = collate(packs, pad_id, one_row=skips_masked_blocks(model, dev))
    offsets = batch.pop("offsets")
    batch = {k: v.to(dev, non_blocking=True) for k, v in batch.items()}
    with use_tree_attention(model):  # block-sparse over the tree mask: a token's work is what it sees
        out = model.model(**batch, use_cache=False)
    hidden = out.last_hidden_state  # (B, S, D)
    flat_idx = torch.cat([p.context + o for o, p in zip(offsets, packs, strict=True)]).to(dev)
    targets = torch.cat([p.targets for p in packs]).to(dev)
    h = hidden.reshape(-1, hidden.shape[-1])[flat_idx]  # (ΣK, D)
    head = model.get_output_embeddings()
    logp, ent = token_logprobs(h, head.weight, targets, chunk_size=chunk_size, temperature=temperature,
                               with_entropy=with_entropy, bias=getattr(head, "bias", None))
    sizes = [int(p.targets.numel()) for p in packs]
    lps = logp.split(sizes)
    ents = ent.split(sizes) if ent is not None else [None] * len(packs)
    return list(zip(lps, ents, strict=True))


def unpack(packs: list[Pack], values: list[torch.Tensor], rows: dict[tuple[int, int], int], length: int,
           fill: float = 0.0) -> torch.Tensor:
    """Gather per-pair values into a flat padded (B, length) tensor, row rows[(tree, traj)]."""
    offsets, o = [], 0
    for v in values:
        offsets.append(o)
        o += v.numel()
    r_idx, c_idx, src = [], [], []
    for p, off in zip(packs, offsets, strict=True):
        for key, pi in zip(p.members, p.pair_index, strict=True):
            r_idx.append(torch.full_like(pi, rows[key]))
            c_idx.append(torch.arange(len(pi)))
            src.append(pi + off)
    flat = torch.cat(values)
    out = flat.new_full((len(rows), length), fill)
    dev = flat.device
    return out.index_put((torch.cat(r_idx).to(dev), torch.cat(c_idx).to(dev)), flat[torch.cat(src).to(dev)])
