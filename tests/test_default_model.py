"""One short run of the real embedded default model (SmolLM2-135M-Instruct) through the agent."""

from arpo.data.prompts import render_prompt, system_prompt
from arpo.engine.hf import HFEngine
from arpo.rollout.agent import AgentConfig, AgentLoop
from arpo.tools.base import ToolRegistry


def test_default_model_chat_runs(default_lm):
    model, tok = default_lm
    assert model.config.num_hidden_layers == 30 and len(tok) == 49152
    prompt = render_prompt(tok, "What is 17*23? Use python.", system_prompt("math", ["python"]))
    loop = AgentLoop(HFEngine(model, tok), ToolRegistry(), AgentConfig(max_response_tokens=24, temperature=0.0))
    a = loop.run([prompt], seeds=[0])[0]
    b = loop.run([prompt], seeds=[0])[0]
    assert a.response_ids == b.response_ids and a.n_generated_tokens > 0
    assert a.finish_reason in ("eos", "length", "answer", "stop", "tool_cap")
    assert all(lp <= 0 for lp in a.logprobs) and all(h >= 0 for h in a.entropies)
