"""A full disk while weights are written is one line (issue 42 item 8: what a newcomer's first tries found;
each test failed before its fix)."""

from __future__ import annotations


def test_a_full_disk_while_saving_weights_is_one_line(full_disk, tiny_lm):
    """train's checkpoint and the first model conversion write safetensors: a full disk there was a
    traceback (or, worse, "corrupt weights file")."""
    from arpo.errors import explain
    from arpo.jsonl import write_jsonl

    disk = full_disk
    try:
        tiny_lm.save_pretrained(disk / "m")
    except Exception as e:  # noqa: BLE001 - whatever the writer raises must be explained in one line
        msg = explain(e)
        assert msg is not None and "no space left" in msg, (type(e), e)
    else:
        raise AssertionError("the tiny model fitted on a full 64 KB disk")
    try:
        write_jsonl(disk / "rows.jsonl", [{"x": "y" * 100_000}])
    except OSError as e:
        assert explain(e) == f"{disk / 'rows.jsonl'}: No space left on device"
