"""Your own tools (issue 17): functions and classes as tools, the json (hermes) call format, MCP
servers, and ARPO's tree training unchanged for any tool and both formats."""

import asyncio
import json
import sys
import textwrap
import threading
import time

import pytest

from arpo.settings import ToolOptions
from arpo.tools import ToolRegistry, build_tools
from arpo.tools.plugins.function import FunctionTool, as_tool


def lookup_order(order_id: str, verbose: bool = False) -> str:
    """Look up an order in the shop database.

    Args:
        order_id: the order number, e.g. "A-1042"
        verbose: include the line items
    """
    return f"order {order_id}: shipped" + (" (2 items)" if verbose else "")


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


def test_a_plain_function_becomes_a_tool_with_its_schema():
    t = as_tool(lookup_order)
    fn = t.schema["function"]
    assert t.name == "lookup_order" and fn["description"] == "Look up an order in the shop database."
    assert fn["parameters"]["properties"] == {
        "order_id": {"type": "string", "description": 'the order number, e.g. "A-1042"'},
        "verbose": {"type": "boolean", "description": "include the line items"}}
    assert fn["parameters"]["required"] == ["order_id"]
    assert t.call({"order_id": "A-1", "verbose": True}).output == "order A-1: shipped (2 items)"
    assert t('{"order_id": "B-2"}').output == "order B-2: shipped"  # tags: a JSON object of arguments
    assert as_tool(add).call({"a": 2, "b": 3}).output == "5"


@pytest.mark.parametrize("args, msg", [
    ({}, "missing required argument(s): order_id"),
    ({"order_id": 7}, "argument 'order_id' must be of type string"),
    ({"order_id": "x", "colour": 1}, "unknown argument(s) colour"),
    ([1], "must be a JSON object"),
])
def test_schema_violations_are_error_results_that_say_what_is_wrong(args, msg):
    r = as_tool(lookup_order).call(args)
    assert not r.ok and msg in r.output


def test_tag_text_for_single_string_tools_and_json_for_others():
    def shout(text: str) -> str:
        """Upper-case.

        Args:
            text: the text
        """
        return text.upper()

    assert as_tool(shout)(" hi there ").output == " HI THERE "
    r = as_tool(add)("{not json")
    assert not r.ok and "must be a JSON object of arguments" in r.output


class Counter:
    """Counts calls (state kept for the run)."""

    def __init__(self):
        self.n, self.events = 0, []

    def setup(self):
        self.events.append("setup")

    def __call__(self, step: int = 1) -> str:
        """Advance the counter.

        Args:
            step: how much to add
        """
        self.n += step
        return str(self.n)

    def close(self):
        self.events.append("close")


def test_a_class_tool_keeps_state_and_is_closed():
    reg = ToolRegistry()
    reg.register(Counter)
    t = reg["counter"]
    assert [t.call({"step": 2}).output, t.call({}).output, t('{"step": 10}').output] == ["2", "3", "13"]
    reg.close()
    assert t.owner.events == ["setup", "close"]


def test_async_tools_run_concurrently_and_limits_hold():
    async def slow(x: int) -> int:
        """Sleep then echo.

        Args:
            x: a number
        """
        await asyncio.sleep(0.5)
        return x

    t = FunctionTool(slow, options=ToolOptions(max_concurrency=4))
    out = []
    threads = [threading.Thread(target=lambda i=i: out.append(t.call({"x": i}).output)) for i in range(4)]
    t0 = time.perf_counter()
    [th.start() for th in threads]
    [th.join() for th in threads]
    assert sorted(out) == ["0", "1", "2", "3"] and time.perf_counter() - t0 < 1.5  # not 4 x 0.5 s
    one = FunctionTool(slow, options=ToolOptions(max_concurrency=1))
    threads = [threading.Thread(target=lambda i=i: one.call({"x": i})) for i in range(3)]
    t0 = time.perf_counter()
    [th.start() for th in threads]
    [th.join() for th in threads]
    assert time.perf_counter() - t0 >= 1.4  # one at a time


