"""`arpo train` keeps its rollouts (training/rollout_log.py): RUN_DIR/rollouts/step_N.jsonl.gz with
tokens, entropies, branch decisions, tool calls, rewards, per-token advantages and old log-probs."""

import gzip
import json
import statistics

import pytest

from arpo.training.rollout_log import RolloutLog, token_texts, tree_summary


def _trees(path):
    with gzip.open(path, "rt") as f:
        return [json.loads(x) for x in f]


def _full(trajs, i):
    """A trajectory's whole response: its parent's tokens up to the branch point, then its own."""
    t = trajs[i]
    head = {k: [] for k in ("tokens", "mask", "entropy", "logp")}
    if t["parent"] is not None:
        p = _full(trajs, t["parent"])
        head = {k: p[k][: t["start"]] for k in head}
    return {k: head[k] + t[k] for k in head}


def test_token_texts_concatenate_to_the_text(tiny_tok):
    # "≈", "é" and "😀" are 2-4 byte-level tokens each here: no piece may show a half character
    text = "<think> I need 17*23 ≈ 391, café 😀. </think> <python> print(17 * 23) </python>\n<result>\n391\n</result>"
    ids = tiny_tok.encode(text, add_special_tokens=False)
    pieces = token_texts(tiny_tok, ids)
    assert len(pieces) == len(ids) and len(ids) > len(tiny_tok.encode(text.replace("≈", "=")))
    assert "".join(pieces) == tiny_tok.decode(ids) == text
    assert not any("\ufffd" in p for p in pieces)
    assert token_texts(tiny_tok, []) == []


