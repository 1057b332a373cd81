"""A web provider's missing key is named at the start of every command (settings/web.py require_web_keys)
(issue 42 item 8: what a newcomer's first tries found; each test failed before its fix)."""

from __future__ import annotations

from arpo.cli import main
from arpo.ports import free_port


def test_a_missing_provider_key_is_named_at_the_start_of_every_command(tmp_path, hotpot_row, capsys, monkeypatch):
    """`arpo train` with serper and no key trained on (every search an error); eval, chat, serve agent
    and web sft-data the same: all check with one function (settings/web.py require_web_keys) at start."""
    monkeypatch.delenv("SERPER_API_KEY", raising=False)
    data = hotpot_row
    web = ["--tools", "web_search", "--web-provider", "serper"]
    commands = {
        "train": ["train", "model.name=tiny-random", f"data.path={data}", "tools.enabled=[web_search]",
                  "tools.web.provider=serper", f"run.dir={tmp_path / 'run'}", "steps=1", "--quiet"],
        "eval": ["eval", "--model", "tiny-random", "--data", str(data), *web, "--quiet"],
        "chat": ["chat", "--model", "tiny-random", *web, "Who?"],
        "serve agent": ["serve", "agent", "--model", "tiny-random", *web, "--port", str(free_port())],
        "web sft-data": ["web", "sft-data", "--data", str(data), "--out", str(tmp_path / "o.jsonl"),
                         "--web-provider", "serper"],
    }
    import arpo.models

    def no_model(*a, **k):
        raise AssertionError("a model loaded before the key was checked")

    monkeypatch.setattr(arpo.models, "load_model", no_model)
    for name, argv in commands.items():
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 2 and "needs an API key: set the environment variable SERPER_API_KEY" in err, (name, err[-800:])
    assert not (tmp_path / "run").exists()
