"""Environment specs, shared by the data (`--data`) and the tool (`--tools`) that play one environment:

    env:mypkg.envs:Counter              your own Python environment: an episode class (reset/step, an
                                        instance per episode) or an object with open() (envs/base.py)
    openenv:http://127.0.0.1:8000       an OpenEnv server at a URL (envs/openenv.py)
    openenv:mypkg.server:app            an OpenEnv app that arpo starts as a local process

Options follow a `?`: `n` (rows, default 64) and `seed` (the first task's seed, default 0) for the
data; `tag` (the tool's name, default env), `on_mismatch` (error | skip) for the tool; `field` (the
action's text field) and `timeout_s` (starting the server, and each message; default 120) for
OpenEnv. A task is `{"seed": seed + i}` unless the environment defines
`tasks(n, seed) -> [reset kwargs, ...]`. A data row is the reset's first observation as the question,
with `env: {"spec", "reset"}`, which tells the tool which task a trajectory plays.
"""

from __future__ import annotations

import copy
import importlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from arpo.envs.base import EnvError, Environment, Episode, as_step
from arpo.errors import ArpoError
from arpo.spec_query import query_pairs

PREFIXES = ("env:", "openenv:")
OPTIONS = {"n", "seed", "tag", "on_mismatch", "field", "timeout_s"}


def is_env_spec(spec: object) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIXES)


def parse(spec: str) -> tuple[str, str, dict[str, str]]:
    """'openenv:http://h:1?n=8' -> ('openenv', 'http://h:1', {'n': '8'})."""
    kind, _, rest = spec.partition(":")
    target, _, query = rest.partition("?")
    opts = dict(query_pairs(query))
    bad = set(opts) - OPTIONS
    if bad:
        raise ArpoError(f"{spec}: unknown option(s) {', '.join(sorted(bad))}; use {', '.join(sorted(OPTIONS))}")
    if not target:
        raise ArpoError(f"{spec}: name the environment ({kind}:module.path:Name or {kind}:URL)")
    for key, kind_of in (("n", int), ("seed", int), ("timeout_s", float)):
        try:
            if key in opts:
                kind_of(opts[key])
        except ValueError as e:
            raise ArpoError(f"{spec}: option {key}={opts[key]!r} is not a {kind_of.__name__} (one '?', then "
                            "options joined by '&')") from e
    return kind, target, opts


class ClassEnvironment:
    """An episode class as an Environment: open() makes an instance; an episode's snapshot() is a copy of
    its state (default: a deep copy of the episode) that restore() copies again."""

    def __init__(self, cls: type, name: str):
        self.cls, self.name = cls, name
        self.deterministic = bool(getattr(cls, "deterministic", True))
        self.tasks = getattr(cls, "tasks", None)
        if hasattr(cls, "snapshot"):
            self.restore = lambda snap: copy.deepcopy(snap)

    def open(self) -> Episode:
        try:
            return self.cls()
        except Exception as e:
            raise EnvError(f"environment {self.name}: its constructor raised {type(e).__name__}: {e}") from e


_LOADED: dict[str, Environment] = {}  # one environment (an OpenEnv process) per target in a process


def load_env(spec: str) -> Environment:
    """The Environment a spec names (cached per target: data and tool share one server)."""
    kind, target, opts = parse(spec)
    key = f"{kind}:{target}:{opts.get('field', '')}"
    if key not in _LOADED:
        if kind == "openenv":
            from arpo.envs.openenv import OpenEnvEnvironment  # noqa: PLC0415 - optional extra (openenv-core)

            _LOADED[key] = OpenEnvEnvironment(target, field=opts.get("field"),
                                              timeout_s=float(opts.get("timeout_s", 120)))
        else:
            _LOADED[key] = _python_env(target)
    return _LOADED[key]


def close_all() -> None:
    """Stop every environment loaded in this process (servers arpo started) and forget them."""
    for env in _LOADED.values():
        close = getattr(env, "close", None)
        if close is not None:
            close()
    _LOADED.clear()


def _python_env(target: str) -> Environment:
    mod_name, sep, attr = target.partition(":")
    if not sep or not attr:
        raise ArpoError(f"env:{target}: expected env:module.path:Name (an episode class or an environment)")
    if os.getcwd() not in sys.path:  # like `python -m`: the directory arpo runs in is importable
        sys.path.append(os.getcwd())
    try:
        obj: Any = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as e:
        raise ArpoError(f"env:{target}: cannot load it ({type(e).__name__}: {e})") from e
    if isinstance(obj, type) and hasattr(obj, "reset") and hasattr(obj, "step"):
        return ClassEnvironment(obj, attr)
    if hasattr(obj, "open"):
        obj.name = getattr(obj, "name", attr)
        obj.deterministic = getattr(obj, "deterministic", True)
        return obj
    raise ArpoError(f"env:{target} is neither an episode class (reset, step) nor an environment (open)")


def tasks(env: Environment, n: int, seed: int) -> list[dict]:
    made = getattr(env, "tasks", None)
    out = made(n, seed) if made is not None else [{"seed": seed + i} for i in range(n)]
    if not all(isinstance(t, dict) for t in out):
        raise ArpoError(f"environment {env.name}: tasks(n, seed) must return a list of dicts (reset's arguments)")
    return list(out)


def iter_rows(spec: str) -> Iterator[tuple[str, dict]]:
    """Data rows of an environment spec: one reset per task, its first observation the question."""
    kind, target, opts = parse(spec)
    try:
        n, seed = int(opts.get("n", 64)), int(opts.get("seed", 0))
    except ValueError as e:
        raise ArpoError(f"{spec}: n and seed must be integers ({e})") from e
    env = load_env(spec)
    base = spec.split("?", 1)[0]
    for i, task in enumerate(tasks(env, n, seed)):
        ep = env.open()
        try:
            first = as_step(ep.reset(**task), f"environment {env.name}: reset({task})")
        finally:
            ep.close()
        if not first.observation.strip():
            raise EnvError(f"environment {env.name}: reset({task}) gave an empty observation (the prompt)")
        yield f"{spec} task {i}", {"id": f"{base}#{i}", "question": first.observation, "answers": [env.name],
                                   "task": "qa", "env": {"spec": base, "reset": task}}
