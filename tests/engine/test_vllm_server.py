"""engine vllm_server (arpo.engine.vllm_server.VLLMServerEngine) against one stock `vllm serve` subprocess.

Needs vLLM (the main .venv has none: the server tests skip there). CI runs them in the separate venv:

    OMP_NUM_THREADS=1 .venv-vllm/bin/python -m pytest -q tests/engine/test_vllm_server.py

One server (started with `server_command`, the documented command line, on 127.0.0.1 and a free port)
serves the whole module: a tiny random Llama with head_dim 32 (vLLM's CPU attention has no head_dim 16
kernel). The tests above the fixture need no vLLM and run in the main suite too.
"""

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from arpo.engine import make_engine
from arpo.engine.base import SamplingParams
from arpo.engine.hf import HFEngine
from arpo.engine.sampling import topk_entropy
from arpo.engine.vllm_server import check_server_urls, server_command, server_env
from arpo.errors import ArpoError
from arpo.ports import free_port
from arpo.settings import TrainConfig

# a server start took up to ~9 min on the loaded 2-core machine; it counts toward the first test's timeout
pytestmark = pytest.mark.timeout(1500)
BLOCK = 32  # the server's KV block size (CPU: a multiple of 32) = prefix-cache granularity
K = 10  # top-k log-probs per token


# ---- no vLLM needed ----------------------------------------------------------------------------------
def test_server_urls_are_validated_naming_the_key():
    assert check_server_urls(["http://127.0.0.1:8000/", "https://h:1"]) == ["http://127.0.0.1:8000", "https://h:1"]
    for bad in ([], ["127.0.0.1:8000"], ["http://a:1", "http://a:1"], "ftp://x"):
        with pytest.raises(ArpoError, match="rollout.servers"):
            check_server_urls(bad)


def test_train_config_needs_servers_for_vllm_server():
    from arpo.config import from_dict

    base = {"data": {"path": "x.jsonl"}, "engine": "vllm_server"}
    with pytest.raises(ArpoError, match="rollout.servers"):
        from_dict(TrainConfig, base).validate()
    with pytest.raises(ArpoError, match="rollout.servers"):
        from_dict(TrainConfig, {**base, "rollout": {"servers": ["localhost:8000"]}}).validate()
    with pytest.raises(ArpoError, match="rollout.servers"):
        from_dict(TrainConfig, {"data": {"path": "x.jsonl"}, "rollout": {"servers": ["http://a:1"]}}).validate()


def test_no_server_answering_is_a_clear_error(tiny_tok):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ArpoError, match="no server answered"):
        make_engine("vllm_server", None, tiny_tok, servers=[f"http://127.0.0.1:{port}"])


def test_server_command_has_the_flags_the_engine_relies_on():
    cmd = server_command("/m", 8001, max_model_len=512, block_size=32, python="py")
    line = " ".join(cmd)
    assert cmd[:5] == ["py", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]
    for flag in ("--logprobs-mode processed_logprobs", "--enable-prefix-caching", "--enable-prompt-tokens-details",
                 "--port 8001", "--max-model-len 512", "--block-size 32", "--host 127.0.0.1"):
        assert flag in line
    assert server_env()["VLLM_SERVER_DEV_MODE"] == "1"


