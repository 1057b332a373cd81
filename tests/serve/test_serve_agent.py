"""`arpo serve agent` against the official `openai` client: a real server (uvicorn, in this process, on a
free port) over the HF engine with the tiny random model, whose outputs are scripted per question
(arpo.testing.scripted_hook) so that the agent makes known tool calls through deterministic tools."""

import json
import threading
import time

import pytest

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

from arpo.data.prompts import render_prompt, system_prompt  # noqa: E402
from arpo.engine.hf import HFEngine  # noqa: E402
from arpo.ports import free_port  # noqa: E402
from arpo.serve import openai_format as fmt  # noqa: E402
from arpo.serve.app import create_app  # noqa: E402
from arpo.serve.scheduler import AgentScheduler  # noqa: E402
from arpo.settings import AgentConfig  # noqa: E402
from arpo.testing import hook_rollout, scripted_hook  # noqa: E402
from arpo.tools.base import ToolResult  # noqa: E402
from arpo.tools.registry import ToolRegistry  # noqa: E402

MODEL = "tiny-agent"
SYSTEM = system_prompt("math", ["python", "search"])
TOOL_SCRIPT = ["<think> go </think> <python> abc </python>", " <answer> \\boxed{cba} </answer>"]
SCRIPTS = {  # question -> (segments the model writes, seconds per token)
    "Q-TOOL": (TOOL_SCRIPT, 0.0),
    "Q-FAIL": (["<search> boom </search>", " <calc> 1 </calc>", " <answer> sorry </answer>"], 0.0),
    "Q-STOP": (["<answer> alpha beta gamma </answer>"], 0.0),
    "Q-LONG": (["<answer> " + "tick " * 300], 0.0),
    "Q-SLOW": (["<answer> " + "tick " * 300], 0.02),
}


class Reverse:
    name = "python"

    def __call__(self, inp):
        return ToolResult(inp[::-1])


class Broken:
    name = "search"

    def __call__(self, inp):
        raise ConnectionError("index unreachable")


def routed_hook(tok, scripts):
    """Each conversation writes the script of the question in its prompt (none: the model's own tokens)."""
    hooks = {q: (scripted_hook(tok, segs), delay) for q, (segs, delay) in scripts.items()}
    route = {}

    def hook(seq, logits):
        key = route.get(seq.sid)
        if key is None:
            text = tok.decode(seq.tokens[: seq.prompt_len])
            key = route[seq.sid] = next((q for q in hooks if q in text), "")
        if not key:
            return logits
        h, delay = hooks[key]
        time.sleep(delay)
        return h(seq, logits)

    return hook


@pytest.fixture(scope="module")
def served(tiny_lm, tiny_tok):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model decodes fastest on one thread, the engine thread's own
    engine = HFEngine(tiny_lm, tiny_tok)
    sched = AgentScheduler(engine, ToolRegistry([Reverse(), Broken()]),
                           AgentConfig(max_tool_calls=3, max_response_tokens=200, temperature=1.0))
    hook_rollout(sched, routed_hook(tiny_tok, SCRIPTS))
    app = create_app(sched, tiny_tok, model_name=MODEL, system=SYSTEM, context_len=2048, max_response_tokens=200)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started:
        assert time.time() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.02)
    url = f"http://127.0.0.1:{server.config.port}/v1"
    yield {"url": url, "sched": sched, "engine": engine, "app": app}
    server.should_exit = True
    thread.join(10)
    sched.close()
    torch.set_num_threads(threads)


@pytest.fixture()
def client(served):
    c = openai.OpenAI(base_url=served["url"], api_key="unused", max_retries=0, timeout=60)
    yield c
    c.close()


def ask(client, q, **kw):
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": q}], **kw)


def _wait(cond, timeout=10.0):
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            return False
        time.sleep(0.01)
    return True