def test_a_tool_that_raises_or_hangs_is_an_error_result():
    def boom(x: int) -> int:
        """Fail.

        Args:
            x: ignored
        """
        raise ValueError("no such row")

    def hang(x: int) -> int:
        """Hang.

        Args:
            x: ignored
        """
        time.sleep(5)
        return x

    r = as_tool(boom).call({"x": 1})
    assert not r.ok and "ValueError: no such row" in r.output
    t0 = time.perf_counter()
    r = FunctionTool(hang, options=ToolOptions(timeout_s=0.3)).call({"x": 1})
    assert not r.ok and "timed out after 0.3 s" in r.output and time.perf_counter() - t0 < 2
    big = FunctionTool(lambda_free_big, options=ToolOptions(max_output_chars=50)).call({"n": 500})
    assert big.truncated and "[output truncated: 450 more characters]" in big.output


def lambda_free_big(n: int) -> str:
    """A long output.

    Args:
        n: characters
    """
    return "x" * n


def test_tools_from_specs_config_and_cli(capsys):
    reg = build_tools(["arpo.testing:echo"], options={"echo": {"timeout_s": 2}})
    assert reg.names == ["echo"] and reg["echo"].call({"text": "abc"}).output == "cba"
    reg.close()
    from arpo.errors import ArpoError

    with pytest.raises(ArpoError, match="cannot import no_such_pkg"):
        build_tools(["no_such_pkg.tools:x"])
    with pytest.raises(ArpoError, match="has no attribute 'nope'"):
        build_tools(["arpo.testing:nope"])
    from arpo.cli import main

    assert main(["chat", "--model", "tiny-random", "--tools", "arpo.testing:echo", "--max-response-tokens", "4",
                 "--json", "hi"]) == 0
    json.loads(capsys.readouterr().out)


# ---- the json (hermes) call format -------------------------------------------------------------
def test_hermes_parsing_several_calls_and_errors():
    from arpo.rollout.tool_formats import JsonFormat

    reg = ToolRegistry([as_tool(add), as_tool(lookup_order)])
    fmt = JsonFormat()
    calls = fmt.parse('<think>x</think><tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
                      '<tool_call>{"name": "lookup_order", "arguments": "{\\"order_id\\": \\"Z\\"}"}</tool_call>',
                      reg, None)
    assert [(c.tag, c.arguments) for c in calls] == [("add", {"a": 1, "b": 2}), ("lookup_order", {"order_id": "Z"})]
    assert fmt.parse("<answer> \\boxed{3} </answer>", reg, None) is None
    (bad,) = fmt.parse('<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>', reg, None)
    assert "not valid JSON" in bad.error
    (unk,) = fmt.parse('<tool_call>{"name": "mul", "arguments": {}}</tool_call>', reg, None)
    assert "unknown tool 'mul'. Available tools: add, lookup_order" in unk.error
    (unclosed,) = fmt.parse('<tool_call>{"name": "add"', reg, None)
    assert "without </tool_call>" in unclosed.error
    res = reg.run(fmt.parse('<tool_call>{"name": "add", "arguments": {"a": "1", "b": 2}}</tool_call>', reg, None)[0])
    assert not res.ok and "argument 'a' must be of type integer" in res.output


def _json_loop(tok, model, reg, segments, **agent_kw):
    from arpo.engine.hf import HFEngine
    from arpo.rollout.agent import AgentLoop
    from arpo.settings import AgentConfig
    from arpo.testing import scripted_hook

    loop = AgentLoop(HFEngine(model, tok), reg, AgentConfig(max_response_tokens=400, tool_format="json", **agent_kw))
    hook = scripted_hook(tok, segments)
    base = loop.params
    loop.params = lambda n, seed: (lambda p: (setattr(p, "logits_hook", hook), p)[1])(base(n, seed))
    return loop


JSON_SCRIPT = [
    '<think> reverse it </think><tool_call>\n{"name": "echo", "arguments": {"text": "abc"}}\n</tool_call>',
    '<tool_call>{"name": "echo", "arguments": {"text": "xy"}}</tool_call>'
    '<tool_call>{"name": "echo", "arguments": {"text": 5}}</tool_call>',
    "<answer> \\boxed{cba} </answer>",
]


