"""`arpo eval`: its data flags, a full disk under --out, hop2's own tool and prompt (issue 42 item 8: what a
newcomer's first tries found; each test failed before its fix)."""

from __future__ import annotations

from arpo.cli import main


def test_two_data_flags_evaluate_both():
    """`arpo eval --data A --data B` evaluated only B (the second flag replaced the first)."""
    from arpo.cli import build_parser

    args = build_parser().parse_args(["eval", "--model", "m", "--data", "a.jsonl", "--data", "b.jsonl", "c.jsonl"])
    assert args.data == ["a.jsonl", "b.jsonl", "c.jsonl"]


def test_a_full_disk_is_one_line_and_eval_keeps_its_results(tmp_path, full_disk, capsys):
    """A full disk gave tracebacks (train's checkpoint, eval --out, compare, ...), and eval --out threw
    the finished evaluation away."""
    import json

    from arpo.recipes.eval import write_out

    disk = full_disk
    ev = tmp_path / "a.json"
    ev.write_text(json.dumps({"results": {"d": {"pass@1": 0.5, "n": 2}}}))
    rc = main(["compare", f"a={ev}", "--out", str(disk / "c.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "c.json: No space left on device" in err and "Traceback" not in err, err
    assert not list(disk.glob(".c.json.tmp-*"))  # no half-written file left behind
    kept = write_out(disk / "e.json", json.dumps({"results": {"x": 1}}))
    assert kept != disk / "e.json" and json.loads(kept.read_text()) == {"results": {"x": 1}}
    assert "the evaluation is kept in" in capsys.readouterr().err
    kept.unlink()


def test_eval_of_hop2_asks_with_hop2s_tool_and_prompt(capsys):
    """`arpo eval --data hop2:dev` used the python tool and the math prompt instead of hop2's lookup
    tool and prompt (its rows' task is math); a flag still wins."""
    from arpo.data.sources import builtin_agent

    assert builtin_agent("hop2:dev[0:3]") == (("arpo.data.hop2:lookup",), "hop2")
    assert builtin_agent("webhop:test") == (("web_search", "browse"), "webhop")
    assert builtin_agent("svamp:test") == ((), None) and builtin_agent("my.jsonl") == ((), None)
    rc = main(["eval", "--model", "tiny-random", "--data", "hop2:dev[0:1]", "--max-response-tokens", "2"])
    err = capsys.readouterr().err
    assert rc == 0 and "prompt template hop2" in err and "tools lookup," in err, err[-800:]
    rc = main(["eval", "--model", "tiny-random", "--data", "hop2:dev[0:1]", "--max-response-tokens", "2",
               "--tools", "python"])
    err = capsys.readouterr().err
    assert rc == 0 and "tools python," in err, err[-800:]


def test_eval_out_records_the_checkpoint_a_run_dir_resolved_to(tmp_path, capsys):
    """`arpo eval --model RUN_DIR --out` recorded only the string RUN_DIR, not which of its checkpoints
    was evaluated: it records both, with the checkpoint's step (the latest: 2 of 2); `arpo compare`
    reads the file as before."""
    import json

    from arpo.testing import save_tiny_model

    run = tmp_path / "run"
    for k in (1, 2):
        ck = run / "checkpoints" / f"step_{k:06d}"
        save_tiny_model(ck / "model")
        (ck / "state.json").write_text(json.dumps({"step": k}))
    out = tmp_path / "ev.json"
    rc = main(["eval", "--model", str(run), "--data", "svamp:test[0:1]", "--max-response-tokens", "4",
               "--out", str(out), "--quiet"])
    assert rc == 0, capsys.readouterr().err[-2000:]
    got = json.loads(out.read_text())
    ck = run / "checkpoints" / "step_000002"
    assert got["model"] == str(run), got["model"]
    assert got["model_dir"] == str(ck / "model") and got["checkpoint"] == str(ck) and got["checkpoint_step"] == 2, got
    capsys.readouterr()
    assert main(["compare", f"a={out}", f"b={out}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["label"] == "a"
