"""Data rows that cannot be scored right are refused (data/datasets.py) (issue 42 item 8: what a newcomer's
first tries found; each test failed before its fix)."""

from __future__ import annotations


def test_two_rows_with_one_id_are_refused(tmp_path):
    """Results are keyed by id: two rows with one id counted as one question."""
    import json

    import pytest

    from arpo.data.datasets import load_examples
    from arpo.errors import ArpoError

    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"id": "q1", "question": "1+1?", "answer": "2", "task": "math"}) + "\n"
                 + json.dumps({"id": "q1", "question": "2+2?", "answer": "4", "task": "math"}) + "\n")
    with pytest.raises(ArpoError, match=r"d.jsonl:2: id 'q1' is already the id of .*d.jsonl:1"):
        load_examples(f)


def test_an_empty_answer_is_refused(tmp_path):
    """`answer: ""` was accepted: a question nothing could ever answer right."""
    import json

    import pytest

    from arpo.data.datasets import load_examples
    from arpo.errors import ArpoError

    for row in ({"question": "q?", "answer": ""}, {"question": "q?", "answers": ["", " "]},
                {"question": "q?", "answer": "steps #### "}):
        f = tmp_path / "d.jsonl"
        f.write_text(json.dumps(row) + "\n")
        with pytest.raises(ArpoError, match="empty"):
            load_examples(f)
