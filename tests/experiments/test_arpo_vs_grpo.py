"""The knowledge-base tool environment and the ARPO-vs-GRPO experiment (experiments/)."""

import json
import re
from pathlib import Path

import pytest

from experiments import arpo_vs_grpo as X
from experiments import common, kbenv


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from arpo.tools import tools_from_config
    kb = kbenv.make_kb(20, seed=0)
    d = tmp_path_factory.mktemp("kbenv")
    kbenv.build_index(kb, d / "index")
    tools = tools_from_config(kbenv.tools_config(d / "index", top_k=2))
    yield kb, tools
    tools.close()


def test_kb_is_well_formed():
    kb = kbenv.make_kb(30, seed=3)
    names = [t.name for t in kb.towns]
    assert len(set(names)) == 30
    assert all(t.twin in kb.by_name and t.twin != t.name for t in kb.towns)
    for t in kb.towns:
        doc = kb.document(t)
        for a in kbenv.ATTRIBUTES:
            lo, hi = kbenv.RANGES[a]
            assert lo <= t.value(a) <= hi and f"{a} {t.value(a)}." in doc["text"]
    assert kbenv.make_kb(30, seed=3).towns == kb.towns  # deterministic


def test_questions_are_answerable_from_the_kb(env):
    kb, _ = env
    qs = kbenv.make_questions(kb, 60, seed=1)
    assert len({q["question"] for q in qs}) == 60
    assert {q["kind"] for q in qs} == set(kbenv.KINDS)
    for q in qs:  # recompute the gold answer from the KB by parsing the question text
        m = re.fullmatch(r"What is the (\w+) of (the twin town of )?(\w+) (plus|minus|times) (.+)\?", q["question"])
        attr, twin, name, op, rest = m.groups()
        x = kb.by_name[name]
        v = kb.by_name[x.twin].value(attr) if twin else x.value(attr)
        m2 = re.fullmatch(r"the (\w+) of (\w+)", rest)
        w = kb.by_name[m2.group(2)].value(m2.group(1)) if m2 else int(rest)
        assert q["answers"] == [str(eval(f"{v}{kbenv.OPS[op]}{w}"))]


def test_expert_traces_get_full_reward_with_the_real_tools(env):
    from arpo.rewards import arpo_reward, check_format

    kb, tools = env
    qs = kbenv.make_questions(kb, 30, seed=2)
    rows, dropped = kbenv.sft_rows(qs, tools)
    assert dropped == 0 and len(rows) == 30
    for row, q in zip(rows, qs, strict=True):
        assert check_format(row["response"]) is None
        assert arpo_reward(row["response"], q).reward == pytest.approx(1.1)  # correct + multi-tool bonus
        # every needed fact is on the first page the real search returned; the python output is the answer
        for out, fact in zip(row["tool_outputs"], q["plan"]["evidence"], strict=False):  # the python output: no fact
            assert fact in out.split("\n\nPage 2:")[0]
        assert row["tool_outputs"][-1].strip() == q["answers"][0]
        # the masked spans are exactly the environment's result blocks
        for s, e in row["tool_results"]:
            block = row["response"][s:e].strip()
            assert block.startswith("<result>") and block.endswith("</result>")
    assert "Page 2:" in rows[0]["tool_outputs"][0]  # top_k=2: a distractor page comes along