def test_rollout_servers_command_prints_the_lines(capsys):
    from arpo.cli import main

    assert main(["rollout-servers", "--model", "/m", "--count", "2", "--gpus", "0+1,2+3", "--tensor-parallel-size",
                 "2", "--port", "8100", "--python", "py", "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("VLLM_SERVER_DEV_MODE=1 CUDA_VISIBLE_DEVICES=0,1 py -m vllm.entrypoints.openai.api_server")
    assert "--port 8101" in out[1] and "CUDA_VISIBLE_DEVICES=2,3" in out[1] and "--tensor-parallel-size 2" in out[1]
    assert out[2] == "rollout.servers=[http://127.0.0.1:8100, http://127.0.0.1:8101]"
    assert main(["rollout-servers", "--model", "/m", "--count", "3", "--gpus", "0,1", "--dry-run"]) == 2
    assert "--gpus: 2 groups for --count 3 servers" in capsys.readouterr().err


def test_fsdp_keeps_no_generation_replica_for_a_remote_engine(tiny_tok):
    """replica=False (engine vllm_server): FSDP shards the policy and no full copy is made for generation;
    the generation view is the sharded policy itself (load_weights gathers it)."""
    import torch.distributed as dist

    from arpo.testing import tiny_model
    from arpo.training.distributed import ParallelModel

    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        m = tiny_model(tiny_tok)
        par = ParallelModel(m, "fsdp", replica=False)
        assert par.rollout is m and not par.replica
        par.sync_rollout()  # nothing to copy
        from torch.distributed.tensor import DTensor

        assert all(isinstance(p, DTensor) for p in m.parameters())
        with_replica = ParallelModel(tiny_model(tiny_tok), "fsdp")
        assert with_replica.replica and not any(isinstance(p, DTensor) for p in with_replica.rollout.parameters())
    finally:
        if started:
            dist.destroy_process_group()


# ---- against a vllm serve subprocess ------------------------------------------------------------------
def _model(tok, seed):
    """The tiny random Llama of test_vllm.py (std 0.2 weights, so greedy text varies with the weights)."""
    from arpo.testing import tiny_model

    m = tiny_model(tok, hidden=64, heads=2, kv_heads=1, seed=seed)
    g = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        for p in m.parameters():
            if p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return m


def start_server(model_dir, log_path, **kw):
    """A `vllm serve` subprocess (this interpreter's vLLM) and its URL, once /v1/models answers."""
    import httpx

    port = free_port()
    env = dict(os.environ, **server_env(kv_cache_gib=1), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    log = open(log_path, "w")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(server_command(str(model_dir), port, python=sys.executable, dtype="float32",
                                           max_model_len=1024, block_size=BLOCK, enforce_eager=True, **kw),
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 900
    while time.time() < deadline:
        if proc.poll() is not None:
            log.close()
            raise RuntimeError(f"vllm serve exited ({proc.returncode}):\n{Path(log_path).read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return proc, url, log
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.kill()
    raise RuntimeError(f"vllm serve did not answer in 900 s:\n{Path(log_path).read_text()[-3000:]}")


def stop_server(proc, log) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


@pytest.fixture(scope="module")
def setup(tiny_tok, tmp_path_factory):
    pytest.importorskip("vllm", reason="vLLM not installed: run scripts/install_vllm.sh")
    d = tmp_path_factory.mktemp("vllm_server")
    a, b = _model(tiny_tok, 0), _model(tiny_tok, 1)
    a.save_pretrained(d / "model")
    tiny_tok.save_pretrained(d / "model")
    reuse = os.environ.get("ARPO_TEST_VLLM_SERVER_URL")  # development: a server already running on policy A
    if reuse:
        yield reuse, a, b, d
        return
    proc, url, log = start_server(d / "model", d / "server.log")
    try:
        yield url, a, b, d
    finally:
        stop_server(proc, log)


@pytest.fixture
def eng(setup, tiny_tok):
    e = make_engine("vllm_server", None, tiny_tok, servers=[setup[0]], topk_entropy=K)
    yield e
    e.close()


@pytest.fixture
def noeos(eng):
    eng.eos = set()  # long random text: never stop at EOS
    return eng


def ids(tok, text):
    return tok(text)["input_ids"]


def assert_matches_recompute(model, seq, tol=1e-4, temperature=1.0):
    """Every generated token's log-prob and top-k entropy equal a from-scratch HF forward's (the
    in-process vLLM tests' check, test_vllm.py)."""
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([seq.tokens])).logits[0].float() / temperature, -1)
    n = 0
    for i, (g, rec_lp, rec_k) in enumerate(zip(seq.gen_mask, seq.logprobs, seq.topk_entropies, strict=True)):
        if not g:
            assert rec_lp == 0.0 and rec_k == 0.0
            continue
        ref = lp[seq.prompt_len + i - 1]
        tok = seq.tokens[seq.prompt_len + i]
        assert abs(float(ref[tok]) - rec_lp) < tol, f"logprob at response token {i}"
        ref_k = float(topk_entropy(ref[None], K, torch.tensor([tok]))[0])
        assert abs(ref_k - rec_k) < tol, f"top-k entropy at response token {i}"
        n += 1
    assert n > 0


def prefix_cache_hits(url) -> float:
    """vllm:prefix_cache_hits_total from the server's Prometheus /metrics."""
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:prefix_cache_hits_total"))


def test_greedy_tokens_and_logprobs_match_hf(noeos, setup, tiny_tok):
    a = setup[1]
    hf = HFEngine(a, tiny_tok, eos_token_ids=[-1], topk_entropy=K)
    prompts = [ids(tiny_tok, "What is 17 * 23?"), ids(tiny_tok, "hello"), ids(tiny_tok, "print(1) " * 5)]
    params = SamplingParams(max_len=48, temperature=0.0)
    want = hf.generate(prompts, params)
    got = noeos.generate(prompts, params)
    for g, w in zip(got, want, strict=True):
        assert g.finish_reason == "length" and len(g.tokens) == 48
        assert g.tokens == w.tokens
        assert len(set(g.response)) > 5
        assert max(abs(x - y) for x, y in zip(g.topk_entropies, w.topk_entropies, strict=True)) < 1e-4
        assert_matches_recompute(a, g)
    # seeded sampling: per-sequence seeds reproduce, log-probs of softmax(logits / T) within 1e-4
    p = ids(tiny_tok, "What is 2 + 2?")
    s1, s2, other = noeos.generate([p, p, ids(tiny_tok, "x")], SamplingParams(max_len=40, seed=7))
    assert s1.tokens == s2.tokens
    (s8,) = noeos.generate([p], SamplingParams(max_len=40, seed=8))
    assert s8.tokens != s1.tokens
    for s in (s1, other, s8):
        assert_matches_recompute(a, s)
    (hot,) = noeos.generate([p], SamplingParams(max_len=40, seed=9, temperature=0.7))
    assert_matches_recompute(a, hot, temperature=0.7)


def test_stop_pause_append_resume_hits_the_prefix_cache(noeos, setup, tiny_tok):
    url, a = setup[0], setup[1]
    sid = noeos.add(ids(tiny_tok, "Use python. " * 12), SamplingParams(max_len=200, seed=5, stop=("e",)))
    while noeos.seq(sid).status in ("waiting", "running"):
        noeos.step()
    s = noeos.seq(sid)
    assert s.status == "paused" and s.stop_text == "e" and "e" in tiny_tok.decode(s.response[-2:])
    n_before = len(s.tokens)
    assert n_before > BLOCK + 1
    hits0 = prefix_cache_hits(url)
    result = ids(tiny_tok, "\n<result>\n391\n</result>\n")
    noeos.append(sid, result)
    s.params.stop = ()
    while noeos.has_unfinished():
        noeos.step()
    assert s.finish_reason == "length" and len(s.tokens) == 200
    assert s.tokens[n_before: n_before + len(result)] == result
    r0 = n_before - s.prompt_len
    assert s.gen_mask[r0: r0 + len(result)] == [0] * len(result)
    assert_matches_recompute(a, s)
    first, resumed = noeos.cached_tokens(sid)
    assert resumed == BLOCK * ((n_before - 1) // BLOCK) and resumed > 0  # every full block of the paused text
    assert prefix_cache_hits(url) - hits0 >= resumed  # and the server's own counter says so


def test_a_refused_request_is_an_error_not_a_dead_server(eng, tiny_tok):
    eng.add(ids(tiny_tok, "hello"), SamplingParams(max_len=20, top_p=7.0))  # vLLM refuses top_p > 1: HTTP 400
    with pytest.raises(ArpoError, match="HTTP 400"):
        while eng.has_unfinished():
            eng.step()
    assert all(s.alive for s in eng.servers) and eng.stats["server_failures"] == 0


def test_stop_regex_closes_the_stream_and_forks_hit_the_cache(noeos, setup, tiny_tok):
    a = setup[1]
    # a regex stop has no server-side equivalent: arpo sees it and closes the stream
    sid = noeos.add(ids(tiny_tok, "Use python. " * 12), SamplingParams(max_len=300, seed=5, stop_regex="e"))
    while noeos.seq(sid).status in ("waiting", "running"):
        noeos.step()
    s = noeos.seq(sid)
    assert s.status == "paused" and s.stop_text == "e" and noeos.stats["aborts"] >= 1
    at = len(s.tokens) - 2
    s.params.stop_regex = None
    kids = noeos.fork(sid, 3, at=at)
    while noeos.has_unfinished():
        noeos.step()
    for k in kids:
        c = noeos.seq(k)
        assert c.parent == sid and c.tokens[:at] == s.tokens[:at] and len(c.tokens) == 300
        (hit,) = noeos.cached_tokens(k)
        assert hit == BLOCK * ((at - 1) // BLOCK) and hit > 0
        assert_matches_recompute(a, c)
    assert len({tuple(noeos.seq(k).tokens) for k in kids}) == 3


def _tree_checks():
    path = Path(__file__).resolve().parents[1] / "rollout" / "test_arpo.py"
    spec = importlib.util.spec_from_file_location("_arpo_tree_checks", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def scripted_requests(script):
    """A request hook that makes the server write script[k] as a sequence's k-th segment (k = appended
    blocks so far), with vLLM's structured outputs: the remote counterpart of testing.scripted_hook."""
    def hook(seq):
        mask = seq.gen_mask
        k = sum(1 for i in range(len(mask)) if mask[i] == 0 and (i + 1 == len(mask) or mask[i + 1] == 1))
        return {"structured_outputs": {"regex": re.escape(script[min(k, len(script) - 1)])}}
    return hook


def test_arpo_trees_with_the_real_python_tool(eng, setup, tiny_tok):
    from arpo.rollout.arpo import ARPORollout
    from arpo.settings import AgentConfig, RolloutConfig
    from arpo.tools.python import PythonTool
    from arpo.tools.registry import ToolRegistry

    url = setup[0]
    t = _tree_checks()
    cfg = RolloutConfig(group_size=6, initial_rollouts=2, entropy_weight=0.0, branch_threshold=0.0, entropy_tokens=2,
                        entropy_estimator="topk", seed=4)
    agent = AgentConfig(max_response_tokens=300)
    eng.request_hook = scripted_requests(["<python> print(6 * 7) </python>", "<python> print(sum(range(10))) </python>",
                                          "<answer> \\boxed{42} </answer>"])
    hits0 = prefix_cache_hits(url)
    with PythonTool(timeout_s=20, pool_size=1) as py:
        p = t.prompts(tiny_tok, 1)
        (tree,) = ARPORollout(eng, ToolRegistry([py]), agent, cfg).run(p)
    t.check_tree(tree, cfg, agent, p[0])
    assert len([x for x in tree.trajectories if x.parent_id is not None]) == 4
    for x in tree.trajectories:
        assert [c.output.strip() for c in x.traj.tool_calls] == ["42", "45"][: len(x.traj.tool_calls)]
        assert x.traj.finish_reason == "answer"
    assert eng.stats["cached_tokens"] > 0.5 * eng.stats["prompt_tokens"], eng.stats
    assert prefix_cache_hits(url) - hits0 >= eng.stats["cached_tokens"]
    assert not eng.seqs


def test_same_trees_in_process_and_remote_greedy(eng, setup, tiny_tok):
    """ARPO with greedy decoding on the HF engine (in-process) and on the server: the same trees."""
    from arpo.rollout.arpo import ARPORollout
    from arpo.settings import AgentConfig, RolloutConfig
    from arpo.tools.registry import ToolRegistry

    t = _tree_checks()
    a = setup[1]
    cfg = RolloutConfig(group_size=4, initial_rollouts=2, entropy_estimator="topk", seed=3)
    agent = AgentConfig(max_response_tokens=40, temperature=0.0)
    ps = t.prompts(tiny_tok, 2)
    hf = HFEngine(a, tiny_tok, topk_entropy=K)
    want = ARPORollout(hf, ToolRegistry([t.Echo()]), agent, cfg).run(ps)
    got = ARPORollout(eng, ToolRegistry([t.Echo()]), agent, cfg).run(ps)
    for w, g in zip(want, got, strict=True):
        assert len(w.trajectories) == len(g.trajectories) == 4
        for x, y in zip(w.trajectories, g.trajectories, strict=True):
            assert (x.parent_id, x.traj.response_ids, x.traj.finish_reason) == \
                   (y.parent_id, y.traj.response_ids, y.traj.finish_reason)
            assert max(abs(p - q) for p, q in zip(x.traj.logprobs, y.traj.logprobs, strict=True)) < 1e-4


def test_disk_weight_sync_switches_the_servers_policy(noeos, setup, tiny_tok):
    _, a, b, _ = setup
    prompts = [ids(tiny_tok, "What is 17 * 23? " * 3), ids(tiny_tok, "print(1) " * 6)]
    params = SamplingParams(max_len=72, temperature=0.0)
    want_a = [s.tokens for s in HFEngine(a, tiny_tok, eos_token_ids=[-1]).generate(prompts, params)]
    want_b = [s.tokens for s in HFEngine(b, tiny_tok, eos_token_ids=[-1]).generate(prompts, params)]
    assert want_a != want_b
    assert [s.tokens for s in noeos.generate(prompts, params)] == want_a  # fills the cache with A's KV
    try:
        assert noeos.load_weights(b) >= 2 * 9 + 2
        got_b = noeos.generate(prompts, params)
        assert [s.tokens for s in got_b] == want_b
        for s in got_b:
            assert_matches_recompute(b, s)
            assert noeos.cached_tokens(s.sid) == [0]  # A's cached KV was dropped
    finally:  # a state dict without the tied head's name works too
        noeos.load_weights({k: v for k, v in a.state_dict().items() if k != "lm_head.weight"})
    assert [s.tokens for s in noeos.generate(prompts, params)] == want_a
    assert noeos.stats["weight_syncs"] == 2


@pytest.mark.skipif(os.environ.get("ARPO_TEST_VLLM_SERVERS") != "1",
                    reason="starts a second vllm serve (20-75 s on 2 cores): set ARPO_TEST_VLLM_SERVERS=1")
def test_two_servers_trees_stick_and_a_dead_server_fails_only_its_trees(setup, tiny_tok):
    """Prompts spread over two servers by load, every sequence of a tree stays on its server, and a server
    killed while its trees wait on a tool result fails over only those trees: they resume on the other
    server and continue exactly as the model would (greedy = the HF engine from the same tokens)."""
    url, a, _, d = setup
    proc, url2, log = start_server(d / "model", d / "server2.log")
    try:
        e = make_engine("vllm_server", None, tiny_tok, servers=[url, url2], topk_entropy=K)
        e.eos = set()
        # the first segment of every sequence is a tool call (scripted), then greedy text up to 120 tokens
        e.request_hook = lambda seq: ({} if 0 in seq.gen_mask else
                                      {"structured_outputs": {"regex": re.escape(" <python> x </python>")}})
        ps = [ids(tiny_tok, f"Question {i}: what is {i} * 7?") for i in range(4)]
        sids = [e.add(p, SamplingParams(max_len=120, temperature=0.0, stop=("</python>",))) for p in ps]
        kids = {s: e.fork(s, 1, at=len(ps[i])) for i, s in enumerate(sids)}
        servers = {s: e.server_of(s) for s in sids}
        n_first = list(servers.values()).count(url)
        assert n_first == 2, (servers, e.server_stats())  # least busy: two prompts each
        for s, ks in kids.items():
            assert all(e.server_of(k) == servers[s] for k in ks)  # the tree sticks to its server
        while e.has_unfinished():
            e.step()
        every = sids + [k for ks in kids.values() for k in ks]
        assert all(e.seq(k).status == "paused" and e.seq(k).stop_text == "</python>" for k in every)
        stop_server(proc, log)  # kill server 2 while its trees wait on a tool
        result = ids(tiny_tok, "\n<result>\nx\n</result>\n")
        for k in every:
            e.seq(k).params.stop = ()
            e.append(k, result)
        while e.has_unfinished():
            e.step()
        assert e.stats["server_failures"] == 1
        hf = HFEngine(a, tiny_tok, eos_token_ids=[-1])
        for s in sids:
            tree = [s, *kids[s]]
            moved = servers[s] == url2
            for k in tree:
                q = e.seq(k)
                assert len(q.tokens) == 120 and e._st[k].retries == (1 if moved else 0)
                assert e.server_of(k) == url  # server 2's trees moved; server 1's stayed
                n = len(q.tokens) - q.gen_mask[::-1].index(0)  # after the appended result
                want = hf.generate([q.tokens[:n]], SamplingParams(max_len=120, temperature=0.0))[0].tokens
                assert q.tokens == want  # no token lost or doubled by the failover
        e.close()
    finally:
        if proc.poll() is None:
            stop_server(proc, log)


def _data(tmp_path):
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i), "task": "math"})
                            + "\n" for i in range(4)))
    return data


def _server_continues_like_hf(url, tok, model) -> None:
    """The server's greedy continuation (with whatever weights it holds now) equals the HF engine's on `model`."""
    e = make_engine("vllm_server", None, tok, servers=[url], topk_entropy=K)
    try:
        e.eos = set()
        prompts = [ids(tok, "What is 3 + 3?"), ids(tok, "print(1) " * 4)]
        params = SamplingParams(max_len=40, temperature=0.0)
        want = [s.tokens for s in HFEngine(model, tok, eos_token_ids=[-1]).generate(prompts, params)]
        assert [s.tokens for s in e.generate(prompts, params)] == want
    finally:
        e.close()


def test_eval_command_on_the_server(setup, tmp_path, capsys):
    """`arpo eval --engine vllm_server --servers URL`: only the tokenizer is loaded here; greedy answers
    equal --engine hf's on the same model."""
    from arpo.cli import main

    url, _, _, d = setup
    data = _data(tmp_path)
    outs = {}
    for engine, extra in (("vllm_server", ["--servers", url]), ("hf", [])):
        out = tmp_path / f"{engine}.json"
        assert main(["eval", "--model", str(d / "model"), "--data", str(data), "--limit", "2", "--tools", "",
                     "--temperature", "0", "--max-response-tokens", "24", "--engine", engine, *extra,
                     "--out", str(out), "--quiet"]) == 0, capsys.readouterr().err
        outs[engine] = json.loads(out.read_text())
    recs = [[r["text"] for r in outs[e]["records"][str(data)]] for e in outs]
    assert recs[0] == recs[1] and all(recs[0]), recs
    assert main(["eval", "--model", str(d / "model"), "--data", str(data), "--servers", url]) == 2
    assert "--servers goes with --engine vllm_server" in capsys.readouterr().err


def _serve_answers(cfg, questions) -> list[str]:
    """Start `arpo serve agent` (serve/app.agent_server) for `cfg` in a thread, ask each question greedily
    over HTTP, return the answers' content."""
    import threading

    import httpx

    from arpo.serve.app import agent_server

    with agent_server(cfg) as server:
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.time() + 60
        while not server.started:
            assert time.time() < deadline and thread.is_alive(), "serve agent did not start"
            time.sleep(0.05)
        try:
            out = []
            for q in questions:
                r = httpx.post(f"http://127.0.0.1:{cfg.port}/v1/chat/completions", timeout=120,
                               json={"model": "m", "messages": [{"role": "user", "content": q}],
                                     "temperature": 0, "max_tokens": 24})
                assert r.status_code == 200, r.text
                out.append(r.json()["choices"][0]["message"]["content"])
            return out
        finally:
            server.should_exit = True
            thread.join(10)


def test_serve_agent_on_the_server(setup, tiny_tok):
    """`arpo serve agent --engine vllm_server --servers URL`: the OpenAI-compatible agent API over the
    remote engine (only the tokenizer is loaded here) answers greedily as --engine hf does on the same
    model; --servers without --engine vllm_server is an error."""
    from arpo.cli import main
    from arpo.settings import AgentConfig, ServeConfig, ToolsConfig

    url, _, _, d = setup
    questions = ["What is 3 + 3?", "Name a color."]
    answers = {}
    for engine, servers in (("vllm_server", [url]), ("hf", [])):
        cfg = ServeConfig(model=str(d / "model"), served_model_name="m", engine=engine, servers=servers,
                          device="cpu", agent=AgentConfig(max_tool_calls=0, max_response_tokens=24),
                          tools=ToolsConfig(enabled=[]), port=free_port(), log_level="warning")
        answers[engine] = _serve_answers(cfg, questions)
    assert answers["vllm_server"] == answers["hf"] and any(answers["hf"]), answers
    assert main(["serve", "agent", "--model", str(d / "model"), "--servers", url]) == 2


def test_torchrun_fsdp_trains_with_vllm_server_and_syncs_weights(setup, tiny_tok, tmp_path):
    """`torchrun --nproc-per-node 2 -m arpo train engine=vllm_server` (gloo, FSDP2, fp32): both ranks roll
    out on the server, no rank holds a generation replica, and before step 2's rollout the ranks' gathered
    weights reach the server by the disk path: afterwards it continues exactly like the HF engine on the
    step-1 checkpoint."""
    from safetensors.torch import load_file

    url, a, _, d = setup
    run_dir = tmp_path / "run"
    ov = {"model.name": d / "model", "data.path": _data(tmp_path), "tools.enabled": "[]",
          "agent.max_response_tokens": 12, "rollout.group_size": 4, "rollout.initial_rollouts": 2,
          "rollout.entropy_estimator": "topk", "rollout.servers": f"[{url}]", "engine": "vllm_server",
          "reward.fn": "arpo.testing:toy_reward", "steps": 2, "prompts_per_step": 2, "optim.lr": 1e-2,
          "run.dir": run_dir, "run.save_every": 1, "run.tensorboard": "false", "run.distributed": "fsdp"}
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                        "-m", "arpo", "train", *[f"{k}={v}" for k, v in ov.items()], "run.threads=1", "--quiet"],
                       env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [r["step"] for r in rows] == [1, 2]
    step1 = load_file(str(run_dir / "checkpoints" / "step_000001" / "model" / "model.safetensors"))
    m1 = _model(tiny_tok, 0)
    m1.load_state_dict(step1, strict=False)
    assert any(not torch.equal(v, a.state_dict()[k]) for k, v in step1.items())  # step 1 changed the policy
    try:
        _server_continues_like_hf(url, tiny_tok, m1)
    finally:
        e = make_engine("vllm_server", None, tiny_tok, servers=[url])
        e.load_weights(a)  # back to policy A for the other tests
        e.close()