@pytest.mark.parametrize("template", ["qwen", "chatml"])
def test_json_rollout_ids_are_sampled_plus_rendered_results(tiny_lm, template):
    """Token ids trained on = ids sampled + ids of the appended tool messages (no re-tokenization);
    loss mask 0 exactly on those; results rendered by the template (Qwen-style) or arpo's hermes
    convention (ChatML without tool support)."""
    from arpo.data.prompts import render_prompt, system_prompt
    from arpo.testing import echo, qwen_style_tokenizer, tiny_tokenizer

    tok = qwen_style_tokenizer() if template == "qwen" else tiny_tokenizer()
    reg = ToolRegistry([as_tool(echo)])
    loop = _json_loop(tok, tiny_lm, reg, JSON_SCRIPT)
    prompt = render_prompt(tok, "reverse abc", system_prompt("math", reg, tool_format="json"), tools=reg,
                           tool_format="json")
    assert "<tools>" in tok.decode(prompt) and '"name": "echo"' in tok.decode(prompt)
    (tr,) = loop.run([prompt], seeds=[0])
    assert tr.finish_reason == "answer"
    assert [(c.tool, c.output, c.ok) for c in tr.tool_calls] == [
        ("echo", "cba", True), ("echo", "yx", True), ("echo", tr.tool_calls[2].output, False)]
    assert "argument 'text' must be of type string" in tr.tool_calls[2].output
    spans = [c.result_span for c in tr.tool_calls if c.result_span[1] > 0]
    assert len(spans) == 2 and tr.tool_calls[1].result_span == (0, 0)  # one appended block per turn
    expected = [1] * len(tr.response_ids)
    for a, b in spans:
        expected[a:b] = [0] * (b - a)
        block = tok.decode(tr.response_ids[a:b])
        assert block.startswith("\n<|im_start|>user\n<tool_response>") and block.endswith("<|im_start|>assistant\n")
        assert tr.response_ids[a:b] == tok.encode(block, add_special_tokens=False)  # tokenized on its own
    assert tr.loss_mask == expected
    assert "<tool_response>\ncba\n</tool_response>" in tok.decode(tr.response_ids[spans[0][0]:spans[0][1]])
    # every generated token is what the scripted model sampled: each turn ends with <|im_end|>
    gen = [t for t, m in zip(tr.response_ids, tr.loss_mask, strict=True) if m]
    assert gen.count(tok.convert_tokens_to_ids("<|im_end|>")) == 2


def _json_train_step(tiny_tok_name, tool_format, segments, tmp_path):
    """One ARPO step (training/trainer.py's setup + train_step) with a scripted model."""
    from arpo.settings import AgentConfig, RolloutConfig, ToolsConfig, TrainConfig
    from arpo.testing import hook_rollout, qwen_style_tokenizer, scripted_hook, tiny_model, toy_reward
    from arpo.training import trainer as T

    tok = qwen_style_tokenizer()
    model = tiny_model(tok)
    cfg = TrainConfig(tools=ToolsConfig(enabled=["arpo.testing:echo"]),
                      agent=AgentConfig(max_response_tokens=300, tool_format=tool_format),
                      rollout=RolloutConfig(group_size=6, initial_rollouts=2, branch_threshold=0.0, entropy_tokens=2),
                      steps=1, prompts_per_step=2)
    cfg.validate()
    preset = cfg.algo.resolve()
    exs = [{"id": f"q{i}", "question": f"reverse {i}", "answers": ["x"], "task": "math"} for i in range(2)]
    tr = T.setup(cfg, preset, exs, toy_reward, model_and_tok=(model, tok))
    hook_rollout(tr.ro, scripted_hook(tok, segments, free_tokens=2))
    before = {k: v.clone() for k, v in model.named_parameters()}
    try:
        m, trees = T.train_step(tr, 0)
    finally:
        tr.close()
    changed = any(not (before[k] == v).all() for k, v in model.named_parameters())
    return m, trees, changed


