"""One short run of the real embedded default model (SmolLM2-135M-Instruct) through the agent."""

from arpo.data.prompts import render_prompt, system_prompt
from arpo.engine.hf import HFEngine
from arpo.rollout.agent import AgentLoop
from arpo.settings import AgentConfig
from arpo.tools.registry import ToolRegistry


def test_default_model_chat_runs(default_lm):
    model, tok = default_lm
    assert model.config.num_hidden_layers == 30 and len(tok) == 49152
    prompt = render_prompt(tok, "What is 17*23? Use python.", system_prompt("math", ["python"]))
    loop = AgentLoop(HFEngine(model, tok), ToolRegistry(), AgentConfig(max_response_tokens=24, temperature=0.0))
    a = loop.run([prompt], seeds=[0])[0]
    b = loop.run([prompt], seeds=[0])[0]
    assert a.response_ids == b.response_ids and a.n_generated_tokens > 0
    # the engine decodes the real model: its greedy tokens up to the first pause are transformers' own
    import torch

    own = a.response_ids[: next((i for i, m in enumerate(a.loss_mask) if m == 0), len(a.loss_mask))]
    with torch.no_grad():
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=len(own), do_sample=False,
                             pad_token_id=tok.eos_token_id)[0, len(prompt):].tolist()
    assert ref == own
    assert all(lp <= 0 for lp in a.logprobs) and all(h >= 0 for h in a.entropies)
