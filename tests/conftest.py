"""Shared fixtures: one tiny random-weight model for the whole session (building it and importing
transformers costs seconds; every test file reuses it), and a real python tool per test module."""

import os
import signal

import pytest
import torch

torch.set_num_threads(int(os.environ.get("ARPO_TEST_THREADS", "2")))

# Tests that press Ctrl-C (send SIGINT to an `arpo` child) need the child to start as a terminal's
# foreground process does, with SIGINT at its default. A shell starts a background job (`pytest &`,
# `nohup ...`, a CI script's `cmd &`) with SIGINT ignored, every child inherits that across exec, and
# Python then never installs its KeyboardInterrupt handler: `arpo eval` ran to its end after Ctrl-C and
# the sandbox test's child slept on. A handler (not SIG_IGN) here is reset to the default in children.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def tiny_tok():
    from arpo.testing import tiny_tokenizer

    return tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_lm(tiny_tok):
    from arpo.testing import tiny_model

    return tiny_model(tiny_tok)


@pytest.fixture(scope="session")
def default_lm():
    """The real embedded default model (SmolLM2-135M-Instruct); converted once into the cache dir."""
    from arpo.models import load_model

    return load_model("smollm2-135m-instruct")


@pytest.fixture
def full_disk(tmp_path):
    """A real 64 KB filesystem (tmpfs), filled up: a full disk, unmounted after the test. Needs root (CI
    runs as root)."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)],
                                           capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        with open(disk / "filler", "wb") as f:
            try:
                f.write(b"\0" * (1 << 20))
            except OSError:
                pass
        yield disk
    finally:
        subprocess.run(["umount", str(disk)])


@pytest.fixture
def hotpot_row(tmp_path):
    """A one-row HotpotQA-style data file (a question whose supporting page is 'Bob page')."""
    import json

    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"id": "a", "question": "Who?", "answer": "Bob",
                             "supporting_facts": {"title": ["Bob page"], "sent_id": [0]}}) + "\n")
    return f


# a scripted agent: two python calls, then an answer; each segment opens with free tokens sampled from
# the model, so entropies and ARPO's branch decisions vary
SCRIPTED_RUN = ["<python> print(17 * 23) </python>", "<python> print(2 + 2) </python>", "<answer> \\boxed{4} </answer>"]


@pytest.fixture(scope="module")
def python_tool():
    """A real sandboxed python tool (one worker, nothing pre-imported, 10 s per call), per test module."""
    from arpo.tools.python import PythonTool

    t = PythonTool(timeout_s=10, pool_size=1, preimport=())
    yield t
    t.close()


def train_scripted(overrides: dict, script: list, free_tokens: int = 0) -> None:
    """Really train with `arpo train`'s recipe on the dotted config `overrides`, every rollout's text
    scripted by `script` (arpo.testing.scripted_hook; each segment opens with `free_tokens` sampled
    tokens). Runs on the thread count the overrides give, then restores the caller's."""
    from arpo.config import load_config
    from arpo.recipes import train
    from arpo.rollout.arpo import ARPORollout
    from arpo.settings import TrainConfig
    from arpo.testing import hook_rollout, scripted_hook

    init = ARPORollout.__init__

    def scripted(self, *a, **k):
        init(self, *a, **k)
        hook_rollout(self, scripted_hook(self.engine.tokenizer, script, free_tokens=free_tokens))

    threads = torch.get_num_threads()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ARPORollout, "__init__", scripted)
            train.run(load_config(TrainConfig, None, [f"{k}={v}" for k, v in overrides.items()]), quiet=True)
    finally:
        torch.set_num_threads(threads)