# ---- responses ---------------------------------------------------------------------------------------
def test_models_list_names_the_served_agent(client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other")


def test_tool_calls_and_results_come_back_in_agent_messages(client):
    r = ask(client, "Q-TOOL", seed=0)
    msg, ch = r.choices[0].message, r.choices[0]
    assert msg.content == " <answer> \\boxed{cba} </answer>"  # the final turn, after the tool result
    assert msg.tool_calls is None  # the call already ran on the server: nothing for the client to run
    assert ch.finish_reason == "stop" and ch.model_extra["agent_finish_reason"] == "answer"
    call_id = f"call_{r.id.removeprefix('chatcmpl-')}_0_0"
    assert msg.model_extra["agent_messages"] == [
        {"role": "assistant", "content": TOOL_SCRIPT[0],
         "tool_calls": [{"id": call_id, "type": "function",
                         "function": {"name": "python", "arguments": '{"input": "abc"}'}}]},
        {"role": "tool", "tool_call_id": call_id, "name": "python", "content": "cba", "ok": True},
    ]
    # usage: generated tokens are the two scripted turns; the appended result counts apart
    assert r.usage.completion_tokens > 0 and r.usage.model_extra["tool_result_tokens"] > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_a_failing_tool_is_an_error_result_inside_the_conversation(client):
    r = ask(client, "Q-FAIL")  # <search> raises ConnectionError, <calc> is no tool: both are results, not a 500
    tool_msgs = [m for m in r.choices[0].message.model_extra["agent_messages"] if m["role"] == "tool"]
    assert [m["ok"] for m in tool_msgs] == [False, False]
    assert "index unreachable" in tool_msgs[0]["content"] and "unknown tool <calc>" in tool_msgs[1]["content"]
    assert r.choices[0].message.content == " <answer> sorry </answer>"


def test_stop_strings_end_the_answer_and_are_not_returned(client):
    r = ask(client, "Q-STOP", stop=[" beta"])
    assert r.choices[0].message.content == "<answer> alpha"
    assert r.choices[0].finish_reason == "stop" and r.choices[0].model_extra["agent_finish_reason"] == "stop"
    chunks = list(ask(client, "Q-STOP", stop=" beta", stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "<answer> alpha"


def test_n_choices_are_independent_conversations(client):
    r = ask(client, "Q-TOOL", n=3, seed=5)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.message.content == " <answer> \\boxed{cba} </answer>" for c in r.choices)
    ids = [c.message.model_extra["agent_messages"][0]["tool_calls"][0]["id"] for c in r.choices]
    assert len(set(ids)) == 3


def test_max_tokens_is_the_response_budget(client):
    r = ask(client, "Q-LONG", max_tokens=12)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 12


def test_streaming_sends_the_final_text_token_by_token(client):
    full = ask(client, "Q-TOOL", seed=1)
    chunks = list(ask(client, "Q-TOOL", seed=1, stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    texts = [d.content for d in deltas if d.content]
    assert "".join(texts) == full.choices[0].message.content
    assert len(texts) > 3  # streamed as generated, not in one piece at the end
    steps = [m for d in deltas for m in (d.model_extra or {}).get("agent_messages", [])]

    def no_ids(msgs):
        return json.loads(json.dumps(msgs).replace(chunks[0].id.removeprefix("chatcmpl-"), "X").replace(
            full.id.removeprefix("chatcmpl-"), "X"))

    assert no_ids(steps) == no_ids(full.choices[0].message.model_extra["agent_messages"])
    # the tool call is announced before the final text starts
    first_text = next(i for i, d in enumerate(deltas) if d.content)
    assert any((d.model_extra or {}).get("agent_messages") for d in deltas[:first_text])
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_history_with_agent_messages_renders_what_the_model_saw(client, served, tiny_tok):
    r = ask(client, "Q-TOOL", seed=2)
    m = r.choices[0].message
    history = ([{"role": "user", "content": "Q-TOOL"}] + m.model_extra["agent_messages"]
               + [{"role": "assistant", "content": m.content}, {"role": "user", "content": "and now?"}])
    turns = fmt.chat_turns([fmt.Message(**x) for x in history], SYSTEM)
    assert [t["role"] for t in turns] == ["system", "user", "assistant", "user"]
    assert turns[2]["content"] == (TOOL_SCRIPT[0] + "\n<result>\ncba\n</result>\n" + TOOL_SCRIPT[1])
    r2 = client.chat.completions.create(model=MODEL, messages=history)
    assert r2.choices[0].finish_reason in ("stop", "length")


def test_one_user_message_is_rendered_like_arpo_chat(tiny_tok):
    msgs = [fmt.Message(role="user", content="What is 2+2?")]
    assert fmt.render_messages(tiny_tok, msgs, SYSTEM) == render_prompt(tiny_tok, "What is 2+2?", SYSTEM)
    # a client's system message is appended to the agent's, which the protocol needs
    with_sys = fmt.chat_turns([fmt.Message(role="system", content="Be brief."), *msgs], SYSTEM)
    assert with_sys[0] == {"role": "system", "content": SYSTEM + "\n\nBe brief."}


# ---- batching and cancellation -------------------------------------------------------------------------
def test_concurrent_requests_share_decode_steps(client, served, monkeypatch):
    sched, engine = served["sched"], served["engine"]
    before = sched.stats()
    real_step = engine.step
    gate = {"first": True}

    def step():  # hold the first step until all four requests are in (admission happens between steps)
        if gate["first"]:
            gate["first"] = False
            _wait(lambda: sched.stats()["submitted"] >= before["submitted"] + 4)
        return real_step()

    monkeypatch.setattr(engine, "step", step)
    out = [None] * 4

    def one(i):
        out[i] = ask(client, "Q-TOOL", seed=10 + i)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(r.choices[0].message.content == " <answer> \\boxed{cba} </answer>" for r in out)
    after = sched.stats()
    tokens = sum(r.usage.completion_tokens for r in out)
    steps = after["steps"] - before["steps"]
    assert steps < tokens / 2  # one at a time would take one step per token
    assert after["batched_steps"] - before["batched_steps"] >= tokens / 8
    assert after["max_batch"] >= 4
    d_forwards = after["engine"]["forwards"] - before["engine"]["forwards"]
    d_decoded = after["engine"]["decode_tokens"] - before["engine"]["decode_tokens"]
    assert d_decoded >= 2.5 * d_forwards - 8  # the engine decoded several conversations per forward


def _questions_in_engine(engine, tok) -> set[str]:
    """The scripted questions whose sequences the engine holds (read from another thread: retried)."""
    for _ in range(100):
        try:
            prompts = [tok.decode(s.tokens[: s.prompt_len]) for s in list(engine.seqs.values())]
            return {q for q in SCRIPTS for p in prompts if q in p}
        except RuntimeError:  # the engine thread changed the dict meanwhile
            time.sleep(0.001)
    raise AssertionError("engine.seqs never settled")


def test_closing_a_stream_cancels_it_without_disturbing_others(client, served, tiny_tok):
    sched, engine = served["sched"], served["engine"]
    before = sched.stats()
    other = {}
    t = threading.Thread(target=lambda: other.setdefault("r", ask(client, "Q-TOOL", seed=3)))
    stream = ask(client, "Q-SLOW", stream=True, max_tokens=1000)  # would take >= 6 s
    t.start()
    got = 0
    for c in stream:
        got += bool(c.choices and c.choices[0].delta.content)
        if got >= 3:
            break
    assert "Q-SLOW" in _questions_in_engine(engine, tiny_tok)
    stream.close()
    t0 = time.time()
    assert _wait(lambda: "Q-SLOW" not in _questions_in_engine(engine, tiny_tok), 5)
    released_s = time.time() - t0
    assert sched.stats()["cancelled"] == before["cancelled"] + 1
    t.join(30)
    assert other["r"].choices[0].message.content == " <answer> \\boxed{cba} </answer>"
    assert _wait(lambda: not engine.seqs and sched.stats()["live"] == 0, 5)  # nothing left behind
    assert sched.stats()["completed"] == before["completed"] + 1  # the cancelled one never completed
    assert released_s < 1.0  # README: "within a fraction of a second"


def test_a_client_that_times_out_cancels_its_request(served):
    sched, engine = served["sched"], served["engine"]
    before = sched.stats()
    impatient = openai.OpenAI(base_url=served["url"], api_key="unused", max_retries=0, timeout=0.7)
    with pytest.raises(openai.APITimeoutError):
        ask(impatient, "Q-SLOW", max_tokens=1000)  # would take >= 6 s
    assert _wait(lambda: sched.stats()["cancelled"] == before["cancelled"] + 1, 5)
    assert _wait(lambda: not engine.seqs, 5)
    assert sched.stats()["completed"] == before["completed"]
    impatient.close()


def test_an_engine_failure_is_a_500_and_the_server_keeps_serving(client, served, monkeypatch):
    engine = served["engine"]
    real_step = engine.step
    calls = {"n": 0}

    def step():
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("device lost")
        return real_step()

    monkeypatch.setattr(engine, "step", step)
    with pytest.raises(openai.InternalServerError) as e:
        ask(client, "Q-TOOL")
    assert "device lost" in e.value.message and e.value.type == "server_error"
    assert ask(client, "Q-TOOL").choices[0].message.content == " <answer> \\boxed{cba} </answer>"
    assert not engine.seqs


# ---- bad requests --------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, status, param, code", [
    ({"model": "gpt-4"}, 404, "model", "model_not_found"),
    ({"temperature": 3}, 400, "temperature", "invalid_value"),
    ({"top_p": 0}, 400, "top_p", "invalid_value"),
    ({"n": 0}, 400, "n", "invalid_value"),
    ({"max_tokens": 0}, 400, "max_tokens", "invalid_value"),
    ({"max_tokens": 5000}, 400, "max_tokens", "context_length_exceeded"),
    ({"stop": ["a", "b", "c", "d", "e"]}, 400, "stop", None),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools", "unsupported_parameter"),
    ({"logprobs": True}, 400, "logprobs", "unsupported_parameter"),
    ({"extra_body": {"best_of": 2}}, 400, "best_of", "unrecognized_argument"),
    ({"messages": []}, 400, "messages", "invalid_value"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]}, 400, "messages", None),
    ({"messages": [{"role": "tool", "content": "x", "tool_call_id": "a"}]}, 400, "messages[0]", None),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400,
     "messages[0].content", None),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role", "invalid_value"),
    ({"messages": [{"role": "user", "content": None}]}, 400, "messages.0", "invalid_value"),  # was 200
])
def test_bad_requests_get_4xx_in_openai_format(client, kwargs, status, param, code):
    args = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]} | kwargs
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(**args)
    assert e.value.status_code == status
    assert set(e.value.body) == {"message", "type", "param", "code"}  # the client unwraps {"error": ...}
    assert e.value.param == param and e.value.code == code and e.value.message