def test_train_writes_every_step_with_what_trained(tiny_run):
    files = sorted((tiny_run / "rollouts").glob("step_*.jsonl.gz"))
    assert [f.name for f in files] == ["step_1.jsonl.gz", "step_2.jsonl.gz", "step_3.jsonl.gz"]
    metrics = [json.loads(x) for x in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    decisions = []
    for f, m in zip(files, metrics, strict=True):
        trees = _trees(f)
        assert len(trees) == 2  # prompts_per_step
        assert sum(len(t["trajectories"]) for t in trees) == m["trajectories"]
        assert sum(t["parent"] is not None for tr in trees for t in tr["trajectories"]) == m["branches"]
        for tr in trees:
            assert f.read_bytes() and tr["format"] == "arpo-rollouts/1"
            assert tr["trained"] and tr["attribution"] == "soft"
            assert tr["summary"] == tree_summary(tr) and list(tr)[0] == "summary"  # first: read without the tokens
            assert tr["question"].startswith("What is") and tr["prompt"].endswith("assistant\n")
            trajs = tr["trajectories"]
            rewards = [t["reward"] for t in trajs]
            mu, sd = statistics.fmean(rewards), statistics.stdev(rewards)
            for t in trajs:
                full = _full(trajs, t["id"])
                n = t["n_tokens"]
                assert all(len(full[k]) == n for k in full)
                assert len(t["tokens"]) == n - t["start"]  # only its own tokens are stored
                text = "".join(full["tokens"])
                assert text.count("<python>") == 2 and text.endswith("</answer>")
                # the loss mask is 0 exactly on the tool results, which hold the tool's output
                for c in t["tool_calls"]:
                    a, b = c["result_span"]
                    assert set(full["mask"][a:b]) == {0} and c["output"] in "".join(full["tokens"][a:b])
                assert sum(full["mask"]) == n - sum(b - a for a, b in (c["result_span"] for c in t["tool_calls"]))
                # soft attribution: the trajectory's group-normalized reward on every token (spec §3)
                assert len(t["advantage"]) == n
                assert t["advantage"] == pytest.approx([(t["reward"] - mu) / (sd + 1e-6)] * n, abs=2e-4)
                # old log-probs: the engine's (old_logprobs=auto on float32 CPU); forced tokens have ~0
                assert all(lp <= 1e-4 for lp in full["logp"]) and min(full["logp"]) < -0.5
                assert all(h >= 0 for h in full["entropy"])
                if t["parent"] is not None:  # a branch starts right after one of its parent's tool results
                    assert t["start"] in [c["result_span"][1] for c in trajs[t["parent"]]["tool_calls"]]
                for d in t["decisions"]:
                    assert set(d) == {"tool_call_index", "probability", "delta_entropy", "branched", "consecutive"}
                    # P = clip(1 − τ + β·ΔH, 0, 1) with the defaults τ = 0.5, β = 0.2
                    assert d["probability"] == pytest.approx(min(1, max(0, 0.5 + 0.2 * d["delta_entropy"])), abs=1e-5)
                    decisions.append(d["branched"])
    assert True in decisions and False in decisions  # both kinds happen in this run
    prof = [json.loads(x) for x in (tiny_run / "rollouts" / "entropy.jsonl").read_text().splitlines()]
    assert [p["step"] for p in prof] == [1, 2, 3]
    assert all(p["tool_results"] == 2 * p["trajectories"] and p["after_tool"][0] is not None for p in prof)


def test_every_k_steps_trees_per_step_and_hard_attribution(tmp_path, scripted_run):
    run = scripted_run(tmp_path, steps=2,
                       **{"run.save_rollouts": 2, "run.rollout_trees": 1, "algo.attribution": "hard"})
    assert [f.name for f in (run / "rollouts").glob("step_*")] == ["step_2.jsonl.gz"]
    [tree] = _trees(run / "rollouts" / "step_2.jsonl.gz")
    assert tree["attribution"] == "hard"
    # what trained is stored: with hard attribution a token shared by a branch and its parent has one
    # advantage (the mean over its sharers), the branch's own tokens its own
    trajs = tree["trajectories"]
    leaves = [t for t in trajs if t["parent"] is not None and all(c["parent"] != t["id"] for c in trajs)]
    assert leaves
    for t in leaves:  # a branch nothing forked from: its own tokens are its alone
        p, b = trajs[t["parent"]], t["start"]
        assert t["advantage"][:b] == p["advantage"][:b]
        assert len(set(t["advantage"][b:])) == 1 and t["advantage"][b] != t["advantage"][0]
    # profiles cover every tree of the saved step, not just the kept one
    prof = json.loads((run / "rollouts" / "entropy.jsonl").read_text())
    assert prof["step"] == 2 and prof["trajectories"] >= 2 * 2


def test_fresh_run_clears_and_resume_truncates(tmp_path):
    root = tmp_path / "rollouts"
    root.mkdir()
    for k in (1, 2, 3):
        (root / f"step_{k}.jsonl.gz").write_bytes(gzip.compress(b"{}\n"))
    (root / "entropy.jsonl").write_text("".join(json.dumps({"step": k}) + "\n" for k in (1, 2, 3)))
    RolloutLog(tmp_path, 1, 0, None, resume_step=2)
    assert sorted(p.name for p in root.glob("step_*")) == ["step_1.jsonl.gz", "step_2.jsonl.gz"]
    assert [json.loads(x)["step"] for x in (root / "entropy.jsonl").read_text().splitlines()] == [1, 2]
    RolloutLog(tmp_path, 0, 0, None)  # a fresh run, even with saving off: stale trees would mislead the viewer
    assert not list(root.glob("step_*")) and not (root / "entropy.jsonl").read_text()


def test_size_per_token_is_as_documented(tiny_run):
    """The module docstring promises ≈ 7 gzipped bytes per stored token (all fields); keep it true."""
    files = list((tiny_run / "rollouts").glob("step_*.jsonl.gz"))
    tokens = sum(len(t["tokens"]) for f in files for tr in _trees(f) for t in tr["trajectories"])
    per_token = sum(f.stat().st_size for f in files) / tokens
    assert per_token < 12, per_token


def test_bad_settings_are_named():
    from arpo.errors import ArpoError
    from arpo.settings import TrainRunConfig

    with pytest.raises(ArpoError, match="run.save_rollouts"):
        TrainRunConfig(save_rollouts=-1).validate()
