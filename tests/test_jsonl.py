"""The one JSONL reader: every problem names file:line; writes are atomic."""

import pytest

from arpo.errors import ArpoError
from arpo.jsonl import read_jsonl, write_jsonl


def test_roundtrip_and_errors(tmp_path):
    p = write_jsonl(tmp_path / "sub" / "a.jsonl", [{"x": 1}, {"y": "é"}])
    assert read_jsonl(p) == [{"x": 1}, {"y": "é"}]
    assert not list(p.parent.glob(".*tmp*"))  # no temp file left behind
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"x": 1}\n\n{"x": \n')
    with pytest.raises(ArpoError, match=r"bad.jsonl:3: invalid JSON"):
        read_jsonl(bad)
    bad.write_text('{"x": 1}\n[1, 2]\n')
    with pytest.raises(ArpoError, match=r"bad.jsonl:2: expected a JSON object, got list"):
        read_jsonl(bad)
    bad.write_bytes(b'{"x": 1}\n{"x": "\xff"}\n')
    with pytest.raises(ArpoError, match=r"bad.jsonl:\d+: not UTF-8"):
        read_jsonl(bad)
    with pytest.raises(ArpoError, match="dataset file .*nope.jsonl does not exist"):
        read_jsonl(tmp_path / "nope.jsonl", "dataset file")
