"""Shared fixtures: one tiny random-weight model for the whole session (building it and importing
transformers costs seconds; every test file reuses it)."""

import os

import pytest
import torch

torch.set_num_threads(int(os.environ.get("ARPO_TEST_THREADS", "2")))


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


# a scripted agent: two python calls, then an answer; each segment opens with free tokens sampled from
# the model, so entropies and ARPO's branch decisions vary
SCRIPTED_RUN = ["<python> print(17 * 23) </python>", "<python> print(2 + 2) </python>", "<answer> \\boxed{4} </answer>"]


def train_scripted(overrides: dict, script: list, free_tokens: int = 0) -> None:
    """Really train with `arpo train`'s recipe on the dotted config `overrides`, every rollout's text
    scripted by `script` (arpo.testing.scripted_hook; each segment opens with `free_tokens` sampled
    tokens). Runs on the thread count the overrides give, then restores the caller's."""
    from arpo.config import load_config
    from arpo.recipes import train
    from arpo.rollout.arpo import ARPORollout
    from arpo.testing import hook_rollout, scripted_hook

    init = ARPORollout.__init__

    def scripted(self, *a, **k):
        init(self, *a, **k)
        hook_rollout(self, scripted_hook(self.engine.tokenizer, script, free_tokens=free_tokens))

    threads = torch.get_num_threads()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ARPORollout, "__init__", scripted)
            train.run(load_config(train.TrainConfig, None, [f"{k}={v}" for k, v in overrides.items()]), quiet=True)
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
