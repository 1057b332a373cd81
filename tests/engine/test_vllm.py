"""The vLLM backend (arpo.engine.vllm.VLLMEngine) against the engine contract and the HF backend.

The vLLM tests need vLLM (the main .venv has none: they skip there). Run them with the separate venv:

    scripts/install_vllm.sh && .venv-vllm/bin/python -m pytest -q tests/engine/test_vllm.py

One engine is started for the whole module (≈ 20-40 s on 2 CPU cores) over a tiny random Llama
(head_dim 32: vLLM's CPU attention has no head_dim 16 kernel, which the session-wide tiny model has).
The tests above the fixture need no vLLM and run in the main suite too.
"""

import importlib.util
import math
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on CPU (vLLM's default is 4)

from arpo.engine import ENGINES, make_engine, sync_weights
from arpo.engine.base import SamplingParams
from arpo.engine.hf import HFEngine
from arpo.engine.sampling import topk_entropy
from arpo.engine.vllm import INSTALL_HINT, hf_state_dict, vllm_available
from arpo.errors import ArpoError
from arpo.settings import TrainConfig

BLOCK = 32  # vLLM KV block size used here (the CPU backend needs a multiple of 32); prefix-cache granularity
K = 10  # top-k log-probs per token


# ---- no vLLM needed ----------------------------------------------------------------------------------
def test_make_engine_hf_and_unknown(tiny_lm, tiny_tok):
    assert ENGINES == ("hf", "vllm", "vllm_server")
    eng = make_engine("hf", tiny_lm, tiny_tok)
    assert isinstance(eng, HFEngine) and eng.model is tiny_lm
    sync_weights(eng, tiny_lm)  # hf decodes with the policy itself: nothing to push
    with pytest.raises(ArpoError, match="unknown engine 'sglang'"):
        make_engine("sglang", tiny_lm, tiny_tok)


def test_without_vllm_the_error_says_how_to_install():
    if vllm_available():
        pytest.skip("vLLM is installed here")
    from arpo.engine.vllm import VLLMEngine

    with pytest.raises(ImportError, match="install_vllm.sh"):
        VLLMEngine("/nonexistent")
    assert "arpo[vllm]" in INSTALL_HINT


def test_hf_state_dict_merges_lora_without_touching_the_policy(tiny_tok):
    peft = pytest.importorskip("peft", reason="peft not installed (arpo[train])")
    import copy

    from arpo.testing import tiny_model

    base = tiny_model(tiny_tok, seed=3)
    pm = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)  # B starts at zero; make the adapter matter
    before = {k: v.clone() for k, v in pm.state_dict().items()}
    sd = hf_state_dict(pm)
    want = copy.deepcopy(pm).merge_and_unload().state_dict()
    assert set(sd) == set(want)
    for k in want:
        assert torch.allclose(sd[k], want[k], atol=1e-6), k
    assert any(not torch.allclose(sd[k], tiny_model(tiny_tok, seed=3).state_dict()[k]) for k in sd if "q_proj" in k)
    after = pm.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the trained model is unchanged


# ---- the vLLM engine ------------------------------------------------------------------------------------
def _model(tok, seed):
    """A tiny random Llama whose weights are large enough (std 0.2) that its greedy text varies and
    depends on the weights: at the default 0.02 init a tied-embedding model just repeats a token."""
    from arpo.testing import tiny_model

    m = tiny_model(tok, hidden=64, heads=2, kv_heads=1, seed=seed)
    g = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        for p in m.parameters():
            if p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return m


@pytest.fixture(scope="module")
def setup(tiny_tok):
    pytest.importorskip("vllm", reason="vLLM not installed: run scripts/install_vllm.sh")
    a, b = _model(tiny_tok, 0), _model(tiny_tok, 1)
    eng = make_engine("vllm", a, tiny_tok, max_model_len=1024, block_size=BLOCK, topk_entropy=K)
    yield eng, a, b
    eng.close()


@pytest.fixture
def veng(setup):
    eng = setup[0]
    eos = set(eng.eos)
    yield eng
    for sid in list(eng.seqs):
        eng.release(sid)
    eng.eos = eos


