"""Plug-ins by name: a built-in from a table, or your own function as `module.path:attr`.

Branch rules (rollout/branch_rules.py) and advantage estimators (algos/advantages.py) are chosen this
way in config, like tools and rewards: `rollout.branch_rule: mypkg.rules:my_rule`. The directory arpo
runs in is importable (as with `python -m`), so a module next to your config works.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

from arpo.errors import ArpoError


def resolve(spec: str, table: dict[str, Callable], what: str) -> Callable:
    """table[spec] if `spec` is a built-in name, else the callable `attr` of module `module.path` for
    `spec = "module.path:attr"` (attr may be dotted). ArpoError names what is wrong and the choices."""
    if spec in table:
        return table[spec]
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise ArpoError(f"unknown {what} {spec!r}; use one of {', '.join(sorted(table))} or module.path:function")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        obj = importlib.import_module(mod_name)
    except ImportError as e:
        raise ArpoError(f"{what} {spec!r}: cannot import {mod_name} ({e})") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ArpoError(f"{what} {spec!r}: {mod_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ArpoError(f"{what} {spec!r} is not callable")
    return obj
