"""The command line as a user meets it (issue 15 C, D): range-checked inputs with one clear line,
one vocabulary, defaults in every --help, --version, --print-config, plain progress lines when
stderr is not a terminal, no special tokens in `arpo chat`."""

import argparse
import json
import os
import subprocess
import sys

import pytest

from arpo.cli import build_parser, main


def _subparsers(parser, prefix="arpo"):
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                yield f"{prefix} {name}", sp
                yield from _subparsers(sp, f"{prefix} {name}")


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("arpo 0.")


def test_every_help_shows_defaults_and_one_vocabulary():
    from arpo.settings import ToolsConfig
    from arpo.tools import SEARCH_MAX_CHARS, SEARCH_TOP_K

    seen = {}
    for name, sp in _subparsers(build_parser()):
        text = sp.format_help()
        for a in sp._actions:
            if not a.option_strings or a.help == argparse.SUPPRESS or isinstance(a, argparse._HelpAction):
                continue
            assert a.help, f"{name} {a.option_strings[0]}: no help text"
            if not (a.default is None or a.default is False or a.default is argparse.SUPPRESS) and not isinstance(
                    a, argparse._VersionAction):
                assert f"(default: {a.default})" in " ".join(text.split()), f"{name} {a.option_strings[0]}"
            for o in a.option_strings:
                seen.setdefault(o, []).append((name, a.help, a.default))
    # --top-k is sampling wherever it appears; passages per search have their own name and one default
    assert all("sampling" in h for _, h, _ in seen["--top-k"])
    # (a command that takes a run's value by default says what it falls back to)
    for flag, default in (("--search-top-k", SEARCH_TOP_K), ("--search-max-chars", SEARCH_MAX_CHARS)):
        assert {d for _, _, d in seen[flag] if d is not None} == {default}, flag
        assert all(f"else {default})" in h for _, h, d in seen[flag] if d is None), flag
    assert (SEARCH_TOP_K, SEARCH_MAX_CHARS) == (ToolsConfig().search_top_k, ToolsConfig().search_max_chars)
    for old in ("--index", "--max-calls", "--max-new-tokens", "--max-chars"):  # renamed: only hidden aliases remain
        assert all(h == argparse.SUPPRESS for _, h, _ in seen.get(old, [])), old


def test_deprecated_spelling_still_works_with_a_warning(capsys):
    from arpo.commands import deprecated

    p = argparse.ArgumentParser()
    p.add_argument("--max-response-tokens", type=int, default=5)
    deprecated(p, "--max-new-tokens", "--max-response-tokens", dest="max_response_tokens", type=int)
    assert p.parse_args(["--max-new-tokens", "7"]).max_response_tokens == 7
    assert "--max-new-tokens is deprecated, use --max-response-tokens" in capsys.readouterr().err


def _tiny_model_variants(tmp_path):
    from arpo.testing import save_tiny_model

    good = tmp_path / "good"
    save_tiny_model(good)
    variants = {}
    for name, edit in (("badjson", lambda d: (d / "config.json").write_text("{not json")),
                       ("badtype",
                        lambda d: (d / "config.json").write_text(json.dumps({"model_type": "no_such_arch"}))),
                       ("noweights", lambda d: [p.unlink() for p in d.glob("*.safetensors")])):
        d = tmp_path / name
        subprocess.run(["cp", "-r", str(good), str(d)], check=True)
        edit(d)
        variants[name] = d
    return variants


def test_bad_inputs_are_one_clear_line(tmp_path, capsys):
    m = _tiny_model_variants(tmp_path)
    latin = tmp_path / "latin1.yaml"
    latin.write_bytes("steps: 1\n# caf\xe9\n".encode("latin-1"))
    cases = [
        (["eval", "--data", "svamp:test", "--limit", "0"], "--limit: must be >= 1"),
        (["eval", "--data", "svamp:test", "--limit", "-1"], "--limit: must be >= 1"),
        (["chat", "--top-p", "2", "hi"], "--top-p: must be <= 1"),
        (["tool", "python", "--timeout", "-1", "print(1)"], "--timeout: must be > 0"),
        (["train", "data.limit=-1"], "data.limit: must be >= 1"),
        (["train", "agent.temperature=-1"], "agent.temperature: must be >= 0"),
        (["train", "agent.temperature=0"], "agent.temperature: must be > 0 for training"),
        (["train", "algo.kl_coef=-1"], "kl_coef must be >= 0"),
        (["train", "agent.top_p=2"], "agent.top_p: must be in (0, 1]"),
        (["train", "optim.lr=0"], "optim.lr must be > 0"),
        (["train", "model.dtype=float8"], "model.dtype: 'float8'"),
        (["train", "--config", str(latin)], "latin1.yaml:2: not UTF-8 text"),
        (["eval", "--model", str(m["badjson"]), "--data", "svamp:test", "--limit", "1"], "config.json: not valid JSON"),
        (["eval", "--model", str(m["badtype"]), "--data", "svamp:test", "--limit", "1"],
         "model_type 'no_such_arch' is not a model transformers knows"),
        (["eval", "--model", str(m["noweights"]), "--data", "svamp:test", "--limit", "1"], "has no weights"),
        (["eval", "--model", "tiny-random", "--device", "cuda", "--data", "svamp:test", "--limit", "1"],
         "sees no CUDA GPU"),
    ]
    for argv, want in cases:
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse's own errors (exit 2, usage + one line)
            rc = e.code
        err = capsys.readouterr().err
        assert rc == 2 and want in err, (argv, err[-500:])
        assert "Traceback" not in err


