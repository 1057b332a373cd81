"""A spec's `?key=value` options (spec_query.py): `+` stays a plus, `%XX` still decodes."""

from arpo.spec_query import query_pairs


def test_a_plus_is_a_plus_and_escapes_decode():
    assert query_pairs('ops=["+","-"]&n=2') == [("ops", '["+","-"]'), ("n", "2")]
    assert query_pairs("a=1%262&b=") == [("a", "1&2"), ("b", "")]
    assert query_pairs("") == []
