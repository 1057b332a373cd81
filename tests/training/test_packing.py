"""Tree packing computes every shared token once and still gives exactly the flat per-trajectory
log-probs, losses and gradients (issue 6: float64 < 1e-6 relative, float32 < 1e-4)."""

import random

import pytest
import torch

from arpo.algos.advantages import grpo_advantage, hard_attribution, soft_attribution
from arpo.algos.losses import policy_loss
from arpo.testing import tiny_model, tiny_tokenizer
from arpo.training.batch import TreeBatch, loss_and_backward, token_logprobs
from arpo.training.packing import collate, pack_trees


def random_tree(rng: random.Random, vocab: int, m: int = 6, prompt_len: int = 7, max_len: int = 14) -> dict:
    prompt = [rng.randrange(3, vocab) for _ in range(prompt_len)]
    resp, parent, branch = [], [], []
    for i in range(m):
        if i == 0 or rng.random() < 0.3:
            resp.append([rng.randrange(3, vocab) for _ in range(rng.randint(1, max_len))])
            parent.append(-1)
            branch.append(0)
        else:
            p = rng.randrange(i)
            b = rng.randint(0, len(resp[p]))
            resp.append(resp[p][:b] + [rng.randrange(3, vocab) for _ in range(rng.randint(1, max_len))])
            parent.append(p)
            branch.append(b)
    return {"prompt": prompt, "responses": resp, "parent": parent, "branch_at": branch}


def flat_reference(model, tree: dict, dtype) -> list[torch.Tensor]:
    """Independent reference: one plain forward per trajectory, log_softmax of the full logits."""
    out = []
    for r in tree["responses"]:
        ids = torch.tensor([tree["prompt"] + r])
        logits = model(ids).logits[0].to(dtype)
        lp = torch.log_softmax(logits, -1)
        p = len(tree["prompt"])
        out.append(lp[p - 1 : p - 1 + len(r)].gather(-1, torch.tensor(r)[:, None])[:, 0])
    return out


@pytest.fixture(scope="module")
def model64():
    return tiny_model(tiny_tokenizer(), dtype=torch.float64)


@pytest.mark.parametrize("seed", range(4))
def test_packed_logprobs_equal_flat_float64(model64, seed):
    rng = random.Random(seed)
    trees = [random_tree(rng, 200) for _ in range(2)]
    batch = TreeBatch.from_trees(trees, TreeBatch.all_generated(trees))
    lp, ent = token_logprobs(model64, batch, packed=True, with_entropy=True)
    for ti, tr in enumerate(trees):
        ref = flat_reference(model64, tr, torch.float64)
        for i, r in enumerate(ref):
            row = batch.rows[(ti, i)]
            assert torch.allclose(lp[row, : len(r)], r, rtol=1e-9, atol=1e-10)
    # each shared token is computed once: the pack holds the prompt once plus every own segment
    packs = pack_trees(trees)
    for p, tr in zip(packs, trees, strict=True):
        own = sum(len(r) - b for r, b in zip(tr["responses"], tr["branch_at"], strict=True))
        assert p.n_tokens == len(tr["prompt"]) + own
    assert batch.n_tokens(packed=True) < batch.n_tokens(packed=False)


def test_tree_mask_sees_only_ancestors():
    tree = {"prompt": [5, 6], "responses": [[7, 8, 9], [7, 10]], "parent": [-1, 0], "branch_at": [0, 1]}
    (p,) = pack_trees([tree])
    assert p.input_ids.tolist() == [5, 6, 7, 8, 9, 10]
    assert p.position_ids.tolist() == [0, 1, 2, 3, 4, 3]
    # the branch's own token 10 (packed 5) sees prompt + its inherited 7, not the parent's 8, 9
    assert p.allowed[5].tolist() == [True, True, True, False, False, True]
    assert p.allowed[4].tolist() == [True, True, True, True, True, False]
    # pairs: traj 0 predicts 7 from 6, 8 from 7, 9 from 8; the branch predicts 10 from 7
    assert p.targets.tolist() == [7, 8, 9, 10]
    assert p.context.tolist() == [1, 2, 3, 2]
    assert [x.tolist() for x in p.pair_index] == [[0, 1, 2], [0, 3]]
    batch = collate([p, p])
    assert batch["attention_mask"].shape == (2, 1, 6, 6)


def _loss_fn(adv, old, mask, agg):
    def fn(lp, en):
        return policy_loss(lp, old, adv, mask, agg=agg, entropy=en, entropy_coef=0.01)
    return fn


