"""`arpo chat`: the question from stdin, an empty question refused, the answer streamed (issue 42 item 8:
what a newcomer's first tries found; each test failed before its fix)."""

from __future__ import annotations

import io
import time

from arpo.cli import main


def test_chat_reads_the_question_from_stdin_with_a_dash(capsys, monkeypatch):
    """`echo q | arpo chat -` asked the model "-"."""
    import arpo.data.prompts as prompts

    asked = []
    render = prompts.render_prompt
    monkeypatch.setattr(prompts, "render_prompt", lambda tok, q, *a, **k: asked.append(q) or render(tok, q, *a, **k))
    monkeypatch.setattr("sys.stdin", io.StringIO("What is 2+3?\n"))
    rc = main(["chat", "--model", "tiny-random", "--tools", "none", "--max-response-tokens", "2", "--json", "-"])
    assert rc == 0 and asked == ["What is 2+3?"], (asked, capsys.readouterr().err[-500:])
    from arpo.commands.chat import read_question

    monkeypatch.setattr("sys.stdin", io.StringIO("What is 2+3?\n"))
    assert read_question("-") == "What is 2+3?"
    assert read_question("-x") == "-x"


def test_an_empty_question_is_refused_before_the_model_loads(capsys, monkeypatch):
    """An empty question generated for 95 s (the whole budget) before answering nothing."""
    t0 = time.perf_counter()
    assert main(["chat", "--model", "tiny-random", "  "]) == 2
    assert "the question is empty" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(["chat", "--model", "tiny-random", "-"]) == 2
    assert "nothing on standard input" in capsys.readouterr().err
    assert time.perf_counter() - t0 < 30


def test_chat_streams_the_answer_as_it_is_generated(monkeypatch):
    """`arpo chat` printed nothing until the whole answer was done. The tiny model's answer reaches
    stdout in several writes, made while it is being generated."""
    import arpo.rollout.agent as agent

    writes: list[tuple[str, bool]] = []
    generating = [False]

    class Out(io.StringIO):
        def write(self, s):
            writes.append((s, generating[0]))
            return super().write(s)

    run = agent.AgentLoop.run

    def spy(self, *a, **k):
        generating[0] = True
        try:
            return run(self, *a, **k)
        finally:
            generating[0] = False

    monkeypatch.setattr(agent.AgentLoop, "run", spy)
    monkeypatch.setattr("sys.stdout", Out())
    assert main(["chat", "--model", "tiny-random", "--tools", "none", "--max-response-tokens", "12",
                 "--temperature", "1", "--quiet", "hello"]) == 0
    during = [s for s, gen in writes if gen and s.strip()]
    assert len(during) >= 2, writes