def test_invalid_json_and_api_key(served, tiny_tok):
    from starlette.testclient import TestClient

    http = TestClient(served["app"], base_url="http://127.0.0.1")  # a loopback Host (http_guard)
    r = http.post("/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    assert http.get("/v1/nothing").json()["error"]["message"] == "Not Found"
    keyed = TestClient(create_app(served["sched"], tiny_tok, model_name=MODEL, system=SYSTEM, context_len=2048,
                                  max_response_tokens=8, api_key="sekret"), base_url="http://127.0.0.1")
    assert keyed.get("/v1/models").status_code == 401
    assert keyed.get("/v1/models", headers={"authorization": "Bearer sekret"}).json()["data"][0]["id"] == MODEL


@pytest.mark.parametrize("stops", [(), ("gamma",)])
def test_final_text_stream_is_incremental_and_exact(tiny_tok, stops):
    text = "<think> héllo 日本 </think> <answer> ünï ✓ beta gamma delta </answer>"
    ids = tiny_tok.encode(text, add_special_tokens=False)
    content = fmt.final_text(fmt.decode(tiny_tok, ids), stops[0] if stops else None)
    s = fmt.FinalTextStream(tiny_tok, stops)
    sent = []
    for k, t in enumerate(ids):
        sent.append(s.tokens([t]))
        if "<answer>" not in fmt.decode(tiny_tok, ids[: k + 1]):
            assert not "".join(sent)  # held while the turn may still become a tool call
        assert "\ufffd" not in sent[-1]  # never half a character
        assert not stops or "gamma" not in "".join(sent)  # never (part of) a stop string
    assert sum(bool(x) for x in sent) > 10  # token by token after <answer>
    assert "".join(sent) + s.finish(content) == content


# ---- native function calling (agent.tool_format: json) -------------------------------------------------
JSON_TURNS = [
    '<think> two at once </think><tool_call>\n{"name": "echo", "arguments": {"text": "abc"}}\n</tool_call>'
    '<tool_call>\n{"name": "echo", "arguments": {"text": "xy"}}\n</tool_call>',
    "<answer> \\boxed{cba} </answer>",
]


def test_json_format_agent_messages_carry_several_calls_per_turn_and_round_trip(tiny_lm):
    """A json-format agent (Qwen-style template with tools): one pause with two calls becomes one
    assistant message with two OpenAI tool_calls (parsed arguments) and two tool messages; sending them
    back as history renders the same tokens the model saw."""
    import torch
    from starlette.testclient import TestClient

    from arpo.testing import echo, qwen_style_tokenizer
    from arpo.tools.plugins.function import as_tool

    tok = qwen_style_tokenizer()
    reg = ToolRegistry([as_tool(echo)])
    system = system_prompt("math", reg, tool_format="json")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    sched = AgentScheduler(HFEngine(tiny_lm, tok), reg, AgentConfig(max_tool_calls=3, max_response_tokens=300,
                                                                      temperature=1.0, tool_format="json"))
    try:
        hook_rollout(sched, routed_hook(tok, {"Q-JSON": (JSON_TURNS, 0.0)}))
        app = create_app(sched, tok, model_name=MODEL, system=system, context_len=2048, max_response_tokens=300)
        http = TestClient(app, base_url="http://127.0.0.1")
        q = [{"role": "user", "content": "Q-JSON"}]
        r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": q, "seed": 0}).json()
        msg = r["choices"][0]["message"]
        assert r["choices"][0]["agent_finish_reason"] == "answer"
        assert msg["content"] == JSON_TURNS[1]
        call, *tools = msg["agent_messages"]
        assert call["role"] == "assistant" and call["content"].startswith(JSON_TURNS[0])
        args = [json.loads(tc["function"]["arguments"]) for tc in call["tool_calls"]]
        assert args == [{"text": "abc"}, {"text": "xy"}]
        assert [(t["role"], t["name"], t["content"], t["ok"]) for t in tools] == [
            ("tool", "echo", "cba", True), ("tool", "echo", "yx", True)]
        assert [t["tool_call_id"] for t in tools] == [tc["id"] for tc in call["tool_calls"]]
        # the history renders what the model saw: prompt + its turns + the template-rendered results
        history = [fmt.Message(**x) for x in q + msg["agent_messages"]
                   + [{"role": "user", "content": "again"}]]
        text = tok.decode(fmt.render_messages(tok, history, system, reg, "json"))
        seen = tok.decode(fmt.render_messages(tok, [fmt.Message(**q[0])], system, reg, "json"))
        assert text.startswith(seen + JSON_TURNS[0])
        assert "<tool_response>\ncba\n</tool_response>\n<tool_response>\nyx\n</tool_response>" in text
        assert text.count("<tool_call>") == seen.count("<tool_call>") + 2  # the calls once, not added again
    finally:
        sched.close()
        torch.set_num_threads(threads)
