"""The process that renders a trusted run's chat template (`python -m arpo.chat_template_worker`).

Started by chat_templates.BoundedRenderer. It reads one JSON request a line on stdin and answers one
JSON line on stdout: {"ok": [rendered text per conversation]} or {"error": "..."}. Jinja's sandbox
(transformers' `render_jinja_template`) keeps the template from Python; this process keeps it from
the machine: its address space is capped (RLIMIT_AS: `'x' * 10**9` is a MemoryError here), each
answer is at most MAX_CHARS characters, and the parent kills it when one render passes its deadline
(nested `range(100000)` loops)."""

from __future__ import annotations

import json
import resource
import sys

MAX_CHARS = 8_000_000


def main() -> int:
    from transformers.utils.chat_template_utils import render_jinja_template

    mem = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 30
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    for line in sys.stdin:
        try:
            req = json.loads(line)
            texts = render_jinja_template(
                conversations=req["conversations"], tools=req.get("tools"), documents=req.get("documents"),
                chat_template=req["template"], return_assistant_tokens_mask=False,
                continue_final_message=req.get("continue_final_message", False),
                add_generation_prompt=req.get("add_generation_prompt", False), **req.get("kwargs", {}))[0]
            if sum(len(t) for t in texts) > MAX_CHARS:
                out = {"error": f"its output passed {MAX_CHARS} characters"}
            else:
                out = {"ok": texts}
        except MemoryError:
            out = {"error": f"it needed more than {mem >> 20} MiB"}
        except Exception as e:  # noqa: BLE001 - the template's own error (raise_exception, a bad key), told to the caller
            out = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
