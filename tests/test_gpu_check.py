"""benchmarks/gpu_check.py stays runnable: its core (run_check) on CPU with the smallest sizes —
both architectures (SmolLM2's Llama, Qwen2.5's Qwen2 with its 151,936-row vocabulary masked down to
the tokenizer), decode vs generate, the engine variants' decode table, the train-inference mismatch,
one ARPO RL step with the real python tool, packed vs flat, the bf16-vs-master AdamW update and the
training micro-batch's memory estimate with and without checkpointing (issue 60)."""

import importlib.util
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = mod  # dataclasses look their module up there
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop("gpu_check", None)


def test_architectures_match_the_published_configs(gpu_check):
    smol = gpu_check.ARCHS["smollm2-135m"][2]
    qwen = gpu_check.ARCHS["qwen2.5-1.5b"][2]
    assert (smol["hidden_size"], smol["num_hidden_layers"], smol["num_attention_heads"], smol["num_key_value_heads"],
            smol["intermediate_size"], smol["vocab_size"]) == (576, 30, 9, 3, 1536, 49152)
    assert (qwen["hidden_size"], qwen["num_hidden_layers"], qwen["num_attention_heads"], qwen["num_key_value_heads"],
            qwen["intermediate_size"], qwen["vocab_size"]) == (1536, 28, 12, 2, 8960, 151936)
    assert smol["tie_word_embeddings"] and qwen["tie_word_embeddings"]


@pytest.mark.timeout(900)  # ~9 min on the shared 2-core machine under load (the issue-60 phases: ~25 s of it)
def test_smoke_run_on_cpu(gpu_check):
    sizes = gpu_check.Sizes(batch=2, prompt=16, new=6, repeats=1, steps=1, prompts_per_step=1, group_size=2,
                            initial_rollouts=1, free_tokens=4, max_response_tokens=160, micro_tokens=1024,
                            pack_repeats=1)
    sizes.variant_batches, sizes.variant_new, sizes.profile_steps = (2, 4), 6, 2
    sizes.memory_tokens, sizes.master_elems = 256, 500_000
    # budget_s: the GPU run's time cap; on a loaded CPU the default would skip the second model's variants
    res = gpu_check.run_check(device="cpu", smoke=True, sizes=sizes, vllm=False, variants=("eager", "graph"),
                              budget_s=3600.0)
    assert set(res["models"]) == set(gpu_check.ARCHS)
    for name, m in res["models"].items():
        for phase in ("decode", "variants", "mismatch", "rl", "packing"):
            assert "error" not in m[phase], (name, phase, m[phase].get("traceback"))
        assert m["decode"]["engine_tok_s"] > 0 and m["decode"]["generate_tok_s"] > 0
        for v in ("eager", "graph"):  # the decode table's variants (compiled: the CLI's --smoke runs it too)
            assert "error" not in m["variants"][v], m["variants"][v].get("traceback")
            assert set(m["variants"][v]["batches"]) == {"2", "4"}
            # 6 new tokens: the first step prefills and decodes (2 tokens), then 4 decode steps
            assert all(r["step_ms"] > 0 and r["steps"] == 6 - 2 for r in m["variants"][v]["batches"].values())
            mm = m["mismatch"][v]  # bf16 on CPU: engine records vs the trainer's forward, finite and small
            assert mm["mismatch/tokens"] == sizes.batch * sizes.new and 0 <= mm["mismatch/kl"] < 0.05
        assert m["variants"]["graph"]["graph_replays"] > 0
        assert m["mismatch"]["graph"]["sequences_equal_to_eager"] == m["mismatch"]["graph"]["sequences"] == sizes.batch
        rl = m["rl"]
        assert len(rl["steps"]) == 1 and rl["steps"][0]["trajectories"] == 2
        assert rl["tool_runs_total"] >= 1 and rl["sample_tool_output"] == "391"  # the real python tool ran
        assert rl["max_sampled_id"] < m["model"]["tokenizer_vocab"]  # Qwen's extra vocabulary never sampled
        s = rl["steps"][0]
        assert s["sampled_tokens"] > 0 and s["trained_tokens_packed"] < s["trained_tokens_flat"]
        pk = m["packing"]
        assert pk["packed_s"] > 0 and pk["flat_s"] > 0 and pk["max_abs_logp_diff"] < 0.05
        assert res["vllm"][name]["skipped"]
        ms = m["master"]  # issue 60: bf16 weights keep almost none of lr-1e-6 updates, float32 masters all
        assert ms["elements"] > 0 and ms["bf16_moved_frac"] < 0.2 and ms["master_moved_frac"] > 0.95, ms
        mem = m["memory"]  # the estimate's terms for both variants (measured only on CUDA)
        assert mem["checkpointing"]["estimate_gib"] < mem["no_checkpointing"]["estimate_gib"], mem
        assert mem["checkpointing"]["measured_gib"] is None and mem["checkpointing"]["step_s"] > 0
    assert res["push"]["skipped"]  # vllm=False here (with vLLM: an IPC and a disk push on CUDA)
    assert res["models"]["qwen2.5-1.5b"]["model"]["vocab"] == 151936
    table = gpu_check.report(res)
    assert "| metric | smollm2-135m | qwen2.5-1.5b |" in table and "FAILED" not in table
    assert "| graph | 4 |" in table
    assert "bf16 / float32 master" in table and "weight push into vllm serve: skipped" in table
