"""engine/graph.py, the graph step (HFEngine(graph=True)), checked on CPU where its bucketed body runs
eagerly: the same tokens as the eager step under greedy and under a seed (forks, pauses at stop
strings, appended tool results, releases in between), log-probs to float rounding; bucketed shapes
equal to the exact ones; a steady step that synchronises with the device only through its one copy
and allocates no buffers (addresses stable, no new graphs for known buckets)."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from arpo.engine.base import SamplingParams
from arpo.engine.hf import HFEngine

SYNC_OPS = ("_local_scalar_dense", "nonzero", "item", "is_nonzero", "equal", "masked_select", "unique")


def prompts(tok):
    return [tok(t)["input_ids"] for t in ("What is 17 * 23?", "hello", "print(1) " * 6, "a b c")]


def scenario(engine, tok, params, tool_tokens):
    """Run to the end: a seeded and an unseeded fork at step 5, a release at step 9, and every pause
    at a stop string answered with appended tokens (at most twice per sequence, then finish)."""
    sids = [engine.add(p, sp) for p, sp in zip(prompts(tok), params, strict=False)]  # a prompt per params: 3 or 4
    answered: dict[int, int] = {}
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
        if steps == 5:
            sids += engine.fork(sids[0], 2, seeds=[7, 8]) + engine.fork(sids[1], 1)
        if steps == 9:
            engine.release(sids.pop(3))
        for sid in sids:
            s = engine.seq(sid)
            if s.status == "paused":
                if answered.get(sid, 0) < 2:
                    answered[sid] = answered.get(sid, 0) + 1
                    engine.append(sid, tool_tokens)
                else:
                    engine.finish(sid)
    return [engine.seq(s) for s in sids]


def assert_same(a, b, tol=1e-5):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.tokens == y.tokens and x.gen_mask == y.gen_mask
        for u, v in ((x.logprobs, y.logprobs), (x.entropies, y.entropies), (x.topk_entropies, y.topk_entropies)):
            assert max(abs(p - q) for p, q in zip(u, v, strict=True)) < tol


def test_graph_step_equals_the_eager_step(tiny_lm, tiny_tok):
    tool = tiny_tok("<result>42</result>")["input_ids"]
    for temp in (0.0, 1.0):
        ps = [SamplingParams(max_len=50 + 6 * i, seed=i, temperature=temp, stop=("e",) if i % 2 else ())
              for i in range(4)]
        eager = scenario(HFEngine(tiny_lm, tiny_tok, eos_token_ids=[-1]), tiny_tok, ps, tool)
        eng = HFEngine(tiny_lm, tiny_tok, eos_token_ids=[-1], graph=True)
        graph = scenario(eng, tiny_tok, ps, tool)
        assert_same(graph, eager)
        g = eng._graph
        assert sum(0 in x.gen_mask for x in graph) >= 1  # tool results were appended and decoded after
        print("replays", g.replays, "uploads", g.uploads, "graphs", sorted(g.graphs))
        assert g.replays >= 30 and g.uploads < g.replays / 2  # most steps replay without touching the host state
        assert eng.kv.generation == 1 and g.captures == len(g.graphs) <= 8  # one graph per bucket, never again
    # a top-k sequence in the batch: those steps take the eager sampler, the others the graph
    ps = [SamplingParams(max_len=30, seed=i, top_k=5 if i == 0 else 0) for i in range(3)]
    a, b = (scenario(HFEngine(tiny_lm, tiny_tok, eos_token_ids=[-1], graph=gr), tiny_tok, ps, tool)
            for gr in (False, True))
    assert_same(b, a)


def test_bucketed_shapes_equal_the_exact_step(tiny_lm, tiny_tok):
    """The same state stepped at its exact size (StaticForward.decode over n slots and ptr columns)
    and at larger buckets (padded slots not live, padded columns masked): same tokens, log-probs and
    entropies to float rounding, for every live slot."""
    from arpo.engine.kv import bucket
    from arpo.engine.rng import uniforms_for

    eng = HFEngine(tiny_lm, tiny_tok, eos_token_ids=[-1], graph=True)
    for i, p in enumerate(prompts(tiny_tok)[:3]):
        eng.add(p, SamplingParams(max_len=200, seed=i, temperature=0.7 + 0.2 * i))
    for _ in range(6):
        eng.step()
    g, kv = eng._graph, eng.kv
    live = [(sid, slot) for sid, slot in eng._slot.items()]
    seqs = [eng.seq(sid) for sid, _ in live]
    n, ptr = kv.n_slots, kv.ptr
    ids = torch.zeros(n, dtype=torch.long)
    temp = torch.ones(n)
    u = torch.full((n,), 0.5)
    for (_, slot), s in zip(live, seqs, strict=True):
        ids[slot], temp[slot] = s.tokens[-1], s.params.temperature
    u[[slot for _, slot in live]] = uniforms_for([eng._st[sid].key for sid, _ in live], [len(s.tokens) for s in seqs])
    bias = torch.zeros(n, ptr).masked_fill_(~kv.valid[:, :ptr], float("-inf"))
    exact = eng.static.decode(ids, kv.npos.clone(), bias, kv.buf, temp, u, eng.topk_entropy, True)[3:]
    g.upload([slot for _, slot in live], [s.tokens[-1] for s in seqs], [s.params.temperature for s in seqs],
             [eng._st[sid].key for sid, _ in live])
    rows = torch.tensor([slot for _, slot in live])
    S0, W0 = bucket(n), bucket(ptr + 1, 64)
    for S, W in ((S0, W0), (S0, 2 * W0), (2 * S0, W0), (2 * S0, 4 * W0)):  # all within the storage (8 x 512)
        assert 2 * S0 <= kv.store[0].shape[2] and 4 * W0 <= kv.store[0].shape[4]
        got = g._compute(S, W)[3:]
        assert torch.equal(got[0][rows], exact[0][rows]), (S, W)
        for x, y in zip(got[1:], exact[1:], strict=True):
            assert torch.allclose(x[rows], y[rows], atol=1e-5, rtol=1e-5), (S, W)


class Count(TorchDispatchMode):
    """Counts every aten op of a step; records which ran outside the graph body (views aside)."""

    def __init__(self, graph):
        super().__init__()
        self.graph, self.ops, self.outside = graph, [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.ops.append(name)
        if not self.graph.in_body and not func.is_view:  # views (slices) allocate and launch nothing
            self.outside.append((name, args))
        return func(*args, **(kwargs or {}))


def test_a_steady_step_syncs_once_and_allocates_nothing(tiny_lm, tiny_tok, monkeypatch):
    """In a step where nothing joins, leaves or compacts: no op that reads a device value on the host
    (item / nonzero / ...) anywhere in the step; outside the graph body (what runs besides the replay
    on a GPU) exactly one aten op, the copy of the results into the host buffer, and `.tolist()` /
    `.item()` only on that host buffer. Across a run with joins, forks, pauses and compactions, every
    static buffer keeps its address and each bucket's graph is made once."""
    eng = HFEngine(tiny_lm, tiny_tok, eos_token_ids=[-1], graph=True)
    sids = [eng.add(p, SamplingParams(max_len=120, seed=i)) for i, p in enumerate(prompts(tiny_tok))]
    for _ in range(3):
        eng.step()
    g, kv = eng._graph, eng.kv
    ptrs = lambda: [t.data_ptr() for t in (*kv.store, g.ints, g.safe_t, g.ptr, g.out, g.host)]  # noqa: E731
    before, graphs = ptrs(), dict(g.graphs)
    host_calls = []
    for name in ("tolist", "item"):
        orig = getattr(torch.Tensor, name)

        def spy(self, *a, _orig=orig, _name=name, **k):
            host_calls.append((_name, self.untyped_storage().data_ptr() == g.host.untyped_storage().data_ptr()))
            return _orig(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, spy)
    for _ in range(4):
        steps0, comp0, up0 = g.replays, eng.stats["compactions"], g.uploads
        with Count(g) as c:
            eng.step()
        assert g.replays == steps0 + 1 and eng.stats["compactions"] == comp0 and g.uploads == up0
        assert not [o for o in c.ops if o in SYNC_OPS], c.ops
        assert [name for name, _ in c.outside] == ["copy_"], c.outside
        dst = c.outside[0][1][0]
        assert dst.device.type == "cpu" and dst.data_ptr() == g.host.data_ptr()
        assert host_calls and all(on_host for _, on_host in host_calls), host_calls
        host_calls.clear()
    monkeypatch.undo()
    assert ptrs() == before and all(g.graphs[k] is v for k, v in graphs.items())
    # joins, forks, pauses, releases and compactions in between: same buffers, each bucket made once
    eng.fork(sids[0], 3)
    eng.release(sids[2])
    n_caps = g.captures
    while eng.has_unfinished():
        eng.step()
    assert eng.stats["compactions"] > 0 and kv.generation == 1 and ptrs() == before
    assert g.captures - n_caps == len(set(g.graphs) - set(graphs))


def test_graph_step_follows_in_place_weight_updates(tiny_tok):
    """An optimizer step changes parameters in place: the fused weight copies are updated in place
    (same addresses, so captured graphs stay valid) and the graph step decodes with the new weights.
    (float64 model: CPU float32 weights are prepacked for oneDNN, which rebuilds them instead.)"""
    from arpo.testing import tiny_model

    model = tiny_model(tiny_tok, seed=3).double()
    eng = HFEngine(model, tiny_tok, eos_token_ids=[-1], graph=True)
    p = SamplingParams(max_len=24, temperature=0.0)
    before = eng.generate(prompts(tiny_tok)[:1], p)[0].tokens
    layout, graphs = eng.static.w.layout, dict(eng._graph.graphs)
    with torch.no_grad():
        for prm in model.parameters():
            prm.add_(torch.randn_like(prm) * 0.5)
    after = eng.generate(prompts(tiny_tok)[:1], p)[0].tokens
    assert eng.static.w.layout == layout and all(eng._graph.graphs.get(k, v) is v for k, v in graphs.items())
    ref = HFEngine(model, tiny_tok, eos_token_ids=[-1], static=False).generate(prompts(tiny_tok)[:1], p)[0].tokens
    assert after == ref and after != before