@pytest.fixture
def noeos(veng):
    veng.eos = set()  # long random text: never stop at EOS
    return veng


def ids(tok, text):
    return tok(text)["input_ids"]


def full_logprobs(model, tokens, temperature=1.0):
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].float()
    return torch.log_softmax(logits / temperature, -1)


def assert_matches_recompute(model, seq, tol=1e-4, temperature=1.0):
    """Every generated token's log-prob and top-k entropy equal a from-scratch HF forward's."""
    lp = full_logprobs(model, seq.tokens, temperature)
    n = 0
    for i, (g, rec_lp, rec_h, rec_k) in enumerate(zip(seq.gen_mask, seq.logprobs, seq.entropies, seq.topk_entropies,
                                                      strict=True)):
        if not g:
            assert rec_lp == 0.0 and rec_h == 0.0 and rec_k == 0.0
            continue
        ref = lp[seq.prompt_len + i - 1]
        assert abs(float(ref[seq.tokens[seq.prompt_len + i]]) - rec_lp) < tol, f"logprob at response token {i}"
        ref_k = float(topk_entropy(ref[None], K, torch.tensor([seq.tokens[seq.prompt_len + i]]))[0])
        assert abs(ref_k - rec_k) < tol and rec_h == rec_k, f"top-k entropy at response token {i}"
        n += 1
    assert n > 0


def test_greedy_matches_hf_backend(noeos, setup, tiny_tok):
    a = setup[1]
    hf = HFEngine(a, tiny_tok, eos_token_ids=[-1], topk_entropy=K)
    prompts = [ids(tiny_tok, "What is 17 * 23?"), ids(tiny_tok, "hello"), ids(tiny_tok, "print(1) " * 5)]
    params = SamplingParams(max_len=48, temperature=0.0)
    want = hf.generate(prompts, params)
    got = noeos.generate(prompts, params)
    for g, w in zip(got, want, strict=True):
        assert g.finish_reason == "length" and len(g.tokens) == 48
        assert g.tokens == w.tokens  # the full 48 tokens, not only a first few
        assert len(set(g.response)) > 5  # not a degenerate repetition
        for x, y in zip(g.topk_entropies, w.topk_entropies, strict=True):
            assert abs(x - y) < 1e-4
        assert_matches_recompute(a, g)
    # top-k 1 sampling is greedy
    (k1,) = noeos.generate([prompts[0]], SamplingParams(max_len=48, top_k=1, seed=3))
    assert k1.tokens == want[0].tokens


def test_sampling_logprobs_and_per_sequence_seeds(noeos, setup, tiny_tok):
    a = setup[1]
    p = ids(tiny_tok, "What is 2 + 2?")
    s1, s2, s3, other = noeos.generate(
        [p, p, p, ids(tiny_tok, "x")],
        SamplingParams(max_len=40, seed=7),
    )[:4]
    assert s1.tokens == s2.tokens  # same seed, same tokens (each request has its own generator)
    (alone,) = noeos.generate([p], SamplingParams(max_len=40, seed=7))
    assert alone.tokens == s1.tokens  # whatever else is in the batch
    (s8,) = noeos.generate([p], SamplingParams(max_len=40, seed=8))
    assert s8.tokens != s1.tokens
    for s in (s1, other, s8):
        assert_matches_recompute(a, s)
    (hot,) = noeos.generate([p], SamplingParams(max_len=40, seed=9, temperature=0.7))
    assert_matches_recompute(a, hot, temperature=0.7)  # log-probs of softmax(logits / T), as HFEngine