def test_train_with_vllm_server_engine(setup, tiny_tok, tmp_path, monkeypatch):
    """`arpo train engine=vllm_server`: rollouts on the server, the policy's weights pushed to it (disk sync)
    before the first rollout and after every update; the server then generates like the HF engine on them."""
    from arpo.config import from_dict
    from arpo.engine.vllm import hf_state_dict
    from arpo.engine.vllm_server import VLLMServerEngine
    from arpo.recipes import train

    url, a, _, d = setup
    w0 = a.model.embed_tokens.weight.detach().clone()
    pushed = []
    orig = VLLMServerEngine.load_weights

    def spy(self, model):
        pushed.append(float((hf_state_dict(model)["model.embed_tokens.weight"] - w0).abs().max()))
        n = orig(self, model)
        _server_continues_like_hf(url, tiny_tok, model)  # the server now generates with exactly these weights
        return n

    monkeypatch.setattr(VLLMServerEngine, "load_weights", spy)
    cfg = from_dict(TrainConfig, {
        "model": {"name": str(d / "model")}, "data": {"path": str(_data(tmp_path))}, "tools": {"enabled": []},
        "agent": {"max_response_tokens": 12},
        "rollout": {"group_size": 4, "initial_rollouts": 2, "entropy_estimator": "topk", "servers": [url]},
        "reward": {"fn": "arpo.testing:toy_reward"}, "steps": 2, "prompts_per_step": 2, "optim": {"lr": 1e-2},
        "engine": "vllm_server", "engine_options": {"topk_entropy": K},
        "run": {"dir": str(tmp_path / "run"), "save_every": 0, "tensorboard": False, "threads": 1}})
    try:
        res = train.run(cfg, quiet=True)
    finally:
        monkeypatch.undo()
        e = make_engine("vllm_server", None, tiny_tok, servers=[url])
        e.load_weights(a)  # back to policy A for the other tests
        e.close()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and res["checkpoint"]
    # the initial push (unchanged weights), then one push of updated weights before step 2's rollout
    assert len(pushed) == 2 and pushed[0] == 0.0 and pushed[1] > 0, pushed


