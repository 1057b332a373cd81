"""A study's methods are checked at config time, before any SFT (issue 42 item 8: what a newcomer's first
tries found; each test failed before its fix)."""

from __future__ import annotations

import time

from arpo.cli import main


def test_experiment_methods_are_checked_at_config_time(tmp_path, capsys):
    """`arpo experiment hop2-arpo-vs-grpo "methods=[]"` failed after the SFT with an IndexError."""
    import experiments.hop2_study as hop2

    cases = {"methods=[]": "methods: needs at least one algo preset",
             "methods=[arpo,nope]": "methods: unknown algo preset 'nope'",
             "methods=[arpo,grpo,arpo]": "methods: arpo given twice"}
    for name in ("hop2-arpo-vs-grpo", "svamp-arpo-vs-grpo", "arpo-vs-grpo"):
        for over, msg in cases.items():
            t0 = time.perf_counter()
            rc = main(["experiment", name, over, "--out", str(tmp_path / "x")])
            err = capsys.readouterr().err
            assert rc == 2 and msg in err, (name, over, err[-500:])
            assert time.perf_counter() - t0 < 30 and not (tmp_path / "x").exists()  # before any SFT
    assert hop2.Hop2ExperimentConfig().methods == ["arpo", "grpo"]