def test_stop_pauses_append_resumes_from_prefix_cache(noeos, setup, tiny_tok):
    a = setup[1]
    sid = noeos.add(ids(tiny_tok, "Use python. " * 12), SamplingParams(max_len=200, seed=5, stop=("e",)))
    while noeos.seq(sid).status in ("waiting", "running"):
        noeos.step()
    s = noeos.seq(sid)
    assert s.status == "paused" and s.finish_reason == "stop" and s.stop_text == "e"
    assert "e" in tiny_tok.decode(s.response[-2:])
    n_before = len(s.tokens)
    assert n_before > BLOCK + 1
    result = ids(tiny_tok, "\n<result>\n391\n</result>\n")
    noeos.append(sid, result)
    s.params.stop = ()
    out = noeos.step()
    assert s.status == "running" and [o.sid for o in out] == [sid]
    while noeos.has_unfinished():
        noeos.step()
    assert s.finish_reason == "length" and len(s.tokens) == 200
    assert s.tokens[n_before : n_before + len(result)] == result
    r0 = n_before - s.prompt_len
    assert s.gen_mask[r0 : r0 + len(result)] == [0] * len(result)
    assert all(s.gen_mask[:r0]) and all(s.gen_mask[r0 + len(result) :])
    assert_matches_recompute(a, s)
    # the resumed request found every full block of the paused sequence in the prefix cache
    first, resumed = noeos.cached_tokens(sid)
    assert resumed == BLOCK * ((n_before - 1) // BLOCK) and resumed > 0


def test_stops_at_each_closing_tag_with_logits_hook(veng, tiny_tok):
    from arpo.testing import scripted_hook
    from arpo.tools.base import STOP_REGEX

    for text, expected in [
        ("<python> print(1) </python> tail", "</python>"),
        ("<answer> \\boxed{1} </answer> tail", "</answer>"),
        ("<calc> 1+1 </calc> tail", "</calc>"),  # unknown tag: the stop regex
    ]:
        params = SamplingParams(max_len=200, stop=("</python>", "</search>", "</answer>"), stop_regex=STOP_REGEX,
                                logits_hook=scripted_hook(tiny_tok, [text]))
        (s,) = veng.generate([ids(tiny_tok, "Q")], params)
        assert s.status == "paused" and s.finish_reason == "stop", text
        assert s.stop_text == expected
        assert tiny_tok.decode(s.response).rstrip().endswith(expected)
        veng.release(s.sid)
    (s,) = veng.generate([ids(tiny_tok, "Q")], SamplingParams(
        max_len=200, stop_regex=STOP_REGEX, logits_hook=scripted_hook(tiny_tok, ["<think> a </think> b"])))
    assert s.finish_reason == "eos" and s.tokens[-1] == tiny_tok.eos_token_id  # </think> is not a call


def test_fork_shares_prefix_through_prefix_cache(noeos, setup, tiny_tok):
    a = setup[1]
    par = noeos.add(ids(tiny_tok, "What is 17 * 23? <python> " * 4), SamplingParams(max_len=160, seed=3))
    other = noeos.add(ids(tiny_tok, "hello there " * 4), SamplingParams(max_len=120, seed=4))
    for _ in range(40):
        noeos.step()
    at = len(noeos.seq(par).tokens) - 4  # fork in the past of a running sequence
    kids = noeos.fork(par, 3, at=at)
    while noeos.has_unfinished():
        noeos.step()
    p = noeos.seq(par)
    for k in kids:
        s = noeos.seq(k)
        assert s.parent == par and s.fork_at == at and s.prompt_len == p.prompt_len
        assert s.tokens[:at] == p.tokens[:at] and len(s.tokens) == 160
        assert s.gen_mask[: at - p.prompt_len] == p.gen_mask[: at - p.prompt_len]
        (hit,) = noeos.cached_tokens(k)
        assert hit == BLOCK * ((at - 1) // BLOCK) and hit > 0  # the shared prefix was not recomputed
        assert_matches_recompute(a, s)
    assert len({tuple(noeos.seq(k).tokens) for k in kids}) == 3  # sampled independently (derived seeds)
    assert_matches_recompute(a, p)
    assert_matches_recompute(a, noeos.seq(other))
    # forks with explicit seeds reproduce
    x, y = noeos.fork(par, 2, at=at, seeds=[11, 11])
    while noeos.has_unfinished():
        noeos.step()
    assert noeos.seq(x).tokens == noeos.seq(y).tokens


def test_load_weights_switches_policy_and_drops_stale_cache(noeos, setup, tiny_tok):
    _, a, b = setup
    prompts = [ids(tiny_tok, "What is 17 * 23? " * 3), ids(tiny_tok, "print(1) " * 6)]
    params = SamplingParams(max_len=72, temperature=0.0)
    want_a = HFEngine(a, tiny_tok, eos_token_ids=[-1]).generate(prompts, params)
    want_b = HFEngine(b, tiny_tok, eos_token_ids=[-1]).generate(prompts, params)
    assert [s.tokens for s in want_a] != [s.tokens for s in want_b]
    got = noeos.generate(prompts, params)  # also fills the prefix cache with policy A's KV
    assert [s.tokens for s in got] == [s.tokens for s in want_a]
    try:
        n = noeos.load_weights(b)
        assert n >= 2 * 9 + 2
        got_b = noeos.generate(prompts, params)
        assert [s.tokens for s in got_b] == [s.tokens for s in want_b]
        for s in got_b:
            assert_matches_recompute(b, s)
            assert noeos.cached_tokens(s.sid) == [0]  # the cache of policy A's KV was dropped
    finally:
        # a plain state dict works too, also without the tied head's name (vLLM on CPU keeps a packed
        # copy of the LM head: the engine reloads it from embed_tokens, else it would stay policy B's)
        noeos.load_weights({k: v for k, v in a.state_dict().items() if k != "lm_head.weight"})
    got_a = noeos.generate(prompts, params)
    assert [s.tokens for s in got_a] == [s.tokens for s in want_a]
    assert noeos.sleep() is False and noeos.wake_up() is False  # CPU: no sleep mode (documented no-op)


def _tree_checks():
    """check_tree and the Echo tool of the transformers backend's ARPO tests (tests/rollout/test_arpo.py)."""
    path = Path(__file__).resolve().parents[1] / "rollout" / "test_arpo.py"
    spec = importlib.util.spec_from_file_location("_arpo_tree_checks", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rollout(engine, tools, tok, cfg, agent, script, free_tokens=4):
    from arpo.rollout.arpo import ARPORollout
    from arpo.testing import hook_rollout, scripted_hook

    ro = ARPORollout(engine, tools, agent, cfg)
    hook_rollout(ro, scripted_hook(tok, script, free_tokens=free_tokens))
    return ro


def test_arpo_rollout_trees_satisfy_invariants(veng, tiny_tok):
    from arpo.settings import AgentConfig, RolloutConfig
    from arpo.tools.registry import ToolRegistry

    t = _tree_checks()
    cfg = RolloutConfig(group_size=4, initial_rollouts=2, branch_factor=2, entropy_tokens=3, entropy_weight=0.5,
                        entropy_estimator="topk", seed=1)
    agent = AgentConfig(max_response_tokens=400, max_tool_calls=5)
    ro = _rollout(veng, ToolRegistry([t.Echo()]), tiny_tok, cfg, agent, t.SCRIPT)
    ps = t.prompts(tiny_tok, 2)
    trees = ro.run(ps)
    for tree, p in zip(trees, ps, strict=True):
        t.check_tree(tree, cfg, agent, p)
        for tr in tree.trajectories:
            assert [c.output for c in tr.traj.tool_calls] == ["a", "bb", "ccc"][: len(tr.traj.tool_calls)]
    assert not veng.seqs  # everything released


def test_arpo_rollout_with_real_python_tool_branches_on_cached_prefixes(veng, tiny_tok):
    from arpo.settings import AgentConfig, RolloutConfig
    from arpo.tools.python import PythonTool
    from arpo.tools.registry import ToolRegistry

    t = _tree_checks()
    # β = 0, τ = 0: P = α > 0 always branches, until M trajectories exist
    cfg = RolloutConfig(group_size=6, initial_rollouts=2, entropy_weight=0.0, branch_threshold=0.0, entropy_tokens=2,
                        seed=4)
    agent = AgentConfig(max_response_tokens=300)
    script = ["<python> print(6 * 7) </python>", "<python> print(sum(range(10))) </python>",
              "<answer> \\boxed{42} </answer>"]
    cached0, prompt0 = veng.stats["cached_tokens"], veng.stats["prompt_tokens"]
    with PythonTool(timeout_s=20, pool_size=1) as py:
        ro = _rollout(veng, ToolRegistry([py]), tiny_tok, cfg, agent, script)
        p = t.prompts(tiny_tok, 1)
        (tree,) = ro.run(p)
    t.check_tree(tree, cfg, agent, p[0])
    forks = [x for x in tree.trajectories if x.parent_id is not None]
    assert len(forks) == 4
    for x in tree.trajectories:
        assert [c.output.strip() for c in x.traj.tool_calls] == ["42", "45"][: len(x.traj.tool_calls)]
        assert x.traj.finish_reason == "answer"
    # most prompt tokens of all requests (resumes and forks) came from the prefix cache
    cached, prompt = veng.stats["cached_tokens"] - cached0, veng.stats["prompt_tokens"] - prompt0
    assert cached > 0.5 * prompt, (cached, prompt)
    assert not veng.seqs
    assert math.isfinite(tree.trajectories[0].initial_entropy)


def test_serve_scheduler_batches_and_cancels_on_vllm(veng, tiny_tok, monkeypatch):
    """arpo serve agent's engine thread (serve/scheduler.py) over vLLM: concurrent conversations share
    vLLM steps, tool calls round-trip, and a cancelled conversation's vLLM request is aborted."""
    import threading
    import time

    from arpo.serve.scheduler import AgentScheduler, Done, Request, Tokens
    from arpo.settings import AgentConfig
    from arpo.testing import hook_rollout, scripted_hook
    from arpo.tools.base import ToolResult
    from arpo.tools.registry import ToolRegistry

    class Rev:
        name = "python"

        def __call__(self, inp):
            return ToolResult(inp[::-1])

    tool = scripted_hook(tiny_tok, ["<python> abc </python>", " <answer> done </answer>"])
    long = scripted_hook(tiny_tok, ["<answer> " + "tick " * 300])
    sched = AgentScheduler(veng, ToolRegistry([Rev()]), AgentConfig(max_response_tokens=700))
    hook_rollout(sched, lambda seq, logits: (long if seq.tokens[0] == ids(tiny_tok, "L")[0] else tool)(seq, logits))
    real_step, first = veng.step, [True]

    def step():  # hold the first step until all four conversations are submitted
        if first[0]:
            first[0] = False
            deadline = time.time() + 10
            while sched.stats()["submitted"] < 4 and time.time() < deadline:
                time.sleep(0.01)
        return real_step()

    monkeypatch.setattr(veng, "step", step)
    events = {k: [] for k in range(4)}
    done = {k: threading.Event() for k in range(4)}

    def emit(k):
        return lambda ev: (events[k].append(ev), isinstance(ev, Done) and done[k].set())

    try:
        cids = [sched.submit(ids(tiny_tok, q), Request(600, seed=k), emit(k))
                for k, q in enumerate(["Q one", "Q two", "Q three", "L long"])]
        for k in range(3):
            assert done[k].wait(120)
            tr = events[k][-1].trajectory
            assert tr.finish_reason == "answer" and [c.output for c in tr.tool_calls] == ["cba"]
        deadline = time.time() + 60
        while sum(len(e.ids) for e in events[3] if isinstance(e, Tokens)) < 20:
            assert time.time() < deadline
            time.sleep(0.01)
        sched.cancel(cids[3])
        deadline = time.time() + 10
        while veng.seqs or veng._by_req:  # released, and its vLLM request aborted
            assert time.time() < deadline, (list(veng.seqs), veng._by_req)
            time.sleep(0.01)
        assert not done[3].is_set()
        st = sched.stats()
        assert st["batched_steps"] > 0 and st["max_batch"] == 4 and st["cancelled"] == 1 and st["completed"] == 3
    finally:
        sched.close()


@pytest.mark.skipif(os.environ.get("ARPO_TEST_VLLM_MP") != "1",
                    reason="starts a second, multiprocessing engine (20-75 s on 2 cores): set ARPO_TEST_VLLM_MP=1")
def test_multiprocessing_engine_core(setup, tiny_tok):
    """The engine core in a spawned process: pause/append/fork and load_weights (through a safetensors
    file the worker reloads) behave as in-process; logits hooks are refused with a clear error."""
    from arpo.engine.vllm import VLLMEngine
    from arpo.testing import scripted_hook

    _, a, b = setup
    prompts = [ids(tiny_tok, "What is 17 * 23? " * 3)]
    params = SamplingParams(max_len=60, temperature=0.0)
    want_b = HFEngine(b, tiny_tok, eos_token_ids=[-1]).generate(prompts, params)[0].tokens
    with VLLMEngine.from_model(a, tiny_tok, max_model_len=1024, block_size=BLOCK, multiprocessing=True) as eng:
        eng.eos = set()
        sid = eng.add(ids(tiny_tok, "Use python. " * 12), SamplingParams(max_len=150, seed=5, stop=("e",)))
        while eng.seq(sid).status in ("waiting", "running"):
            eng.step()
        n = len(eng.seq(sid).tokens)
        assert eng.seq(sid).status == "paused"
        eng.append(sid, ids(tiny_tok, "\n<result>\n1\n</result>\n"))
        eng.seq(sid).params.stop = ()
        kids = eng.fork(sid, 2)
        while eng.has_unfinished():
            eng.step()
        for k in kids:
            assert eng.seq(k).tokens[:n] == eng.seq(sid).tokens[:n] and eng.cached_tokens(k)[0] > 0
            eng.release(k)
        eng.release(sid)
        eng.load_weights(b)
        assert eng.generate(prompts, params)[0].tokens == want_b
        with pytest.raises(RuntimeError, match="in-process"):
            eng.generate(prompts, SamplingParams(max_len=20, logits_hook=scripted_hook(tiny_tok, ["a"])))


def test_train_with_vllm_engine_pushes_updated_weights(setup, tiny_tok, tmp_path, monkeypatch):
    """`arpo train engine=vllm`: rollouts come from vLLM, and after every update the policy's new
    weights are pushed into it before the next rollout (and the validation) uses it."""
    import json

    from arpo.config import from_dict
    from arpo.engine.vllm import VLLMEngine
    from arpo.recipes import train

    _, a, _ = setup
    model_dir = tmp_path / "model"
    a.save_pretrained(model_dir)
    tiny_tok.save_pretrained(model_dir)
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i), "task": "math"}) + "\n"
                            for i in range(4)))
    w0 = a.model.embed_tokens.weight.detach().clone()
    pushed = []
    orig = VLLMEngine.load_weights

    def spy(self, model):
        pushed.append(float((hf_state_dict(model)["model.embed_tokens.weight"] - w0).abs().max()))
        return orig(self, model)

    monkeypatch.setattr(VLLMEngine, "load_weights", spy)
    cfg = from_dict(TrainConfig, {
        "model": {"name": str(model_dir)}, "data": {"path": str(data)}, "tools": {"enabled": []},
        "agent": {"max_response_tokens": 12}, "rollout": {"group_size": 4, "initial_rollouts": 2,
                                                          "entropy_estimator": "topk"},
        "reward": {"fn": "arpo.testing:toy_reward"}, "steps": 3, "prompts_per_step": 2, "optim": {"lr": 1e-2},
        "engine": "vllm", "engine_options": {"max_model_len": 512, "block_size": BLOCK, "topk_entropy": K},
        "run": {"dir": str(tmp_path / "run"), "save_every": 0, "tensorboard": False, "threads": 1}})
    res = train.run(cfg, quiet=True)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and res["checkpoint"]
    # from_model's initial push (unchanged weights), then one push of updated weights per later step
    assert pushed[0] == 0.0 and len(pushed) == 3 and all(d > 0 for d in pushed[1:]), pushed
