"""The released ARPO checkpoints' templates (data/templates/prompts.yaml): the reference's system
prompts verbatim, the tag protocol with `<result>OUTPUT</result>` appended, and the budgets and
sampling of its evaluation — run through the real agent loop and the real python tool with
random-weight models of the checkpoints' architectures (Qwen2.5, Qwen3, Llama 3.1, built in code)."""

import hashlib
import json

import pytest
import torch

from arpo.data.prompts import checkpoint_templates, prompts_for, system_prompt, template_defaults, template_spec
from arpo.errors import ArpoError
from arpo.testing import ARCHS, arch_model, arch_tokenizer, save_arch_model

# sha256 of RUC-NLPIR/ARPO @ a95cd08, evaluation/src/prompt_manager.py, PromptManager(TYPE).get_system_prompt()
REFERENCE_SHA256 = {
    "arpo-code-search": "177a49a91ade2af50bcf34666e5241b5a3576593e516c6fcd0d030372f425914",
    "arpo-search": "87e802b6736cb3165ea6a644d4fe2f2c7118b21828103c9eeb338ce0c7f8b23b",
    "arpo-math": "40ab4ac1d82b3dd2ff8716a285860df795736c660fe07d09b867a360bae235f0",
    "arpo-base": "468c42d905e0447e8fd9ce090efd8ff22197e83f193d5680afc30506a9da27ad",
}
REFERENCE_SHA256["arpo-reasoning"] = REFERENCE_SHA256["arpo-deepsearch"] = REFERENCE_SHA256["arpo-code-search"]


@pytest.mark.parametrize("name", sorted(REFERENCE_SHA256))
def test_the_system_prompts_are_the_references_verbatim(name):
    text = system_prompt(name, list(template_defaults(name).get("tools", ())))  # the tools it was written for
    assert hashlib.sha256(text.encode()).hexdigest() == REFERENCE_SHA256[name]
    assert "\\[ \\boxed{answer here} \\]" in text and "\x08" not in text  # their eval's \\boxed, not the \b typo