def test_one_step_off_policy_on_the_server(setup, tiny_tok, tmp_path, monkeypatch):
    """`rollout.max_off_policy_steps: 1` with `engine: vllm_server` (issue 39 item 3): step n's trees are
    generated on the server while step n−1 trains, each tree under one policy version; weights reach the
    server only between batches of trees, and after each push it generates like the HF engine on them."""
    from arpo.config import from_dict
    from arpo.engine.vllm import hf_state_dict
    from arpo.engine.vllm_server import VLLMServerEngine
    from arpo.recipes import train
    from arpo.training.rollout_log import read_run_trees

    url, a, _, d = setup
    w0 = a.model.embed_tokens.weight.detach().clone()
    pushed = []
    orig = VLLMServerEngine.load_weights

    def spy(self, model):
        pushed.append(float((hf_state_dict(model)["model.embed_tokens.weight"] - w0).abs().max()))
        n = orig(self, model)
        _server_continues_like_hf(url, tiny_tok, model)  # no tree in flight: the server is ours to probe
        return n

    monkeypatch.setattr(VLLMServerEngine, "load_weights", spy)
    run = tmp_path / "run"
    cfg = from_dict(TrainConfig, {
        "model": {"name": str(d / "model")}, "data": {"path": str(_data(tmp_path))}, "tools": {"enabled": []},
        "agent": {"max_response_tokens": 12},
        "rollout": {"group_size": 4, "initial_rollouts": 2, "entropy_estimator": "topk", "servers": [url],
                    "max_off_policy_steps": 1},
        "reward": {"fn": "arpo.testing:toy_reward"}, "steps": 3, "prompts_per_step": 2, "optim": {"lr": 1e-2},
        "engine": "vllm_server", "engine_options": {"topk_entropy": K},
        "run": {"dir": str(run), "save_every": 0, "tensorboard": False, "threads": 1, "save_rollouts": 1}})
    try:
        train.run(cfg, quiet=True)
    finally:
        monkeypatch.undo()
        e = make_engine("vllm_server", None, tiny_tok, servers=[url])
        e.load_weights(a)  # back to policy A for the other tests
        e.close()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["policy_lag_max"] for r in rows] == [0, 1, 1] and all(r["stale_trees_rejected"] == 0 for r in rows)
    # step 1's trees: version 0 (generated first); steps 2 and 3: versions 0 and 1 (one step behind)
    assert sorted({(t["step"], t["policy_version"]) for t in read_run_trees(run)}) == [(1, 0), (2, 0), (3, 1)]
    # version 0 pushed before the first rollout, version 1 between batches, version 2 after the last step
    # (the sync runs on every step: under FSDP the replica that computes π_old is the synced one)
    assert len(pushed) == 3 and pushed[0] == 0.0 and 0 < pushed[1] and 0 < pushed[2], pushed


