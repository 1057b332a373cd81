"""Fixtures of the training tests: a tiny random-weight model saved to disk with six arithmetic
questions beside it (one per test module: runs write next to it)."""

from __future__ import annotations

import json

import pytest

from arpo.testing import save_tiny_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """DIR/model (the tiny random model) and DIR/q.jsonl ("What is i + i?" for i < 6, task math)."""
    d = tmp_path_factory.mktemp("tiny")
    save_tiny_model(d / "model")
    (d / "q.jsonl").write_text("".join(json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i),
                                                   "task": "math"}) + "\n" for i in range(6)))
    return d