def _grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("attribution", ["soft", "hard"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_packed_loss_and_gradients_equal_flat(model64, attribution, agg):
    rng = random.Random(11)
    trees = [random_tree(rng, 200, m=5) for _ in range(2)]
    masks = [[[rng.random() < 0.8 for _ in r] for r in t["responses"]] for t in trees]
    for t, ms in zip(trees, masks, strict=True):  # a shared token has one mask value in every sharer
        for i, (p, b) in enumerate(zip(t["parent"], t["branch_at"], strict=True)):
            if p != -1:
                ms[i][:b] = ms[p][:b]
    batch = TreeBatch.from_trees(trees, [[[int(x) for x in m] for m in ms] for ms in masks])
    adv = torch.zeros(batch.mask.shape, dtype=torch.float64)
    for ti, t in enumerate(trees):
        a = grpo_advantage(torch.tensor([rng.random() for _ in t["responses"]], dtype=torch.float64),
                           [0] * len(t["responses"]))
        lengths = [len(r) for r in t["responses"]]
        tok = (soft_attribution(a, lengths) if attribution == "soft"
               else hard_attribution(a, t["parent"], t["branch_at"], lengths))
        for i, x in enumerate(tok):
            adv[batch.rows[(ti, i)], : len(x)] = x
    old, _ = token_logprobs(model64, batch, packed=False)
    old = old + 0.05 * torch.randn(old.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    results = {}
    for packed in (True, False):
        model64.zero_grad()
        loss, _ = loss_and_backward(model64, batch, _loss_fn(adv, old, batch.mask, agg), packed=packed,
                                    need_entropy=True, max_tokens=40)
        results[packed] = (loss, _grads(model64))
    # independent reference: plain forward of each trajectory, loss on padded tensors, autograd
    model64.zero_grad()
    lp_rows = torch.zeros(batch.mask.shape, dtype=torch.float64)
    en_rows = torch.zeros(batch.mask.shape, dtype=torch.float64)
    for ti, t in enumerate(trees):
        for i, r in enumerate(t["responses"]):
            ids = torch.tensor([t["prompt"] + r])
            logits = model64(ids).logits[0]
            p0 = len(t["prompt"])
            lsm = torch.log_softmax(logits[p0 - 1 : p0 - 1 + len(r)], -1)
            row = batch.rows[(ti, i)]
            lp_rows = lp_rows.index_put((torch.full((len(r),), row), torch.arange(len(r))),
                                        lsm.gather(-1, torch.tensor(r)[:, None])[:, 0])
            en_rows = en_rows.index_put((torch.full((len(r),), row), torch.arange(len(r))),
                                        -(lsm.exp() * lsm).sum(-1))
    ref_loss, _ = _loss_fn(adv, old, batch.mask, agg)(lp_rows, en_rows)
    ref_loss.backward()
    ref_grad = _grads(model64)
    for packed, (loss, g) in results.items():
        assert torch.allclose(loss, ref_loss.detach(), rtol=1e-9), packed
        rel = (g - ref_grad).norm() / ref_grad.norm()
        assert rel < 1e-6, (packed, float(rel))


def test_float32_packed_matches_flat():
    model = tiny_model(tiny_tokenizer())
    rng = random.Random(3)
    trees = [random_tree(rng, 200, m=8, max_len=30)]
    batch = TreeBatch.from_trees(trees, TreeBatch.all_generated(trees))
    a, _ = token_logprobs(model, batch, packed=True)
    b, _ = token_logprobs(model, batch, packed=False)
    m = batch.mask.bool()
    assert (a[m] - b[m]).abs().max() < 1e-4


def test_split_packs_respect_max_tokens(model64):
    rng = random.Random(5)
    tree = random_tree(rng, 200, m=8)
    packs = pack_trees([tree], max_tokens=30)
    assert len(packs) >= 2
    keys = sorted(k for p in packs for k in p.members)
    assert keys == [(0, i) for i in range(8)]
    batch = TreeBatch.from_trees([tree], TreeBatch.all_generated([tree]))
    a, _ = token_logprobs(model64, batch, packed=True, max_tokens=30)
    b, _ = token_logprobs(model64, batch, packed=True, max_tokens=10_000)
    assert torch.allclose(a, b, atol=1e-10)


def test_bad_tree_is_rejected():
    bad = {"prompt": [1, 2], "responses": [[3, 4], [9, 5]], "parent": [-1, 0], "branch_at": [0, 1]}
    with pytest.raises(ValueError, match="does not share"):
        pack_trees([bad])


def test_rollout_logprobs_equal_recomputed_old_logprobs(tiny_lm, tiny_tok):
    """old_logp from the engine's records (TrainConfig.old_logprobs=rollout) equals the no-grad
    forward it replaces, on a tree with forks and an appended (masked) tool result."""
    from arpo.engine.base import SamplingParams
    from arpo.engine.hf import HFEngine
    from arpo.training.batch import TreeBatch, rollout_logprobs, token_logprobs

    eng = HFEngine(tiny_lm, tiny_tok, eos_token_ids=[-1])
    prompt = tiny_tok("What is 17 * 23? Use python.")["input_ids"]
    a = eng.add(prompt, SamplingParams(max_len=len(prompt) + 60, seed=1, temperature=0.8, stop=("e",)))
    while eng.seq(a).status in ("waiting", "running"):
        eng.step()
    assert eng.seq(a).status == "paused" and len(eng.seq(a).tokens) > len(prompt) + 6
    result = tiny_tok("<result> 391 </result>")["input_ids"]
    after = len(eng.seq(a).tokens) + len(result) + 2  # a fork point past the result
    eng.append(a, result)  # a tool result: gen_mask 0
    eng.seq(a).params.stop = ()
    eng.seq(a).params.max_len = after + 8
    for _ in range(4):
        eng.step()
    kids = eng.fork(a, 2, at=len(prompt) + 6) + eng.fork(a, 1, at=after)
    while eng.has_unfinished():
        eng.step()
    seqs = [eng.seq(s) for s in [a] + kids]
    n_prompt = len(prompt)
    tree = {"prompt": prompt, "responses": [s.tokens[n_prompt:] for s in seqs], "parent": [-1, 0, 0, 0],
            "branch_at": [0, 6, 6, after - n_prompt]}
    assert all(len(s.tokens) > s.fork_at for s in seqs[1:])
    batch = TreeBatch.from_trees([tree], [[list(s.gen_mask) for s in seqs]])
    got_lp, got_h = rollout_logprobs(batch, {(0, i): (s.logprobs, s.entropies) for i, s in enumerate(seqs)})
    want_lp, want_h = token_logprobs(tiny_lm, batch, with_entropy=True, temperature=0.8)
    m = batch.mask.bool()
    assert m.sum() > 20 and (~m).sum() > 0
    assert torch.allclose(got_lp[m], want_lp[m], atol=1e-4) and torch.allclose(got_h[m], want_h[m], atol=1e-4)


def test_a_batch_needs_its_loss_masks():
    """from_trees defaulted to all-ones masks: a caller that forgot them trained on tool output."""
    tree = {"prompt": [1, 2], "responses": [[3, 4, 5]], "parent": [-1], "branch_at": [0]}
    with pytest.raises(TypeError):
        TreeBatch.from_trees([tree])  # type: ignore[call-arg]
    masked = TreeBatch.from_trees([tree], [[[1, 0, 1]]])
    assert masked.mask.tolist() == [[1.0, 0.0, 1.0]]
    assert TreeBatch.from_trees([tree], TreeBatch.all_generated([tree])).mask.tolist() == [[1.0, 1.0, 1.0]]


def test_a_linear_loss_skips_the_no_grad_forward_with_the_same_loss_and_gradients(model64, monkeypatch):
    """SFT's NLL is linear in the log-probs: linear=True takes dL/dlogp at logp = 0, runs one forward per
    micro-batch instead of two, and gives the loss and gradients of the two-forward path."""
    import arpo.training.batch as B
    from arpo.recipes.sft import nll_loss

    rng = random.Random(3)
    trees = [random_tree(rng, 200, m=1) for _ in range(4)]
    masks = [[[int(rng.random() < 0.7) for _ in t["responses"][0]]] for t in trees]
    batch = TreeBatch.from_trees(trees, masks)
    forwards = []
    real = B.packed_token_logprobs
    monkeypatch.setattr(B, "packed_token_logprobs", lambda *a, **k: forwards.append(1) or real(*a, **k))
    got = {}
    for linear in (False, True):
        forwards.clear()
        model64.zero_grad()
        loss, _ = loss_and_backward(model64, batch, nll_loss(batch.mask), packed=False, max_tokens=40, linear=linear)
        got[linear] = (loss, _grads(model64), len(forwards))
    assert got[True][2] * 2 == got[False][2] >= 2
    assert torch.allclose(got[True][0], got[False][0], rtol=1e-12)
    assert (got[True][1] - got[False][1]).norm() / got[False][1].norm() < 1e-12
    with pytest.raises(ValueError, match="linear"):
        loss_and_backward(model64, batch, nll_loss(batch.mask), linear=True, need_entropy=True)