def test_torchrun_one_step_off_policy_on_the_shared_server(setup, tiny_tok, tmp_path):
    """`torchrun --nproc-per-node 2` (gloo, FSDP2, fp32) with `rollout.max_off_policy_steps: 1` on one shared
    server: both ranks' rollout threads generate step n+1's trees there while step n trains; every rank
    joins its batch and passes a barrier before rank 0 pushes (training/trainer.py off_policy_groups).
    Lag 0, 1, 1, nothing stale, each tree under one version, each rank's in-flight trees checkpointed in
    its own file, and the last push (version 2, before the last step) left the server generating like the
    HF engine on the step-2 checkpoint."""
    from safetensors.torch import load_file

    from arpo.training.rollout_log import read_run_trees

    url, a, _, d = setup
    run_dir = tmp_path / "run"
    ov = {"model.name": d / "model", "data.path": _data(tmp_path), "tools.enabled": "[]",
          "agent.max_response_tokens": 12, "rollout.group_size": 4, "rollout.initial_rollouts": 2,
          "rollout.entropy_estimator": "topk", "rollout.servers": f"[{url}]", "engine": "vllm_server",
          "rollout.max_off_policy_steps": 1, "reward.fn": "arpo.testing:toy_reward", "steps": 3,
          "prompts_per_step": 2, "optim.lr": 1e-2, "run.dir": run_dir, "run.save_every": 1,
          "run.keep_checkpoints": 5, "run.save_rollouts": 1, "run.tensorboard": "false", "run.distributed": "fsdp"}
    env = dict(os.environ, OMP_NUM_THREADS="1")
    try:
        p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                            "-m", "arpo", "train", *[f"{k}={v}" for k, v in ov.items()], "run.threads=1", "--quiet"],
                           env=env, capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, p.stderr[-4000:]
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
        assert [r["step"] for r in rows] == [1, 2, 3] and all(r["trajectories"] == 8 for r in rows)
        assert [r["policy_lag_max"] for r in rows] == [0, 1, 1] and all(r["stale_trees_rejected"] == 0 for r in rows)
        assert sorted({(t["step"], t["policy_version"]) for t in read_run_trees(run_dir)}) == [(1, 0), (2, 0), (3, 1)]
        info = json.loads((run_dir / "checkpoints" / "step_000002" / "state.json").read_text())["in_flight"]
        # JSON + safetensors, no pickle (issue 61)
        assert info["files"] == ["in_flight.rank0.json", "in_flight.rank1.json"] and info["policy_versions"] == [1]
        step2 = load_file(str(run_dir / "checkpoints" / "step_000002" / "model" / "model.safetensors"))
        m2 = _model(tiny_tok, 0)
        m2.load_state_dict(step2, strict=False)
        _server_continues_like_hf(url, tiny_tok, m2)
    finally:
        e = make_engine("vllm_server", None, tiny_tok, servers=[url])
        e.load_weights(a)  # back to policy A for the other tests
        e.close()