@pytest.mark.parametrize("tool_format", ["tags", "json"])
def test_arpo_branches_after_tool_results_and_trains_in_both_formats(tool_format, tmp_path):
    segs = (JSON_SCRIPT if tool_format == "json" else
            ["<think> go </think><echo> abc </echo>", "<echo> xy </echo>", "<answer> \\boxed{cba} </answer>"])
    m, trees, changed = _json_train_step("qwen", tool_format, segs, tmp_path)
    assert m["trajectories"] == 12 and m["branches"] > 0 and changed
    assert m["tool_calls_per_traj/echo"] >= 1
    import math

    assert math.isfinite(m["loss"]) and m["trained_tokens"] > 0
    for tree in trees:
        tree.validate()
        for t in tree.trajectories:
            ends = [c.result_span[1] for c in t.traj.tool_calls if c.result_span[1] > 0]
            if t.parent_id is not None:  # every branch point sits right after one of the parent's results
                parent = tree.trajectories[t.parent_id]
                assert t.branch_token_index in [c.result_span[1] for c in parent.traj.tool_calls]
            mask = [1] * len(t.traj.response_ids)
            for c in t.traj.tool_calls:
                a, b = c.result_span
                mask[a:b] = [0] * (b - a)
            assert t.traj.loss_mask == mask and len(ends) >= 1


# ---- MCP servers ---------------------------------------------------------------------------------
MCP_SERVER = textwrap.dedent('''
    import sys
    from mcp.server.mcpserver import MCPServer

    app = MCPServer("arpo-test", log_level="CRITICAL")

    @app.tool()
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    @app.tool()
    def fail(x: int) -> int:
        """Always fails."""
        raise RuntimeError("broken on purpose")

    if __name__ == "__main__":
        if len(sys.argv) > 1:
            app.run(transport="streamable-http", port=int(sys.argv[1]))
        else:
            app.run()
''')


@pytest.fixture(scope="module")
def mcp_server_file(tmp_path_factory):
    pytest.importorskip("mcp")
    p = tmp_path_factory.mktemp("mcp") / "server.py"
    p.write_text(MCP_SERVER)
    return p


def test_mcp_stdio_server_tools_through_the_agent_loop(mcp_server_file, tiny_lm, tiny_tok):
    from arpo.engine.hf import HFEngine
    from arpo.rollout.agent import AgentLoop
    from arpo.settings import AgentConfig
    from arpo.testing import scripted_hook

    reg = build_tools([], mcp=[{"command": sys.executable, "args": [str(mcp_server_file)]}])
    try:
        assert sorted(reg.names) == ["fail", "multiply"]
        assert reg["multiply"].schema["function"]["parameters"]["required"] == ["a", "b"]
        loop = AgentLoop(HFEngine(tiny_lm, tiny_tok), reg, AgentConfig(max_response_tokens=300))
        hook = scripted_hook(tiny_tok, ['<multiply> {"a": 6, "b": 7} </multiply>', '<fail> {"x": 1} </fail>',
                                        "<answer> \\boxed{42} </answer>"])
        base = loop.params
        loop.params = lambda n, seed: (lambda p: (setattr(p, "logits_hook", hook), p)[1])(base(n, seed))
        (tr,) = loop.run([tiny_tok.encode("q")], seeds=[0])
        assert [(c.tool, c.ok) for c in tr.tool_calls] == [("multiply", True), ("fail", False)]
        assert tr.tool_calls[0].output == "42" and "Error executing tool fail" in tr.tool_calls[1].output
        assert not reg["multiply"].call({"a": "x", "b": 1}).ok  # schema checked before the server is asked
    finally:
        reg.close()


def test_mcp_http_server(mcp_server_file):
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(mcp_server_file), str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.2)
        reg = build_tools([], mcp=[{"url": f"http://127.0.0.1:{port}/mcp"}])
        try:
            assert reg["multiply"].call({"a": 3, "b": 5}).output == "15"
        finally:
            reg.close()
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_dead_mcp_server_is_a_clear_error():
    pytest.importorskip("mcp")
    from arpo.errors import ArpoError

    with pytest.raises(ArpoError, match="MCP server .*cannot connect"):
        build_tools([], mcp=[{"command": sys.executable, "args": ["-c", "import sys; sys.exit(3)"]}])
