"""The hop2 dataset (arpo/data/hop2.py): shipped files match the generator, splits are disjoint by
first-hop town, a scripted two-lookup trajectory through the real tool gets reward 1, and every
answer a one-lookup policy can give gets reward 0."""

from __future__ import annotations

import pytest

from arpo.data import hop2
from arpo.data.datasets import load_examples
from arpo.rewards import arpo_reward
from arpo.settings import ToolsConfig
from arpo.sft.convert import hop2_one_call_guesses as one_call_guesses
from arpo.sft.convert import hop2_response as expert_response
from arpo.tools import tools_from_config
from arpo.tools.base import ToolCall


@pytest.fixture(scope="module")
def registry():
    reg = tools_from_config(ToolsConfig(enabled=[hop2.TOOL]))  # the tool as `tools.enabled` builds it for RL
    yield reg
    reg.close()


def _call(reg):
    return lambda text: reg.run(ToolCall("lookup", text)).output


def test_shipped_files_are_the_generators_output():
    for name, data in hop2.files().items():
        assert (hop2.data_dir() / name).read_bytes() == data, f"{name}: rerun python -m arpo.data.hop2"


def test_splits_sizes_and_disjoint_first_hops():
    rows = {s: hop2.read_jsonl_gz(hop2.data_dir() / f"{s}.jsonl.gz") for s in hop2.SPLITS}
    assert {s: len(r) for s, r in rows.items()} == {"train": 240, "dev": 60, "test": 60}
    hops = {s: {r["hop1"] for r in rs} for s, rs in rows.items()}
    assert not (hops["train"] & hops["dev"]) and not (hops["train"] & hops["test"]) and not (hops["dev"] & hops["test"])
    for rs in rows.values():
        for r in rs:
            assert r["hop2"] != r["hop1"]
    assert len(load_examples("hop2:test")) == 60


def test_clusters_are_the_triples_that_differ_only_in_the_attribute():
    """Each dev / test split: 20 clusters (first-hop town, relation) of 3 questions, one per attribute;
    load_examples keeps the field (the statistics read it from the examples)."""
    for split in ("dev", "test"):
        by: dict[str, list[dict]] = {}
        for ex, row in zip(load_examples(f"hop2:{split}"), hop2.read_jsonl_gz(hop2.data_dir() / f"{split}.jsonl.gz"),
                           strict=True):
            assert ex["cluster"] == row["cluster"] == f"{row['hop1']}/{row['relation']}"
            by.setdefault(ex["cluster"], []).append(row)
        assert len(by) == 20
        for rows in by.values():
            assert sorted(r["attribute"] for r in rows) == sorted(hop2.ATTRIBUTES)
            assert len({(r["hop1"], r["relation"], r["hop2"]) for r in rows}) == 1


def test_kb_values_distinct_per_attribute_and_relations_are_derangements():
    kb = hop2.read_jsonl_gz(hop2.data_dir() / "kb.jsonl.gz")
    names = [t["name"] for t in kb]
    assert len(set(names)) == len(kb) == hop2.N_TOWNS
    for a in hop2.ATTRIBUTES:
        assert len({t[a] for t in kb}) == len(kb)
    for t in kb:
        assert t["twin"] != t["name"] and t["rival"] != t["name"] and t["twin"] != t["rival"]
    assert sorted(t["twin"] for t in kb) == sorted(names)


@pytest.mark.parametrize("split", hop2.SPLITS)
def test_scripted_two_lookup_trajectory_gets_reward_1(registry, split):
    for ex in load_examples(f"hop2:{split}"):
        text, spans = expert_response(ex, _call(registry))
        res = arpo_reward(text, ex, tools=registry.names, tool_spans=spans,
                          tool_calls=[{"tool": "lookup", "ok": True}] * 2)
        assert res.format_ok and res.correct and res.reward == 1.0, (ex["id"], text, res)


def test_every_one_lookup_answer_gets_reward_0(registry):
    """The best a policy that answers after the first result can do: any number on that page."""
    n = 0
    for split in hop2.SPLITS:
        for ex in load_examples(f"hop2:{split}"):
            attr, rel, town = hop2.parse_question(ex["question"])
            first = _call(registry)(town)
            guesses = one_call_guesses(ex, _call(registry))
            assert len(guesses) == 3
            for g in guesses:
                text = (f"<think>guess</think>\n<lookup>{town}</lookup>\n<result>\n{first}\n</result>\n"
                        f"<answer>\\boxed{{{g}}}</answer>")
                res = arpo_reward(text, ex, tools=registry.names)
                assert res.format_ok and res.reward == 0.0, (ex["id"], g)
                n += 1
    assert n == 3 * 360


def test_unknown_town_and_loose_spelling(registry):
    assert _call(registry)("Atlantis") == "No town named 'Atlantis'."
    name = hop2.read_jsonl_gz(hop2.data_dir() / "kb.jsonl.gz")[0]["name"]
    assert _call(registry)(f" {name.lower()}. ").startswith(f"{name}: ")


def test_parse_question_rejects_other_text():
    assert hop2.parse_question("What is the area of the twin town of Belmor?") == ("area", "twin", "Belmor")
    with pytest.raises(ValueError):
        hop2.parse_question("How tall is Belmor?")


def test_sft_data_hop2_writes_the_scripted_rows(tmp_path):
    """`arpo sft-data hop2` (the quick start's first step) writes hop2_sft_rows: the scripted trajectories
    through the real lookup tool with the prompt the rollouts render, each checked against the answer."""
    import json

    from arpo.recipes.sft_data import build_sft_dataset
    from arpo.sft.convert import hop2_sft_rows

    out = tmp_path / "sft.jsonl"
    stats = build_sft_dataset("hop2", "hop2:train[0:6]", str(out), limit=4, progress=False)
    assert stats["written"] == 4 and stats["dropped"] == {}
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == hop2_sft_rows(load_examples("hop2:train[0:4]"))
    assert all(r["response"].count("<lookup>") == 2 and r["system_prompt"] for r in rows)