def train_scripted_run(root, steps: int = 3, **overrides):
    """Really train a few ARPO steps into root/run (a tiny random model written to root/model, the real
    python tool, the SCRIPTED_RUN agent, toy_reward): a run dir with tool calls and branches in
    seconds. overrides: dotted config keys, e.g. {"run.save_rollouts": 2}. Returns the run dir.
    Runs on one torch thread (tiny ops on a busy machine are many times slower with more), then
    restores the caller's thread count."""
    import json
    from pathlib import Path

    from arpo.testing import save_tiny_model

    root = Path(root)
    if not (root / "model" / "config.json").exists():
        save_tiny_model(root / "model")
    data = root / "q.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i), "task": "math"}) + "\n"
                            for i in range(6)))
    ov = {"model.name": root / "model", "data.path": data, "tools.enabled": "[python]",
          "agent.max_response_tokens": 120, "rollout.group_size": 4, "rollout.initial_rollouts": 2,
          "reward.fn": "arpo.testing:toy_reward",
          "steps": steps, "prompts_per_step": 2, "optim.lr": 1e-3, "run.dir": root / "run", "run.save_every": 0,
          "run.tensorboard": "false", "run.seed": 1, "run.threads": 1, **overrides}
    train_scripted(ov, SCRIPTED_RUN, free_tokens=4)
    return root / "run"


@pytest.fixture(scope="session")
def scripted_training():
    """train_scripted, for tests that train with a script of their own."""
    return train_scripted


@pytest.fixture(scope="session")
def scripted_run():
    """train_scripted_run, for tests that need a run of their own."""
    return train_scripted_run


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """A 3-step ARPO run of the tiny model with tool calls and branches: metrics.jsonl, rollouts/."""
    return train_scripted_run(tmp_path_factory.mktemp("tiny_run"))


# Tests whose assertions time the machine (a wall-clock bound, a rate, a CPU share): they get the
# `timing` marker here, in one list, with what each times. The default run (`pytest -q`) leaves them
# out (pyproject addopts: -m "not timing"); CI runs them as a step of their own (`pytest -m timing`),
# so a loaded machine fails a timing step, never the functional suite.
TIMING = {
    "tests/engine/test_weight_push.py::test_a_stalled_server_is_an_error_within_the_timeout_and_is_resumed":
        "push error < 3.5 s",
    "tests/eval/test_judge_reward.py::test_a_judge_that_does_not_answer_fails_the_step_in_one_line": "< 10 s",
    "tests/test_chat_template_trust.py::test_with_the_flag_a_memory_bomb_is_a_one_line_error": "< 60 s",
    "tests/test_chat_template_trust.py::test_with_the_flag_a_template_that_never_ends_is_stopped": "stopped < 10 s",
    "tests/test_cli_mistakes.py::test_a_prompt_past_the_context_is_refused_before_any_compute": "refused < 60 s",
    "tests/test_cli_mistakes.py::test_corrupt_weights_and_a_missing_vllm_are_one_line": "refused < 10 s",
    "tests/test_cli_mistakes.py::test_a_reward_that_raises_fails_before_the_model_loads": "refused < 20 s",
    "tests/training/test_rundir.py::test_output_paths_are_checked_before_the_work": "refused < 20 s",
    "tests/serve/test_serve_agent.py::test_closing_a_stream_cancels_it_without_disturbing_others": "freed < 1 s",
    "tests/rollout/test_agent.py::test_concurrent_sequences_with_slow_tool": "4 calls overlap: < 1.2 s",
    "tests/rewards/test_rewards.py::test_math_equal_power_tower_returns_quickly": "< 5 s",
    "tests/tools/test_plugin_tools.py::test_async_tools_run_concurrently_and_limits_hold": "overlap < 1.5 s",
    "tests/tools/test_plugin_tools.py::test_a_tool_that_raises_or_hangs_is_an_error_result": "timeout < 2 s",
    "tests/tools/test_search.py::test_search_tool_timeout": "< 5 s",
    "tests/tools/test_sandbox_package.py::test_run_with_limits_deadline_and_a_status_known_before": "0.3-2 s",
    "tests/tools/test_python_sandbox.py::test_huge_stdout_is_stopped_early": "stopped within the timeout",
    "tests/tools/test_web_browse.py::test_size_time_and_type_caps": "timeout < 3 s",
    "tests/tools/test_web_search.py::test_rate_limit_spaces_requests_per_provider": "request gaps >= 0.14 s",
    "tests/tools/test_web_search.py::test_a_provider_that_never_answers_times_out_into_an_error_result": "< 5 s",
    "tests/tools/test_sandbox_limits.py::test_a_busy_call_stays_within_its_cpu_quota": "CPU / wall ratio",
    "tests/tools/test_sandbox_limits.py::test_calls_of_one_tool_share_its_cpu_quota_fairly": "CPU share ratio",
    "tests/view/test_view_api.py::test_a_large_run_opens_each_page_in_under_0_8s": "each page < 0.8 s",
    "tests/tools/test_python_session_speed.py::test_a_calls_process_is_forked_before_the_call_comes":
        "process age > 0.75 s after a 1.5 s pause",
    "tests/tools/test_python_session_speed.py::test_session_calls_are_not_much_slower_than_one_shot_calls":
        "session p50 < 5x one-shot p50 + 3 ms",
    "tests/tools/test_python_sandbox.py::test_pool_latency_is_small": "warm p50 < max(50 ms, cold p50)",
    "tests/tools/test_sandbox_limits.py::test_a_call_beyond_max_calls_gets_a_clear_error": "refused < 4 s",
    "tests/tools/test_web_security.py::test_slow_headers_end_at_the_deadline": "ended < 3 s",
    "tests/tools/test_web_security.py::test_slow_extraction_ends_at_the_deadline": "ended < 4 s",
    "tests/tools/test_web_security.py::test_a_slow_charset_is_not_used": "answered < 3 s",
    "tests/serve/test_server_guard.py::test_retriever_refuses_oversized_bodies": "refused < 5 s",
    "tests/serve/test_server_guard.py::test_agent_health_stays_responsive_during_a_large_request": "/health < 2 s",
    "tests/tools/test_search.py::test_real_hotpotqa_search_is_fast": "search p50 < 100 ms",
    "tests/test_chat_command.py::test_an_empty_question_is_refused_before_the_model_loads": "refused < 30 s",
    "tests/tools/test_tool_failures.py::test_an_mcp_server_printing_to_stdout_fails_at_once_in_one_line":
        "failed < 40 s",
    "tests/sft/test_web_sft_data.py::test_web_sft_data_with_the_local_web_down_fails_at_once_naming_it":
        "failed < 30 s",
    "tests/experiments/test_study_config_checks.py::test_experiment_methods_are_checked_at_config_time":
        "refused < 30 s",
}