def test_tokenizer_round_trips_and_keeps_tags_and_numbers_whole(env):
    kb, tools = env
    qs = kbenv.make_questions(kb, 20, seed=5)
    rows, _ = kbenv.sft_rows(qs, tools)
    tok = kbenv.build_tokenizer(kbenv.tokenizer_corpus(kb, rows, qs))
    for r in rows:
        assert tok.decode(tok.encode(r["response"], add_special_tokens=False)) == r["response"]
    for t in kbenv.TAGS + ("412", "99", "7"):
        assert len(tok.encode(t, add_special_tokens=False)) == 1, t
    assert len(tok.encode("1038", add_special_tokens=False)) == 2  # chunks of <= 3 digits
    odd = "Traceback: ZeroDivisionError é 😀 {}"
    assert tok.decode(tok.encode(odd, add_special_tokens=False)) == odd
    prompt = tok.apply_chat_template([{"role": "system", "content": "ignored"}, {"role": "user", "content": "Q?"}],
                                     tokenize=False, add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n"


def test_calls_to_reach_interpolates():
    assert common.calls_to_reach([0, 100, 200], [0.2, 0.4, 0.6], 0.5) == pytest.approx(150)
    assert common.calls_to_reach([0, 100, 200], [0.2, 0.4, 0.6], 0.1) == 0
    assert common.calls_to_reach([0, 100, 200], [0.2, 0.4, 0.3], 0.45) is None


def test_summary_ratio_on_hand_made_curves():
    def run(seed, calls, accs):
        return {"seed": seed, "curve": [{"step": 5 * i, "tool_calls": c, "accuracy": a}
                                        for i, (c, a) in enumerate(zip(calls, accs, strict=True))]}

    runs = {"arpo": [run(0, [0, 50, 100], [0.2, 0.4, 0.5])], "grpo": [run(0, [0, 100, 200], [0.2, 0.3, 0.4])]}
    s = common.summarize(runs, start_acc=0.2)
    assert s["target_accuracy"] == pytest.approx(0.4)
    assert s["ratio_levels"]["1.00"]["calls_arpo"] == pytest.approx(50)
    assert s["ratio_levels"]["1.00"]["calls_grpo"] == pytest.approx(200)
    assert s["tool_call_ratio"] == pytest.approx(0.25)
    assert s["per_step_tool_call_ratio"] == pytest.approx(0.5)
    assert s["per_seed_ratio"][0]["ratio"] == pytest.approx(0.25)


def test_counting_registry_counts_every_call(env):
    from arpo.tools.base import ToolCall

    kb, tools = env
    reg = X.CountingRegistry(tools)
    assert sorted(reg.names) == ["python", "search"]
    reg.run(ToolCall("python", "print(1+1)"))
    reg.run(ToolCall("search", f"area of {kb.towns[0].name}"))
    reg.run(ToolCall("bogus", "", error="Error: unknown tool"))
    assert reg.counts["calls"] == 3 and reg.counts["calls/python"] == 1 and reg.counts["calls/malformed"] == 1
    reg.close()  # a no-op: the shared tools still work
    assert tools.run(ToolCall("python", "print(2)")).output.strip() == "2"


def test_quick_experiment_end_to_end(tmp_path):
    cfg = X.ExperimentConfig.quick(out=str(tmp_path / "q"), threads=2)
    res = X.run(cfg)
    data = json.loads((tmp_path / "q" / "results.json").read_text())
    assert Path(data["settings"]["out"]).resolve() == (tmp_path / "q").resolve()  # recorded relative
    assert not Path(data["settings"]["out"]).is_absolute()
    n_evals = cfg.steps // cfg.eval_every + 1
    for m in cfg.methods:
        assert len(data["runs"][m]) == cfg.seeds
        for r in data["runs"][m]:
            assert [p["step"] for p in r["curve"]] == [cfg.eval_every * i for i in range(n_evals)]
            calls = [p["tool_calls"] for p in r["curve"]]
            assert calls == sorted(calls)  # cumulative
            assert len(r["per_step"]) == cfg.steps
            assert all(0 <= p["accuracy"] <= 1 for p in r["curve"])
        assert len(data["summary"]["curves"][m]["accuracy_mean"]) == n_evals
    # same budget: M trajectories per prompt for both; ARPO's come partly from branches, GRPO's never
    for m in cfg.methods:
        assert all(s["trajectories"] == cfg.group_size * cfg.prompts_per_step for r in data["runs"][m]
                   for s in r["per_step"])
    assert all(r["branches_total"] == 0 for r in data["runs"]["grpo"])
    assert sum(r["branches_total"] for r in data["runs"]["arpo"]) > 0
    for png in ("accuracy_vs_step.png", "accuracy_vs_tool_calls.png"):
        assert (tmp_path / "q" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert res["summary"]["start_accuracy"] == data["summary"]["start_accuracy"]
