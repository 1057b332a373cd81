"""ARPO vs GRPO on the generated knowledge-base tool task: a thin wrapper over
`arpo experiment arpo-vs-grpo` (experiments/arpo_vs_grpo.py; docs/experiment_arpo_vs_grpo.md).

    python benchmarks/experiment_arpo_vs_grpo.py [--seeds 3] [--steps 40] [--out DIR] [--quick] [key=value ...]
"""

from __future__ import annotations

import sys

from arpo.cli import main

if __name__ == "__main__":
    sys.exit(main(["experiment", "arpo-vs-grpo", *sys.argv[1:]]))
