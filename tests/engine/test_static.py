"""engine/static.py: arpo's own forward equals the transformers forward; the compiled decode step
equals the eager one (same tokens under greedy and under a seed); weights follow the policy."""

import pytest
import torch

from arpo.engine.base import SamplingParams
from arpo.engine.hf import HFEngine
from arpo.engine.static import unsupported
from arpo.errors import ArpoError


def run(engine, prompts, params_list, forks_at=None):
    sids = [engine.add(p, sp) for p, sp in zip(prompts, params_list, strict=True)]
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
        if forks_at is not None and steps == forks_at:  # fork mid-way, then append "tool results" to a child
            kids = engine.fork(sids[0], 2, seeds=[7, 8])
            sids += kids
    return [engine.seq(s) for s in sids]


def prompts(tok):
    return [tok(t)["input_ids"] for t in ("What is 17 * 23?", "hello", "print(1) " * 6, "a b c")]


def assert_same(a, b, tol=1e-4):
    for x, y in zip(a, b, strict=True):
        assert x.tokens == y.tokens
        assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)) < tol
        assert max(abs(p - q) for p, q in zip(x.entropies, y.entropies, strict=True)) < tol
        assert max(abs(p - q) for p, q in zip(x.topk_entropies, y.topk_entropies, strict=True)) < tol


def test_static_forward_equals_the_transformers_forward(tiny_lm, tiny_tok):
    """Greedy and seeded sampling, with a fork and tokens that join mid-way: same tokens, log-probs
    and entropies from arpo's forward and from the transformers module."""
    assert unsupported(tiny_lm) is None
    for temp in (0.0, 1.0):
        ps = [SamplingParams(max_len=40, seed=i, temperature=temp) for i in range(4)]
        fast = run(HFEngine(tiny_lm, tiny_tok, eos_token_ids=[-1]), prompts(tiny_tok), ps, forks_at=5)
        slow = run(HFEngine(tiny_lm, tiny_tok, eos_token_ids=[-1], static=False), prompts(tiny_tok), ps, forks_at=5)
        assert len(fast) == 6
        assert_same(fast, slow)


def test_qwen2_biases_and_the_fallback_for_unknown_architectures(tiny_tok):
    from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    qwen = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tiny_tok), hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)).eval()
    assert qwen.model.layers[0].self_attn.q_proj.bias is not None and unsupported(qwen) is None
    ps = [SamplingParams(max_len=30, seed=i) for i in range(4)]
    a = run(HFEngine(qwen, tiny_tok, eos_token_ids=[-1]), prompts(tiny_tok), ps)
    b = run(HFEngine(qwen, tiny_tok, eos_token_ids=[-1], static=False), prompts(tiny_tok), ps)
    assert_same(a, b)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tiny_tok), n_embd=32, n_layer=1, n_head=2)).eval()
    eng = HFEngine(gpt2, tiny_tok, eos_token_ids=[-1])
    assert eng.static is None and "gpt2" in eng.static_off
    assert len(run(eng, prompts(tiny_tok)[:1], ps[:1])[0].tokens) == 30
    with pytest.raises(ArpoError, match="compile"):
        HFEngine(gpt2, tiny_tok, compile=True)


def test_the_engine_decodes_with_the_policys_current_weights(tiny_tok):
    """An optimizer step changes the parameters in place: the prepacked copies are rebuilt."""
    from arpo.testing import tiny_model

    model = tiny_model(tiny_tok, seed=3)
    eng = HFEngine(model, tiny_tok, eos_token_ids=[-1])
    p = SamplingParams(max_len=24, temperature=0.0)
    before = run(eng, prompts(tiny_tok)[:1], [p])[0].tokens
    n0 = eng.static.w.refreshes
    with torch.no_grad():
        for prm in model.parameters():
            prm.add_(torch.randn_like(prm) * 0.5)
    after = run(eng, prompts(tiny_tok)[:1], [p])[0].tokens
    assert eng.static.w.refreshes == n0 + 1
    ref = run(HFEngine(model, tiny_tok, eos_token_ids=[-1], static=False), prompts(tiny_tok)[:1], [p])[0].tokens
    assert after == ref and after != before


