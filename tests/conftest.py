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



@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """A 3-step ARPO run of the tiny model with tool calls and branches: metrics.jsonl, rollouts/."""
    from arpo.testing import train_scripted_run

    return train_scripted_run(tmp_path_factory.mktemp("tiny_run"))