def test_print_config_explains_every_section(capsys):
    assert main(["train", "--print-config", "rollout.group_size=8"]) == 0
    out = capsys.readouterr().out
    assert "group_size: 8  # M: trajectories per prompt" in out
    assert "entropy_weight: 0.2  # β" in out and "search_top_k: 3  # passages per search" in out
    assert main(["sft", "--print-config"]) == 0 and "max_seq_len" in capsys.readouterr().out
    assert main(["rollout", "--print-config"]) == 0 and "initial_rollouts" in capsys.readouterr().out


def test_progress_is_plain_lines_when_not_a_terminal(tmp_path):
    from arpo.testing import save_tiny_model

    save_tiny_model(tmp_path / "m")
    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps({"question": "1+1?", "response": "<answer> \\boxed{2} </answer>"}) + "\n")
    p = subprocess.run([sys.executable, "-m", "arpo", "sft", f"model.name={tmp_path / 'm'}", f"data.path=[{data}]",
                        "prompts_per_step=1", "steps=2", f"run.dir={tmp_path / 'run'}", "run.tensorboard=false"],
                       capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = [x for x in p.stderr.splitlines() if x.startswith("sft step")]
    assert [x.split()[2] for x in lines] == ["1/2", "2/2"] and "loss" in lines[0]
    assert p.stdout.startswith("arpo sft: done") and "final_loss" in p.stdout  # a readable summary
    q = subprocess.run([sys.executable, "-m", "arpo", "sft", f"model.name={tmp_path / 'm'}", f"data.path=[{data}]",
                        "prompts_per_step=1", "steps=3", f"run.dir={tmp_path / 'run'}", "run.tensorboard=false",
                        "--resume", "--json", "--quiet"], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert q.returncode == 0, q.stderr[-2000:]
    assert json.loads(q.stdout)["steps"] == 3 and not q.stderr.strip()


def test_chat_prints_no_special_tokens(capsys):
    assert main(["chat", "--model", "tiny-random", "--tools", "", "--max-response-tokens", "6", "--temperature", "0",
                 "hello"]) == 0
    out = capsys.readouterr().out
    assert "<|" not in out and "</s>" not in out
    assert main(["chat", "--model", "tiny-random", "--tools", "", "--max-response-tokens", "6", "--json",
                 "hello"]) == 0
    assert "<|" not in json.loads(capsys.readouterr().out)["text"]


@pytest.mark.parametrize("session", [True, False])
def test_chat_session_reuses_a_variable_from_an_earlier_call(capsys, monkeypatch, session):
    """`arpo chat --session`: a second call reads the variable the first one set (the model's text is
    scripted; the two calls run in the real sandboxed interpreter). Without --session it is gone."""
    from arpo.rollout.agent import AgentLoop
    from arpo.testing import scripted_hook

    segments = ["<python>nums = [3, 1, 2]</python>", " <python>print(sorted(nums))</python>",
                " <answer> \\boxed{[1, 2, 3]} </answer>"]
    params = AgentLoop.params

    def scripted(self, prompt_len, seed):
        p = params(self, prompt_len, seed)
        p.logits_hook = scripted_hook(self.tok, segments)
        return p

    monkeypatch.setattr(AgentLoop, "params", scripted)
    args = ["chat", "--model", "tiny-random", "--json", "--max-response-tokens", "200", "sort 3 1 2"]
    assert main(args[:1] + (["--session"] if session else []) + args[1:]) == 0
    out = json.loads(capsys.readouterr().out)
    calls = out["tool_calls"]
    assert len(calls) == 2 and calls[0]["ok"]
    if session:
        assert calls[1]["ok"] and calls[1]["output"].strip() == "[1, 2, 3]"
    else:
        assert not calls[1]["ok"] and "NameError" in calls[1]["output"]