def test_the_checkpoints_and_their_settings():
    assert checkpoint_templates() == {
        "dongguanting/Qwen2.5-3B-ARPO": "arpo-reasoning", "dongguanting/Qwen2.5-7B-ARPO": "arpo-reasoning",
        "dongguanting/Llama3.1-8B-ARPO": "arpo-reasoning", "dongguanting/Qwen3-8B-ARPO-DeepSearch": "arpo-deepsearch",
        "dongguanting/Qwen3-14B-ARPO-DeepSearch": "arpo-deepsearch"}
    d = template_defaults("arpo-reasoning")
    assert d == {"tools": ("python", "search"), "max_tool_calls": 15, "max_response_tokens": 8192, "temperature": 0.6,
                 "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.1, "result_template": "<result>{output}</result>"}
    assert template_defaults("arpo-deepsearch")["max_response_tokens"] == 16384
    assert template_defaults("arpo-base")["tools"] == () and template_defaults("math") == {}
    with pytest.raises(ArpoError, match="tag protocol"):
        system_prompt("arpo-reasoning", ["python"], tool_format="json")


def test_a_bad_template_mapping_names_the_key(tmp_path):
    p = tmp_path / "t.yaml"
    p.write_text("tool_descriptions: {}\ntemplates:\n  x: {system: hi, temprature: 1}\n"
                 "  y: {system: hi, result: '<r>'}\n")
    with pytest.raises(ArpoError, match=r"templates.x.temprature: unknown key"):
        template_spec("x", str(p))
    with pytest.raises(ArpoError, match=r"templates.y.result: must contain \{output\}"):
        template_spec("y", str(p))


def test_flags_win_over_the_template_and_the_template_over_the_defaults():
    from arpo.cli import build_parser
    from arpo.commands.agent_flags import resolve

    a = resolve(build_parser().parse_args(["eval", "--data", "x", "--template", "arpo-reasoning", "--temperature",
                                           "0"]), "eval")
    assert (a.tools.enabled, a.agent.max_tool_calls, a.agent.temperature, a.agent.top_k, a.agent.repetition_penalty,
            a.agent.result_template) == (["python", "search"], 15, 0.0, 20, 1.1, "<result>{output}</result>")
    b = resolve(build_parser().parse_args(["eval", "--data", "x"]), "eval")
    assert (b.tools_chosen, b.agent.max_tool_calls, b.agent.temperature, b.agent.top_k, b.agent.repetition_penalty,
            b.agent.result_template) == (False, 5, 0.0, 0, 1.0, None)  # eval: the task's tools, greedy


def test_the_repetition_penalty_is_vllms_rule():
    from types import SimpleNamespace

    from arpo.rollout.agent import RepetitionPenalty

    logits = torch.tensor([2.0, -2.0, 1.0, -1.0])
    out = RepetitionPenalty(2.0)(SimpleNamespace(tokens=[0, 1, 1]), logits)
    assert out.tolist() == [1.0, -4.0, 1.0, -1.0] and logits.tolist() == [2.0, -2.0, 1.0, -1.0]


@pytest.mark.parametrize("arch", ARCHS)
def test_a_checkpoint_of_each_architecture_runs_the_protocol_as_published(arch):
    """The prompt is the reference's (chat template over its system prompt and the question, generation
    prompt); a python call stops generation at </python>, the real tool's output comes back as
    <result>OUTPUT</result> right after it, and the boxed answer is scored."""
    from arpo.engine.hf import HFEngine
    from arpo.rewards import arpo_reward
    from arpo.rollout.agent import AgentLoop
    from arpo.settings import AgentConfig
    from arpo.testing import scripted_hook
    from arpo.tools import build_tools

    tok = arch_tokenizer(arch)
    model = arch_model(arch, tok)
    d = template_defaults("arpo-reasoning")
    tools = build_tools(["python"])
    try:
        ex = {"id": "q", "question": "What is 6 times 7?", "answers": ["42"], "task": "math"}
        [prompt] = prompts_for([ex], tok, tools, "arpo-reasoning")
        ref = tok.apply_chat_template([{"role": "system", "content": system_prompt("arpo-code-search", [])},
                                       {"role": "user", "content": ex["question"]}],
                                      tokenize=False, add_generation_prompt=True)
        assert tok.decode(prompt) == ref
        cfg = AgentConfig(max_tool_calls=d["max_tool_calls"], max_response_tokens=400, temperature=d["temperature"],
                          top_p=d["top_p"], top_k=d["top_k"], result_template=d["result_template"],
                          repetition_penalty=d["repetition_penalty"])
        loop = AgentLoop(HFEngine(model, tok), tools, cfg)
        assert loop.params(len(prompt), 0).logits_hook is not None  # the penalty runs as a logits hook
        call = "<think> I multiply. </think> <python>print(6*7)</python>"
        answer = " <think> 42. </think> <answer> The final answer is \\[ \\boxed{42} \\] </answer>"
        base = loop.params
        hook = scripted_hook(tok, [call, answer])

        def params(n, seed):
            p = base(n, seed)
            p.logits_hook = hook
            return p

        loop.params = params
        [traj] = loop.run([prompt], seeds=[0])
    finally:
        tools.close()
    assert traj.text == call + "<result>42</result>" + answer
    assert traj.finish_reason == "answer" and [c.tool for c in traj.tool_calls] == ["python"]
    res = arpo_reward(traj.text, ex, tool_calls=[{"tool": "python"}])
    assert res.correct and res.answer == "42"


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_arpo_chat_and_eval_with_a_checkpoint_dir_and_its_template(arch, tmp_path, capsys):
    """`arpo chat/eval --model DIR --template arpo-deepsearch`: the template's tools, budgets, sampling and
    result format are what runs (flags still win)."""
    from arpo.cli import main

    model = save_arch_model(tmp_path / f"tiny-{arch}", arch)
    assert main(["chat", "--model", model, "--template", "arpo-deepsearch", "--max-response-tokens", "24",
                 "--device", "cpu", "--json", "What is 2+2?"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    s = out["settings"]
    assert (s["template"], s["tools"], s["max_tool_calls"], s["max_response_tokens"]) == (
        "arpo-deepsearch", ["python", "search"], 15, 24)
    assert (s["temperature"], s["top_p"], s["top_k"], s["repetition_penalty"], s["result_template"]) == (
        0.6, 0.95, 20, 1.1, "<result>{output}</result>")
    assert out["n_generated_tokens"] <= 24
    ev = tmp_path / "ev.json"
    assert main(["eval", "--model", model, "--template", "arpo-reasoning", "--data", "bench:bamboogle:dev",
                 "--limit", "2", "--max-response-tokens", "16", "--temperature", "0", "--device", "cpu",
                 "--out", str(ev), "--quiet", "--json"]) == 0
    data = json.loads(ev.read_text())
    assert data["settings"]["temperature"] == 0 and data["settings"]["top_k"] == 20
    assert data["results"]["bench:bamboogle:dev"]["tools"] == ["python", "search"]


def test_a_released_checkpoints_name_gets_a_hint(capsys):
    from arpo.cli import build_parser
    from arpo.commands.agent_flags import resolve
    from arpo.data.prompts import checkpoint_template_for

    assert checkpoint_template_for("dongguanting/Qwen3-14B-ARPO-DeepSearch") == "arpo-deepsearch"
    assert checkpoint_template_for("/models/qwen2.5-7b-arpo/") == "arpo-reasoning"
    assert checkpoint_template_for("smollm2-135m-instruct") is None
    resolve(build_parser().parse_args(["eval", "--data", "x", "--model", "./Llama3.1-8B-ARPO"]), "eval")
    assert "--template arpo-reasoning" in capsys.readouterr().err
