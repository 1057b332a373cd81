"""Block-sparse tree attention (training/tree_attention.py) gives what dense masked SDPA gives, values and
gradients, for any boolean mask; it is used only inside the packed forward and backward; and it does
the work a tree needs, not the square of the pack."""

import random

import pytest
import torch

from arpo.testing import tiny_model, tiny_tokenizer
from arpo.training import tree_attention
from arpo.training.batch import TreeBatch, loss_and_backward, token_logprobs
from arpo.training.packing import collate, pack_trees
from arpo.training.tree_attention import NAME, block_plan, tree_sdpa_forward, use_tree_attention


def big_tree(rng: random.Random, vocab: int, m: int = 8, prompt_len: int = 60, length: int = 90) -> dict:
    """A tree with roots and branches whose pack spans several 128-row blocks."""
    prompt = [rng.randrange(3, vocab) for _ in range(prompt_len)]
    resp, parent, branch = [], [], []
    for i in range(m):
        if i < 3:
            resp.append([rng.randrange(3, vocab) for _ in range(length)])
            parent.append(-1)
            branch.append(0)
        else:
            p = rng.randrange(i)
            b = rng.randint(1, len(resp[p]) - 1)
            resp.append(resp[p][:b] + [rng.randrange(3, vocab) for _ in range(rng.randint(5, length))])
            parent.append(p)
            branch.append(b)
    return {"prompt": prompt, "responses": resp, "parent": parent, "branch_at": branch}


class _Attn(torch.nn.Module):
    num_key_value_groups = 2
    is_causal = True


