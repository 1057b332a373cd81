"""`arpo web sft-data`: never empties the data or a good output, names a local web that is down (issue 42
item 8: what a newcomer's first tries found; each test failed before its fix)."""

from __future__ import annotations

import time

from arpo.cli import main
from arpo.ports import free_port


def test_web_sft_data_never_empties_the_data_or_a_good_output(tmp_path, hotpot_row, capsys):
    """`arpo web sft-data --out` equal to `--data` emptied the data file, and a rerun where nothing
    checked out (the web down) replaced a good output with an empty one."""
    data = hotpot_row
    before = data.read_text()
    down = f"http://127.0.0.1:{free_port()}"
    assert main(["web", "sft-data", "--data", str(data), "--out", str(data), "--web-url", down, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert data.read_text() == before and f"--out {data} would overwrite the input {data}" in err, err
    good = tmp_path / "good.jsonl"
    good.write_text('{"question": "kept"}\n')
    assert main(["web", "sft-data", "--data", str(data), "--out", str(good), "--web-url", down, "--quiet"]) != 0
    assert good.read_text() == '{"question": "kept"}\n', capsys.readouterr().err


def test_web_sft_data_with_the_local_web_down_fails_at_once_naming_it(tmp_path, hotpot_row, capsys):
    """With the local web down, `arpo web sft-data` ran 456 s in silence, then wrote an empty file
    ("search failed: 300"); with a provider's key missing it failed the same way without naming it."""
    data = hotpot_row
    down = f"http://127.0.0.1:{free_port()}"
    t0 = time.perf_counter()
    assert main(["web", "sft-data", "--data", str(data), "--out", str(tmp_path / "o.jsonl"), "--web-url", down]) == 2
    err = capsys.readouterr().err
    assert f"the local web at {down} does not answer" in err and "arpo web serve --corpus" in err, err
    assert time.perf_counter() - t0 < 30 and not (tmp_path / "o.jsonl").exists()
