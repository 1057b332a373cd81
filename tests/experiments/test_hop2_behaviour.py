"""hop2_behaviour: answers by tool calls per run, from the eval records the runs keep, and
`arpo experiment hop2-stats` printing them where the run dirs sit next to results.json."""

import json

from experiments.hop2_behaviour import (
    answers_by_calls,
    behaviour,
    behaviour_table,
    modal_cell,
    most_calls,
    outcome,
    record_file,
    samples_by_calls,
    training,
    training_table,
)


def rec(calls: int, correct: bool, finish: str = "answer", answer: str = "7") -> dict:
    return {"finish_reason": finish, "correct": correct, "tool_calls": {"lookup": calls} if calls else {},
            "answer": answer}


def test_answers_by_calls_counts_by_hand():
    recs = [rec(2, True, answer="12"), rec(2, False, answer=" 1"), rec(1, False, answer="1"), rec(3, True, answer="5"),
            rec(0, False, answer="m"), rec(2, False, "length", answer="1")]
    assert answers_by_calls(recs) == {"questions": 6, "correct": 2, "no_answer": 1,
                                      "by_calls": {0: [1, 0], 1: [1, 0], 2: [2, 1], 3: [1, 1]},
                                      "modal": ["1", 2]}  # " 1" and "1"; the cut-off record's does not count
    two_tools = {"finish_reason": "answer", "correct": True, "tool_calls": {"web_search": 1, "browse": 2}}
    assert answers_by_calls([two_tools])["by_calls"] == {3: [1, 1]}
    assert answers_by_calls([rec(2, False, "length")])["modal"] is None


def test_the_most_common_answer_cell():
    assert modal_cell(["1", 48], 60) == "`1` 0.80"
    assert modal_cell(None, 60) == "–"
    assert modal_cell(["", 3], 4) == "(empty) 0.75"
    assert modal_cell(["a|b`c", 1], 4) == "`a/b'c` 0.25"  # nothing that breaks a Markdown table
    assert modal_cell(["x" * 30, 1], 2, width=8) == "`xxxxxxx…` 0.50"
    two_tools = {"finish_reason": "answer", "correct": True, "tool_calls": {"web_search": 1, "browse": 2}}
    assert answers_by_calls([two_tools])["by_calls"] == {3: [1, 1]}


def test_the_table_buckets_and_marks_missing_runs(tmp_path):
    f = record_file(tmp_path, "arpo", 0, 10, "dev")
    f.parent.mkdir(parents=True)
    # 4 questions: two after 2 lookups (one right), one after 1, one after 4 (right)
    f.write_text(json.dumps({"records": [rec(2, True), rec(2, False), rec(1, False), rec(4, True)]}))
    t = record_file(tmp_path, "arpo", 0, 10, "test")
    assert t == tmp_path / "rl" / "arpo_seed0" / "test_eval" / "heldout_step_000010.json"
    results = {"dev": {"selected_steps": {"arpo": 10}}, "settings": {"seeds": 2}, "test": None}
    beh = behaviour(results, tmp_path)
    assert list(beh) == ["dev"] and beh["dev"]["arpo"][1] is None  # seed 1 has no records
    rows = behaviour_table(beh, "dev").splitlines()
    assert rows[0] == ("| method | seed | accuracy | 0 calls | 1 calls | 2 calls | ≥ 3 calls | no answer "
                       "| most common answer |")
    assert rows[2] == "| arpo | 0 | 0.500 | 0 | 0.25 (0.00) | 0.50 (0.50) | 0.25 (1.00) | 0.00 | `7` 1.00 |"
    assert rows[3] == "| arpo | 1 | – | – | – | – | – | – | – |"

    assert most_calls(results) == 3  # a hop2 file (no task): the table ends at ≥ 3, one past two lookups
    webhop = behaviour_table(beh, "dev", most_calls({"settings": {"task": "webhop"}})).splitlines()
    assert webhop[0].endswith("| 2 calls | 3 calls | 4 calls | ≥ 5 calls | no answer | most common answer |")
    assert webhop[2] == ("| arpo | 0 | 0.500 | 0 | 0.25 (0.00) | 0.50 (0.50) | 0 | 0.25 (1.00) | 0 | 0.00 "
                         "| `7` 1.00 |")


