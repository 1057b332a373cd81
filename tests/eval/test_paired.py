"""Accuracy intervals and paired wins/losses of eval files (arpo compare), on hand-made eval JSONs."""

import json
import math

import pytest

from arpo.eval.paired import accuracy_interval, compare_runs, paired, sign_test_p, wilson_interval


def recs(correct: dict[str, list[bool]]) -> list[dict]:
    return [{"example_id": q, "sample": s, "correct": c} for q, cs in correct.items() for s, c in enumerate(cs)]


def eval_file(correct: dict[str, list[bool]], ds: str = "svamp:test") -> dict:
    r = recs(correct)
    acc = sum(c["correct"] for c in r) / len(r)
    return {"model": "m", "results": {ds: {"pass@1": acc, "score": acc, "reward": acc, "format_error_rate": 0.0,
                                           "tool_format_rate": 1.0, "tool_calls": 1.0, "response_tokens": 30.0}},
            "records": {ds: r}}


def test_wilson_interval_known_values():
    # reference values: scipy.stats.binomtest(14, 100).proportion_ci(method="wilson") = (0.085263, 0.221372)
    lo, hi = wilson_interval(14, 100)
    assert lo == pytest.approx(0.0852634, abs=1e-6) and hi == pytest.approx(0.2213719, abs=1e-6)
    lo, hi = wilson_interval(0, 200)  # never below 0, and not degenerate at 0 successes
    assert lo == 0.0 and hi == pytest.approx(0.01884, abs=1e-4)
    assert wilson_interval(200, 200)[1] == 1.0 and wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(5, 4)


def test_accuracy_interval_is_over_questions_not_samples():
    s = accuracy_interval(recs({"a": [True, False], "b": [True, True], "c": [False, False], "d": [False, False]}))
    assert s["questions"] == 4 and s["accuracy"] == pytest.approx(0.375)
    assert (s["ci_low"], s["ci_high"]) == pytest.approx(wilson_interval(1.5, 4))


def test_paired_wins_losses_and_noise():
    a = recs({"q1": [False], "q2": [False], "q3": [True], "q4": [True], "q5": [False], "only_a": [True]})
    b = recs({"q1": [True], "q2": [True], "q3": [False], "q4": [True], "q5": [False], "only_b": [True]})
    p = paired(a, b)
    assert (p["common"], p["only_a"], p["only_b"]) == (5, 1, 1)
    assert (p["wins"], p["losses"], p["net"]) == (2, 1, 1)
    assert p["win_ids"] == ["q1", "q2"] and p["loss_ids"] == ["q3"]
    assert (p["ties_solved"], p["ties_unsolved"]) == (1, 1)
    assert p["noise"] == pytest.approx(2 * math.sqrt(3)) and not p["significant"]
    # 12 newly solved, 1 newly failed: 11 > 2*sqrt(13) = 7.2 -> larger than the paired noise
    a = recs({f"q{i}": [i >= 12] for i in range(13)})
    b = recs({f"q{i}": [i < 12] for i in range(13)})
    p = paired(a, b)
    assert (p["wins"], p["losses"]) == (12, 1) and p["significant"] and p["p_sign"] < 0.01
    assert paired(b, a)["significant"] and paired(b, a)["net"] == -11  # a significant drop is flagged too


def test_sign_test_p():
    assert sign_test_p(0, 0) == 1.0
    assert sign_test_p(3, 3) == 1.0
    assert sign_test_p(5, 0) == pytest.approx(2 / 32)
    assert sign_test_p(0, 5) == sign_test_p(5, 0)


def test_compare_runs_pairs_consecutive_labels():
    base = eval_file({"q1": [False], "q2": [False], "q3": [False]})
    sft = eval_file({"q1": [True], "q2": [False], "q3": [False]})
    rl = eval_file({"q1": [True], "q2": [True], "q3": [True]})
    out = compare_runs({"base": base, "sft": sft, "arpo": rl, "old": {"results": {}}})
    assert [(i["label"], i["accuracy"]) for i in out["intervals"]] == [
        ("base", 0.0), ("sft", pytest.approx(1 / 3)), ("arpo", 1.0)]
    assert [(p["a"], p["b"], p["wins"], p["losses"]) for p in out["paired"]] == [("base", "sft", 1, 0),
                                                                               ("sft", "arpo", 2, 0)]


def test_compare_cli_prints_intervals_and_paired(tmp_path, capsys):
    from arpo.cli import main

    files = {"sft": eval_file({"q1": [False], "q2": [True], "q3": [False], "q4": [True]}),
             "arpo": eval_file({"q1": [True], "q2": [True], "q3": [True], "q4": [False]})}
    args = ["compare"]
    for k, v in files.items():
        (tmp_path / f"{k}.json").write_text(json.dumps(v))
        args.append(f"{k}={tmp_path / f'{k}.json'}")
    assert main(args + ["--out", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    lines = [" ".join(x.strip() for x in line.split("│") if x.strip()) for line in out.splitlines()]
    assert "sft 4 0.500 [0.150, 0.850]" in lines and "arpo 4 0.750 [0.301, 0.954]" in lines
    assert "svamp:test sft → arpo 4 2 1 +1 3.5 noise 1" in lines
    saved = json.loads((tmp_path / "c.json").read_text())
    assert saved["paired"][0]["wins"] == 2 and len(saved["rows"]) == 2 and saved["intervals"][1]["label"] == "arpo"
