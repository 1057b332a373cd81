"""Token lengths of the worked (scripted, correct) trajectories of the RL recipes' questions, with the
default model's tokenizer (SmolLM2), through the real tools: hop2's lookup, and webhop's web_search and
browse on a real `arpo web serve --corpus webhop:pages` (issue 59: a recipe's budget must leave a
worked trajectory real slack; docs/rewards.md, "Budgets with slack in the recipes").

    PYTHONPATH=src python scripts/worked_trajectory_tokens.py
"""

from __future__ import annotations

import json
import statistics

from arpo.data import hop2, webhop
from arpo.data.datasets import load_examples
from arpo.models import DEFAULT_MODEL, resolve_model_dir
from arpo.sft.convert import hop2_response
from arpo.sft.web import webhop_trajectory
from arpo.tools import build_tools
from arpo.web.process import served_web


def summary(lengths: list[int], calls: int) -> dict:
    return {"questions": len(lengths), "min": min(lengths), "max": max(lengths),
            "mean": round(statistics.fmean(lengths), 1), "calls": calls}


def main() -> None:
    from transformers import AutoTokenizer  # a heavy library, loaded where it is used

    tok = AutoTokenizer.from_pretrained(str(resolve_model_dir(DEFAULT_MODEL)))

    def n(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False))

    out = {"hop2:train[120:240]": summary([n(hop2_response(ex, hop2.lookup)[0])
                                           for ex in load_examples("hop2:train[120:240]")], 2)}
    with served_web("webhop:pages") as url:
        reg = build_tools(list(webhop.TOOLS), web={"url": url, **webhop.WEB})
        try:
            lengths = []
            for ex in load_examples("webhop:train[120:240]"):
                text, _, why = webhop_trajectory(ex, reg["web_search"], reg["browse"])
                if text is None:
                    raise SystemExit(f"{ex['id']}: no worked trajectory ({why})")
                lengths.append(n(text))
        finally:
            reg.close()
    out["webhop:train[120:240]"] = summary(lengths, 4)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