def test_compiled_decode_equals_eager(tiny_lm, tiny_tok):
    """torch.compile (inductor) of the whole decode step: the same tokens as the eager step under
    greedy and under a seed, across batch sizes and cache widths (one dynamic-shape graph), with a
    fork; top-k sequences take the eager sampler after the compiled forward."""
    ps_greedy = [SamplingParams(max_len=40, temperature=0.0) for _ in range(4)]
    ps_seed = [SamplingParams(max_len=40 + 4 * i, seed=i) for i in range(4)]  # finish at different steps
    ps_topk = [SamplingParams(max_len=30, seed=i, top_k=5) for i in range(2)]
    comp = HFEngine(tiny_lm, tiny_tok, eos_token_ids=[-1], compile=True)
    for ps, fork in ((ps_greedy, None), (ps_seed, 5), (ps_topk, None)):
        eager = run(HFEngine(tiny_lm, tiny_tok, eos_token_ids=[-1]), prompts(tiny_tok)[: len(ps)], ps, forks_at=fork)
        compiled = run(comp, prompts(tiny_tok)[: len(ps)], ps, forks_at=fork)
        assert_same(compiled, eager)
    assert comp.static.compiled_steps > 100 and comp.static.compile_seconds > 0


def test_compiled_step_equals_the_eager_step_at_many_shapes(tiny_lm):
    """The compiled decode step against the eager one on random caches: slot counts, cache widths
    below the buffer's capacity, masked columns and a slot with every cached column masked (a free
    slot). Logits, new K/V and the sampled tokens with their statistics must agree to float
    rounding."""
    from arpo.engine.static import StaticForward

    eager, comp = StaticForward(tiny_lm), StaticForward(tiny_lm, compile=True)
    a = eager.arch
    g = torch.Generator().manual_seed(0)
    for S, col, cap in [(4, 10, 32), (6, 3, 16), (3, 40, 64), (5, 31, 32), (2, 17, 48)]:
        buf = torch.randn(a.n_layers, 2, S, a.n_kv, cap, a.head_dim, generator=g)
        ids = torch.randint(0, 100, (S,), generator=g)
        pos = torch.randint(0, 60, (S,), generator=g)
        bias = torch.zeros(S, col)
        bias[0, : col // 2] = float("-inf")
        bias[-1] = float("-inf")
        temp, u = torch.rand(S, generator=g) + 0.5, torch.rand(S, generator=g)
        outs = [f.decode(ids, pos, bias, buf, temp, u, 5, True) for f in (eager, comp)]
        for x, y in zip(*outs, strict=True):
            assert x.shape == y.shape and torch.allclose(x.float(), y.float(), atol=1e-4, rtol=1e-4), (S, col, cap)


def test_the_decode_step_selects_nothing_on_the_temperature(tiny_lm):
    """Inductor's triton code generation failed on CUDA inside the compiled step's
    `torch.where(temperature > 0, ...)` (issue 31). The step now takes (safe_t, do_sample) computed
    outside it: its traced graph has no where and no comparison at all; greedy rows and sampled
    rows still come out right (greedy = argmax, sampled = inverse CDF of the tempered softmax)."""
    from collections import Counter

    from torch.fx.experimental.proxy_tensor import make_fx

    from arpo.engine import static as S

    sf = S.StaticForward(tiny_lm)
    a, w = sf.arch, sf.w
    n = 3
    g = torch.Generator().manual_seed(0)
    buf = torch.randn(a.n_layers, 2, n, a.n_kv, 16, a.head_dim, generator=g)
    ids, pos = torch.tensor([1, 2, 3]), torch.tensor([5, 6, 7])
    cos, sin = S.rotary(pos[:, None], w.inv_freq, w.rope_scale, torch.float32)
    safe_t, do_sample = S.sampling_inputs(torch.tensor([1.0, 0.0, 0.7]))
    u = torch.rand(n, generator=g)

    def step(ids, cos, sin, bias, buf, safe_t, do_sample, u):
        return S.decode_step(a, w.small, w.eps, ids, cos, sin, bias, buf, safe_t, do_sample, u, 5, True, fused=True)

    S._ACTIVE.weights = w
    try:
        args = (ids, cos[:, 0], sin[:, 0], torch.zeros(n, 10), buf, safe_t, do_sample, u)
        graph = make_fx(step)(*args)
        logits, *_, toks, chosen, ent, topk = step(*args)
    finally:
        S._ACTIVE.weights = None
    ops = Counter(str(nd.target).split(".")[1] for nd in graph.graph.nodes
                  if nd.op == "call_function" and str(nd.target).startswith("aten."))
    assert not {k for k in ops if k in ("where", "gt", "ge", "lt", "le", "eq", "ne")}, ops
    assert toks[1] == logits[1].argmax()
    logp = torch.log_softmax(logits / torch.tensor([1.0, 1.0, 0.7])[:, None], -1)
    cdf = logp.exp().cumsum(-1)
    for r in (0, 2):
        assert toks[r] == torch.searchsorted(cdf[r], u[r] * cdf[r, -1])
        assert torch.allclose(chosen[r], logp[r, toks[r]])