def test_the_hop2_stats_command_prints_them_where_the_runs_are(tmp_path, capsys):
    """Next to a results.json with its run dirs (`OUT/rl`), hop2-stats adds the answers-by-calls tables
    to the statistics tables; the committed hop2 study's records are a real such layout."""
    from pathlib import Path

    from arpo.cli import main

    committed = Path(__file__).resolve().parents[2] / "docs" / "results" / "hop2_arpo_vs_grpo.json"
    results = json.loads(committed.read_text())
    (tmp_path / "results.json").write_text(committed.read_text())
    step = results["dev"]["selected_steps"]["arpo"]
    f = record_file(tmp_path, "arpo", 0, step, "test")
    f.parent.mkdir(parents=True)
    f.write_text(json.dumps({"records": [rec(2, True), rec(1, False)]}))
    assert main(["experiment", "hop2-stats", "--results", str(tmp_path / "results.json")]) == 0
    out = capsys.readouterr().out
    assert "Answers by tool calls, dev" in out and "Answers by tool calls, test" in out
    assert "| arpo | 0 | 0.500 | 0 | 0.50 (0.00) | 0.50 (1.00) | 0 | 0.00 | `7` 1.00 |" in out  # the test split's row
    assert "Accuracy at matched executed tool calls" not in out  # hop2-arpo-vs-grpo has no matched_calls
    assert "Training samples by tool calls" in out  # no rollouts kept here: every arm's row says 0 runs
    assert "| arpo | 0 | 0 | 0 | 0 | 0 | 0 |" in out


def traj(calls: int, correct: bool = False, format_error: str | None = None) -> dict:
    return {"tool_calls": [{"tool": "browse"}] * calls, "correct": correct, "format_error": format_error}


def test_a_sample_is_a_format_error_else_wrong_or_right():
    assert outcome(traj(2)) == 1 and outcome(traj(4, True)) == 2
    assert outcome(traj(5, format_error="unclosed <browse>")) == 0
    assert outcome(traj(4, True, "two answers")) == 0  # right but penalized: the −1 is what it earned


def test_samples_by_calls_counts_by_hand():
    trees = [{"step": 1, "trajectories": [traj(4, True), traj(5, format_error="x"), traj(2)]},
             {"step": 2, "trajectories": [traj(2), traj(4)]},
             {"step": 3, "trajectories": [traj(2), traj(2, format_error="x"), traj(0, format_error="y")]}]
    assert samples_by_calls(trees, 1, 3) == {
        "samples": 8, "by_calls": {0: [1, 0, 0], 2: [1, 3, 0], 4: [0, 1, 1], 5: [1, 0, 0]},
        "first": {4: 1, 5: 1, 2: 1}, "last": {2: 2, 0: 1}}


def test_training_reads_the_kept_rollouts_and_the_table_buckets_them(tmp_path):
    import gzip

    run = tmp_path / "rl" / "arpo_seed1" / "rollouts"
    run.mkdir(parents=True)
    for step, trajs in ((1, [traj(4, True), traj(6, format_error="x")]), (2, [traj(2), traj(3)]),
                        (3, [traj(2)])):  # step 3 is past the study's 2 steps: not counted
        with gzip.open(run / f"step_{step}.jsonl.gz", "wt") as f:
            f.write(json.dumps({"step": step, "trajectories": trajs}) + "\n")
    results = {"dev": {"selected_steps": {"arpo": 2, "grpo": 2}}, "settings": {"seeds": 2, "steps": 2}}
    tr = training(results, tmp_path)
    assert tr["arpo"] == {"samples": 4, "by_calls": {2: [0, 1, 0], 3: [0, 1, 0], 4: [0, 0, 1], 6: [1, 0, 0]},
                          "first": {4: 1, 6: 1}, "last": {2: 1, 3: 1}, "runs": 1}
    assert tr["grpo"]["runs"] == 0 and tr["grpo"]["samples"] == 0
    rows = training_table(tr, most=3).splitlines()
    assert rows[0] == "| method | runs | samples | 0 calls | 1 calls | 2 calls | ≥ 3 calls |"
    # ≥ 3 pools 3, 4 and 6 calls: one format error, one wrong, one right; two at step 1, one at step 2
    assert rows[2] == "| arpo | 1 | 4 | 0 | 0 | 0 / 1 / 0 (0 → 1) | 1 / 1 / 1 (2 → 1) |"
    assert rows[3] == "| grpo | 0 | 0 | 0 | 0 | 0 | 0 |"
