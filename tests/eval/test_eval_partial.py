"""eval/partial.py: the finished answers of an `arpo eval --out` kept on disk for `--resume` (issue 62): a
line a crash cut short, a run that stopped before its first batch, other settings named by key."""

import json

import pytest

from arpo.errors import ArpoError
from arpo.eval.partial import PartialRun, mismatch, partial_path

SETTINGS = {"model": "m", "agent": {"temperature": 0.0, "max_response_tokens": 8}, "data": ["a.jsonl"]}


def _recs(ids):
    return [{"example_id": i, "sample": 0, "text": f"answer {i}"} for i in ids]


def test_a_line_cut_short_is_answered_again_and_the_rest_resumes(tmp_path):
    out = tmp_path / "ev.json"
    p, n = PartialRun.open(out, SETTINGS, resume=False)
    assert n == 0 and p.path == partial_path(out) == tmp_path / "ev.partial.jsonl"
    p.add("a.jsonl", 0, _recs(["q0", "q1"]))
    p.add("a.jsonl", 2, _recs(["q2", "q3"]))
    p.close()
    with p.path.open("a") as f:  # a crash in the middle of the third batch's line
        f.write('{"dataset": "a.jsonl", "start": 4, "records": [{"exa')
    with pytest.raises(ArpoError, match=r"holds 4 finished answers of an interrupted evaluation: add --resume"):
        PartialRun.open(out, SETTINGS, resume=False)
    p, n = PartialRun.open(out, SETTINGS, resume=True)
    assert n == 4 and [r["example_id"] for r in p.done("a.jsonl")] == ["q0", "q1", "q2", "q3"]
    assert p.done("b.jsonl") == []
    p.add("a.jsonl", 4, _recs(["q4"]))  # appended after the intact lines: the cut one is gone
    p.close()
    lines = [json.loads(x) for x in p.path.read_text().splitlines()]
    assert lines[0] == {"arpo_eval_partial": 1, "settings": SETTINGS} and len(lines) == 3
    p, n = PartialRun.open(out, SETTINGS, resume=True)
    assert n == 5
    p.remove()
    assert not p.path.exists()


def test_other_settings_are_refused_by_name_and_an_empty_file_starts_over(tmp_path):
    out = tmp_path / "ev.json"
    p, _ = PartialRun.open(out, SETTINGS, resume=False)
    p.close()  # stopped before its first batch: nothing to keep, nothing to refuse
    p, n = PartialRun.open(out, SETTINGS | {"model": "other"}, resume=False)
    assert n == 0
    p.add("a.jsonl", 0, _recs(["q0"]))
    p.close()
    hotter = SETTINGS | {"agent": {"temperature": 0.7, "max_response_tokens": 8}, "model": "other"}
    with pytest.raises(ArpoError, match=r"other settings \(agent.temperature: 0.0 then, 0.7 now\)"):
        PartialRun.open(out, hotter, resume=True)
    assert mismatch({"a": {"b": [1, 2]}}, {"a": {"b": [1, 2]}}) is None
    assert mismatch({"a": 1}, {"a": 1, "c": 2}) == 'c: "(unset)" then, 2 now'


def test_a_file_that_is_not_a_partial_file_is_not_overwritten(tmp_path):
    out = tmp_path / "ev.json"
    partial_path(out).write_text('{"question": "a data row"}\n')
    with pytest.raises(ArpoError, match="not the partial file of `arpo eval --out`"):
        PartialRun.open(out, SETTINGS, resume=True)
    assert partial_path(out).read_text() == '{"question": "a data row"}\n'
