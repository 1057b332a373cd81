"""Controlled experiments that run arpo's real pipeline end to end on small, fast tasks.

The studies live in the repository, not in the installed package (the wheel carries src/arpo only):
they import the library, the library never imports them; `arpo experiment NAME` finds each by name in
src/arpo/commands/experiment.py's STUDIES when it runs from a clone, and `python -m experiments.X` runs
a module's own entry from the clone's root.

    common.py        what the studies share: the run preamble and record, the RL runs of svamp.py /
                     hop2_study.py / branch_rules_study.py (train_config, run_rl, cached evaluations), the
                     tool-call-ratio analysis (summarize)
    kbenv.py         a procedurally generated tool environment (multi-hop questions over a
                     fictional knowledge base: `<search>` for facts, `<python>` for arithmetic),
                     its scripted expert traces, a small tokenizer and a from-scratch Llama
    arpo_vs_grpo.py  ARPO vs GRPO under the same rollout budget, several seeds:
                     `arpo experiment arpo-vs-grpo`
    hop2_study.py    ARPO vs GRPO (and AEPO) on the built-in hop2 task (the second lookup depends on
                     the first result), SmolLM2-135M, blind: `arpo experiment hop2-arpo-vs-grpo`
    blind_protocol.py  the blind protocol's statistics (bootstrap intervals, sample sd, paired wins /
                     losses) and its split ledger (test reported once, after the dev selection is frozen)
    clustered.py     statistics over seeds and question clusters (crossed bootstrap, seed-level tests,
                     per-cluster sign test, the two-stage seed -> step ratio bootstrap)
    hop2_stats.py    hop2's `statistics` section, recomputable from its results.json
                     (`arpo experiment hop2-stats`); hop2_report.py renders its tables
    branch_rules_study.py  branch rules on hop2 or webhop: `arpo experiment branch-rules` (named apart
                     from rollout/branch_rules.py, the rules themselves)
    budget_matched.py  accuracy at equal executed tool calls (over all runs, and per seed pair)
"""

