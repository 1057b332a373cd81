"""The judge's cache file (eval/judge.py JudgeCache) (issue 42 item 8: what a newcomer's first tries found;
each test failed before its fix)."""

from __future__ import annotations


def test_a_judge_cache_that_is_not_one_is_refused(tmp_path, hotpot_row):
    """`--judge-cache` pointed at the data file appended judgments to the dataset (any file was)."""
    import pytest

    from arpo.errors import ArpoError
    from arpo.eval.judge import JudgeCache

    data = hotpot_row
    with pytest.raises(ArpoError, match=r"d.jsonl:1: not a judge cache"):
        JudgeCache(data)
    (tmp_path / "notes.txt").write_text("hello\n")
    with pytest.raises(ArpoError, match="not a judge cache"):
        JudgeCache(tmp_path / "notes.txt")
    cache = JudgeCache(tmp_path / "c.jsonl")  # new, then reopened: a cache
    cache.put({"key": "k", "verdict": True})
    assert JudgeCache(tmp_path / "c.jsonl").get("k") == {"key": "k", "verdict": True}
