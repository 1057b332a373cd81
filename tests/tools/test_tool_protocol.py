"""The Tool and Engine protocols declare their optional members with defaults (issue 64): a tool
that has only `name` and `__call__` reads as one with no schema, an empty description, cacheable,
without sessions, with a one-string `call` and a `close` that does nothing; arpo reads these as
attributes instead of probing with getattr."""

from __future__ import annotations

import pytest

from arpo.tools.base import Tool, ToolResult
from arpo.tools.registry import ToolRegistry


class Echo:  # the bare protocol: a name and __call__, no base class
    name = "echo"

    def __init__(self):
        self.calls = 0

    def __call__(self, text):
        self.calls += 1
        return ToolResult(text[::-1])


class Upper(Tool):  # a subclass inherits the defaults
    name = "upper"

    def __call__(self, text):
        return ToolResult(text.upper())


@pytest.mark.parametrize("make", [Echo, Upper])
def test_a_tool_without_the_optional_members_reads_with_their_defaults(make):
    from arpo.data.prompts import tool_schema
    from arpo.tools.base import ToolCall

    reg = ToolRegistry([make()])
    tool = reg[make.name]
    assert (tool.schema, tool.description, tool.cacheable, tool.sessions, tool.single_string_arg) == \
        (None, "", True, False, None)
    assert tool_schema(tool)["function"]["parameters"]["required"] == ["input"]
    want = "cba" if make is Echo else "ABC"
    assert reg.run(ToolCall(make.name, "", arguments={"input": "abc"})).output == want  # json format: `call`
    assert not reg.run(ToolCall(make.name, "", arguments={"input": 3})).ok
    reg.close()  # a tool without close: nothing to release


def test_a_bare_tools_own_members_and_attributes_are_kept():
    class Described(Echo):
        description = "reverses text"
        cacheable = False

    reg = ToolRegistry([Described()])
    tool = reg["echo"]
    assert (tool.description, tool.cacheable) == ("reverses text", False)
    tool("ab")
    assert tool.calls == 1  # its own attributes pass through


def test_an_engine_wrapper_passes_on_what_the_rollout_checks(tiny_lm, tiny_tok):
    """The Engine protocol's `topk_entropy` and `context_len` (declared, read as attributes) reach
    through the off-policy pipeline's VersionedEngine: `entropy_estimator: topk` on an engine that
    records no top-k entropies is refused."""
    from arpo.engine.hf import HFEngine
    from arpo.errors import ArpoError
    from arpo.rollout.arpo import ARPORollout
    from arpo.settings import RolloutConfig
    from arpo.training.pipeline import VersionedEngine

    eng = VersionedEngine(HFEngine(tiny_lm, tiny_tok, topk_entropy=0))
    assert eng.context_len == tiny_lm.config.max_position_embeddings
    with pytest.raises(ArpoError, match="records no top-k entropies"):
        ARPORollout(eng, ToolRegistry([Echo()]), cfg=RolloutConfig(entropy_estimator="topk"))
