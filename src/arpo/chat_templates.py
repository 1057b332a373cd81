"""Which chat template a tokenizer loaded from a run directory renders with (issue 61, crossing 2).

A run's tokenizer carries its `chat_template`: Jinja written by whoever made the run, rendered for
every prompt of `arpo chat` / `eval` / `serve agent`. Jinja's sandbox keeps it from Python but not
from the machine (`'x' * 10**9` took 4.7 GB, nested `range(100000)` loops never end). So, for a
model inside a run directory (from_run.run_dir_of):

* without --trust-run-config the run's template is not used (`guard_tokenizer`): the base model's
  (the run's `model.name`, when it is a built-in model already on this machine or a model directory
  outside any run) is, else arpo's own template for the tokenizer's family (`NAMED`: ChatML when the
  vocabulary has `<|im_start|>`), else the command stops and names the flag. One line on stderr says
  which. A run whose template is exactly its base model's keeps it (nothing changes);
* with the flag the run's template renders in a separate process (`BoundedRenderer`,
  chat_template_worker.py) with RENDER_MEMORY bytes of address space and RENDER_TIMEOUT_S seconds a
  render: past either the command gets a one-line error and the process is replaced.

Models that are not in a run directory (a built-in name, your own model directory) are yours and
render as transformers renders them."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
from pathlib import Path

import yaml

from arpo.errors import ArpoError
from arpo.models import BUILTIN_MODELS, TINY_MODEL, cache_dir
from arpo.runs import TRUST_FLAG, run_dir_of

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
NAMED = {"chatml": ("<|im_start|>", CHATML)}  # name -> (a token the family's vocabulary has, the template)
RENDER_TIMEOUT_S = 10.0
RENDER_MEMORY = 512 << 20


def base_model_of(run: Path) -> str | None:
    """The run's `model.name` (config.yaml), if any."""
    try:
        cfg = yaml.safe_load((run / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    model = cfg.get("model") if isinstance(cfg, dict) else None
    name = model.get("name") if isinstance(model, dict) else None
    return str(name) if name else None


def base_template(base: str | None, run: Path) -> str | None:
    """The chat template of the run's base model when it is on this machine and not the run's to
    choose: a built-in model already converted, or a model directory outside every run dir."""
    if not base:
        return None
    p = Path(base).expanduser()
    if base in (*BUILTIN_MODELS, TINY_MODEL) and not p.exists():
        d = cache_dir() / "models" / base
    elif p.is_dir() and run_dir_of(str(p)) is None and run.resolve() not in [p.resolve(), *p.resolve().parents]:
        d = p
    else:
        return None
    if not (d / "config.json").is_file():
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(d)).chat_template
    except (OSError, ValueError):
        return None


def guard_tokenizer(tok, model: str, trusted: bool, command: str):
    """`tok` (loaded from `model`) with the chat template this module's docstring gives it; the same
    object, changed in place."""
    run = run_dir_of(model)
    if run is None or getattr(tok, "chat_template", None) is None:
        return tok
    if trusted:
        BoundedRenderer.install(tok)
        print(f"arpo {command}: {TRUST_FLAG}: the chat template of the run {run} renders in a separate process "
              f"(at most {RENDER_MEMORY >> 20} MiB, {RENDER_TIMEOUT_S:g} s a prompt)", file=sys.stderr)
        return tok
    base = base_model_of(run)
    known = base_template(base, run)
    if known is not None and known == tok.chat_template:
        return tok
    if known is not None:
        tok.chat_template = known
        print(f"arpo {command}: the run's chat template is not used (a run dir is data; {TRUST_FLAG} renders it, "
              f"bounded): using the base model's ({base})", file=sys.stderr)
        return tok
    vocab = tok.get_vocab()
    for name, (marker, text) in NAMED.items():
        if marker in vocab:
            tok.chat_template = text
            print(f"arpo {command}: the run's chat template is not used (a run dir is data; {TRUST_FLAG} renders it, "
                  f"bounded): using arpo's {name} template", file=sys.stderr)
            return tok
    raise ArpoError(f"the run {run} has its own chat template, which arpo does not render without {TRUST_FLAG}, and "
                    f"its base model ({base or 'none named'}) is not on this machine to take one from; pass "
                    f"{TRUST_FLAG} to render the run's (in a process with bounded memory and time)")


class BoundedRenderer:
    """Renders chat templates in a chat_template_worker process: at most `memory` bytes of address space,
    `timeout_s` seconds a render (the process is killed and replaced past it). Thread-safe."""

    def __init__(self, memory: int = RENDER_MEMORY, timeout_s: float = RENDER_TIMEOUT_S):
        self.memory, self.timeout_s = memory, timeout_s
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def _start(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "arpo.chat_template_worker", str(self.memory)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        return self._proc

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def render(self, request: dict, start_timeout_s: float = 120.0) -> list[str]:
        """The rendered texts of request["conversations"]; raises ArpoError naming what was exceeded."""
        with self._lock:
            started = self._proc is not None and self._proc.poll() is None
            p = self._start()
            assert p.stdin is not None and p.stdout is not None
            try:
                p.stdin.write(json.dumps(request).encode() + b"\n")
                p.stdin.flush()
            except OSError as e:
                self.close()
                raise ArpoError(f"the run's chat template: its render process ended ({e})") from e
            # the first render also waits for the process to import transformers
            wait = self.timeout_s + (0 if started else start_timeout_s)
            if not select.select([p.stdout], [], [], wait)[0]:
                self.close()
                raise ArpoError(f"the run's chat template did not render within {self.timeout_s:g} s (stopped)")
            line = p.stdout.readline()
            if not line:
                self.close()
                raise ArpoError("the run's chat template: its render process died")
        out = json.loads(line)
        if "error" in out:
            raise ArpoError(f"the run's chat template cannot be rendered: {out['error']}")
        return list(out["ok"])

    @classmethod
    def install(cls, tok, renderer: BoundedRenderer | None = None) -> BoundedRenderer:
        """Make `tok.apply_chat_template` render through `renderer` (a new one by default)."""
        r = renderer or cls()
        tok.apply_chat_template = _bounded_apply(tok, r)
        tok._arpo_renderer = r
        return r


def _bounded_apply(tok, renderer: BoundedRenderer):
    """apply_chat_template's contract (conversation or batch, tokenize, return_dict) over `renderer`."""

    def apply(conversation, tools=None, documents=None, chat_template=None, add_generation_prompt=False,
              continue_final_message=False, tokenize=True, padding=False, truncation=False, max_length=None,
              return_tensors=None, return_dict=True, return_assistant_tokens_mask=False, tokenizer_kwargs=None,
              **kwargs):
        if return_assistant_tokens_mask:
            raise ArpoError("the run's chat template renders in a separate process, without assistant masks")
        from transformers.utils import get_json_schema

        template = tok.get_chat_template(chat_template, tools)
        batched = bool(conversation) and isinstance(conversation[0], (list, tuple))
        convs = [list(c) for c in conversation] if batched else [list(conversation)]
        schemas = None if tools is None else [t if isinstance(t, dict) else get_json_schema(t) for t in tools]
        texts = renderer.render({"conversations": convs, "tools": schemas, "documents": documents, "template": template,
                                 "add_generation_prompt": add_generation_prompt,
                                 "continue_final_message": continue_final_message,
                                 "kwargs": {**tok.special_tokens_map, **kwargs}})
        rendered = texts if batched else texts[0]
        if not tokenize:
            return rendered
        out = tok(rendered, padding=padding, truncation=truncation, max_length=max_length, add_special_tokens=False,
                  return_tensors=return_tensors, **(tokenizer_kwargs or {}))
        return out if return_dict else out["input_ids"]

    return apply