# Whole pipelines run end to end (several commands, minutes each on 2 cores): the `pipeline` marker. The
# default run leaves them out (pyproject addopts: -m "not timing and not pipeline") so that it stays a
# ten-minute suite; CI runs them as a step of their own (`pytest -m pipeline`), before the timing step.
PIPELINE = {
    "tests/experiments/test_arpo_vs_grpo.py::test_quick_experiment_end_to_end":
        "the ARPO-vs-GRPO study at smoke size: SFT, 2 methods x 4 steps, evaluations, plots",
    "tests/examples/test_own_corpus_recipe.py::test_the_recipe_block_runs_as_written":
        "docs/own_corpus.md's bash block as written: serve, sft-data, SFT, eval, ARPO, eval",
    "tests/examples/test_reasoning_gym_example.py::test_run_sh_runs_the_whole_pipeline_per_seed":
        "examples/reasoning_gym/run.sh: worked examples, SFT, 2 evals, then ARPO and 2 evals per seed (2 seeds)",
    "tests/examples/test_openenv_counter_example.py::test_run_sh_runs_the_whole_pipeline_on_a_tiny_model":
        "examples/openenv_counter/run.sh: 4 OpenEnv server starts, sft data, SFT, eval, ARPO, eval, compare",
}


def pytest_collection_modifyitems(config, items):
    """`timing` for the tests in TIMING, `pipeline` for those in PIPELINE; `slow` for every test that loads
    the real default model."""
    for item in items:
        if item.nodeid.split("[")[0] in TIMING:
            item.add_marker(pytest.mark.timing)
        if item.nodeid.split("[")[0] in PIPELINE:
            item.add_marker(pytest.mark.pipeline)
        if "default_lm" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)