@pytest.mark.parametrize("seed", range(3))
def test_block_sparse_equals_dense_sdpa_values_and_gradients(seed):
    """Against transformers' own SDPA function on the same tree mask (float64): outputs and the
    gradients of q, k, v agree to 1e-10; with GQA (2 query heads per key head)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    rng = random.Random(seed)
    packs = pack_trees([big_tree(rng, 100), big_tree(rng, 100, m=5)])
    mask = collate(packs)["attention_mask"]
    s = mask.shape[-1]
    assert s >= 3 * tree_attention.BLOCK
    g = torch.Generator().manual_seed(seed)
    q0 = torch.randn(2, 4, s, 16, generator=g, dtype=torch.float64)
    k0 = torch.randn(2, 2, s, 16, generator=g, dtype=torch.float64)
    v0 = torch.randn(2, 2, s, 16, generator=g, dtype=torch.float64)
    w = torch.randn(2, s, 4, 16, generator=g, dtype=torch.float64)
    results = []
    for fn in (sdpa_attention_forward, tree_sdpa_forward):
        q, k, v = (x.clone().requires_grad_(True) for x in (q0, k0, v0))
        out, _ = fn(_Attn(), q, k, v, mask, scaling=0.25)
        (out * w).sum().backward()
        results.append((out.detach(), q.grad, k.grad, v.grad))
    for dense, sparse in zip(*results, strict=True):
        assert dense.shape == sparse.shape
        assert torch.allclose(dense, sparse, rtol=1e-10, atol=1e-12)


def test_each_block_attends_to_what_its_rows_see_and_no_more():
    rng = random.Random(0)
    (pack,) = pack_trees([big_tree(rng, 100)])
    mask = collate([pack])["attention_mask"]
    plan = block_plan(mask, 128)
    seen = 0
    for s, e, keys in plan[0]:
        want = torch.nonzero(pack.allowed[s:e].any(0))[:, 0]
        assert keys.tolist() == want.tolist()
        seen += (e - s) * len(keys)
    # the dense pack's work is S² query-key pairs; a tree's blocks see a fraction of them
    assert seen < 0.6 * pack.n_tokens ** 2


def test_packed_logprobs_and_gradients_are_those_of_dense_attention(monkeypatch):
    """The model-level check: a tiny float64 Llama, trees over several blocks. The packed log-probs and
    parameter gradients through the block-sparse path equal those through dense masked SDPA (to 1e-12)
    and the flat computation (one plain causal forward per trajectory; 1e-6 as in test_packing), and
    the sparse path really ran."""
    model = tiny_model(tiny_tokenizer(), dtype=torch.float64)
    rng = random.Random(7)
    trees = [big_tree(rng, 200), big_tree(rng, 200, m=6)]
    batch = TreeBatch.from_trees(trees, TreeBatch.all_generated(trees))
    adv = torch.randn(batch.mask.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    def loss_fn(lp, _ent):
        return (lp * adv * batch.mask).sum() / batch.mask.sum(), {}

    def run(packed: bool):
        lp, _ = token_logprobs(model, batch, packed=packed)
        model.zero_grad()
        loss_and_backward(model, batch, loss_fn, packed=packed)
        return lp, torch.cat([p.grad.flatten() for p in model.parameters()])

    calls = []
    real = tree_attention.block_plan
    monkeypatch.setattr(tree_attention, "block_plan", lambda m, b: calls.append(m.shape) or real(m, b))
    sparse = run(packed=True)
    assert calls, "the block-sparse attention did not run"
    monkeypatch.setattr(tree_attention, "BLOCK", 10**6)  # every pack under 2 blocks: dense SDPA
    n = len(calls)
    dense = run(packed=True)
    assert len(calls) == n, "the dense reference went through the sparse path"
    flat = run(packed=False)
    assert torch.allclose(sparse[0], dense[0], rtol=1e-12, atol=1e-13)
    assert (sparse[1] - dense[1]).norm() / dense[1].norm() < 1e-12
    assert torch.allclose(sparse[0], flat[0], rtol=1e-9, atol=1e-10)
    assert (sparse[1] - flat[1]).norm() / flat[1].norm() < 1e-6


def test_the_model_keeps_its_attention_outside_the_packed_forward():
    model = tiny_model(tiny_tokenizer())
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError, match="inside"), use_tree_attention(model):
        assert model.config._attn_implementation == NAME
        with use_tree_attention(model):  # nested: unchanged, and the outer one restores
            assert model.config._attn_implementation == NAME
        raise RuntimeError("inside")
    assert model.config._attn_implementation == "sdpa"
    model.config._attn_implementation = "eager"  # another implementation is left as it is
    with use_tree_attention(model):
        assert model.config._attn_implementation == "eager"


def test_on_the_cpu_a_micro_batch_is_one_unpadded_row_with_the_padded_layouts_log_probs(monkeypatch):
    """collate(one_row=True) lays packs end to end (block-diagonal mask, no padding token); the packed
    log-probs and entropies through it equal those of the padded (B, S) layout (float64)."""
    import arpo.training.packing as P

    rng = random.Random(5)
    packs = pack_trees([big_tree(rng, 200), big_tree(rng, 200, m=4), big_tree(rng, 200, m=2)])
    row = collate(packs, one_row=True)
    n = sum(p.n_tokens for p in packs)
    assert row["input_ids"].shape == (1, n) and row["offsets"] == [0, packs[0].n_tokens,
                                                                   packs[0].n_tokens + packs[1].n_tokens]
    o = row["offsets"][1]
    assert not row["attention_mask"][0, 0, o:, :o].any() and not row["attention_mask"][0, 0, :o, o:].any()
    assert torch.equal(row["attention_mask"][0, 0, o:o + packs[1].n_tokens, o:o + packs[1].n_tokens],
                       packs[1].allowed)

    model = tiny_model(tiny_tokenizer(), dtype=torch.float64)
    seen = []
    real = P.collate
    monkeypatch.setattr(P, "collate", lambda ps, pad, one_row: seen.append(one_row) or real(ps, pad, one_row))
    with torch.no_grad():
        one = P.packed_token_logprobs(model, packs, with_entropy=True)
        monkeypatch.setattr(P, "collate", lambda ps, pad, one_row: real(ps, pad, False))
        padded = P.packed_token_logprobs(model, packs, with_entropy=True)
    assert seen == [True]
    for (lp1, en1), (lp2, en2) in zip(one, padded, strict=True):
        assert torch.allclose(lp1, lp2, rtol=1e-10, atol=1e-12) and torch.allclose(en1, en2, rtol=1e-10, atol=1e-12)


def test_packs_share_one_row_only_where_the_attention_skips_the_blocks_between_them():
    from arpo.training.tree_attention import skips_masked_blocks

    model = tiny_model(tiny_tokenizer())
    assert skips_masked_blocks(model, torch.device("cpu"))
    assert not skips_masked_blocks(model, torch.device("cuda"))  # dense SDPA on a GPU: padded rows
    model.config._attn_implementation = "eager"  # eager attention is dense: one row would cost (ΣS)²
    assert not skips_masked_blocks(model, torch.device("cpu"))
