"""What a command says it runs with (commands/from_run.py) (issue 42 item 8: what a newcomer's first tries
found; each test failed before its fix)."""

from __future__ import annotations


def test_no_tools_are_reported_as_none():
    """`arpo eval --tools none` printed "tools default"."""
    from arpo.commands.from_run import template_line

    assert "tools none," in template_line("eval", "m", None, "flags", "")
    assert "tools python," in template_line("eval", "m", None, "flags", "python")
