"""Typed configs: YAML -> dataclasses, with dotted `key=value` overrides from the command line.

Every component has its own small dataclass documented once (its field comments); this module only
loads and validates. An unknown key, or a value of the wrong type, is an error that names the key
(and the file), so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import sys
import tokenize
import types
import typing
from pathlib import Path

import yaml

from arpo.errors import ArpoError


def _type_name(t) -> str:
    return getattr(t, "__name__", str(t))


def _coerce(value, tp, key: str, where: str):  # noqa: C901 - one branch per annotation type the YAML loader converts (the type table)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key, where)
            except ArpoError as e:
                errors.append(str(e))
        raise ArpoError(errors[0] if errors else f"{where}{key}: invalid value {value!r}")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ArpoError(f"{where}{key}: expected a mapping of {tp.__name__} fields, got {value!r}")
        return from_dict(tp, value, prefix=f"{key}.", where=where)
    if origin in (list, tuple):
        (inner, *_) = typing.get_args(tp) or (typing.Any,)
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ArpoError(f"{where}{key}: expected a list, got {value!r}")
        out = [_coerce(v, inner, f"{key}[{i}]", where) for i, v in enumerate(value)]
        return tuple(out) if origin is tuple else out
    if tp is typing.Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ArpoError(f"{where}{key}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ArpoError(f"{where}{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads `1e-6` (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ArpoError(f"{where}{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ArpoError(f"{where}{key}: expected a string, got {value!r}")
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise ArpoError(f"{where}{key}: expected a mapping, got {value!r}")
        (_, inner) = typing.get_args(tp) or (str, typing.Any)
        return {k: _coerce(v, inner, f"{key}.{k}", where) for k, v in value.items()}
    raise ArpoError(f"{where}{key}: unsupported field type {_type_name(tp)}")


def from_dict(cls, data: dict, prefix: str = "", where: str = ""):
    """Build dataclass `cls` from a dict, recursively, rejecting unknown keys."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    data = renamed(cls, data, prefix, where)
    for k in data:
        if k not in names:
            close = [n for n in names if n.startswith(str(k)[:3])]
            hint = f" (did you mean {', '.join(prefix + c for c in close)}?)" if close else ""
            raise ArpoError(f"{where}unknown config key '{prefix}{k}'{hint}; valid keys: "
                            f"{', '.join(sorted(prefix + n for n in names))}")
    kwargs = {k: _coerce(v, hints[k], prefix + k, where) for k, v in data.items()}
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if validate is not None and prefix and "key" in inspect.signature(validate).parameters:
        validate(prefix[:-1])  # a section whose errors name its key wherever it sits (tools.options.NAME)
    elif validate is not None:
        validate()
    return obj


def renamed(cls, data: dict, prefix: str = "", where: str = "") -> dict:
    """`data` with the old spellings of `cls`'s renamed keys (its class attribute RENAMED: {old: new})
    replaced by the new ones, each with a warning on stderr; both spellings at once is an error."""
    old_new = getattr(cls, "RENAMED", None) or {}
    if not any(k in old_new for k in data):
        return data
    out = dict(data)
    for old, new in old_new.items():
        if old not in out:
            continue
        if new in out:
            raise ArpoError(f"{where}{prefix}{old} and {prefix}{new} are the same key ({old} is its old name); "
                            f"give only {prefix}{new}")
        print(f"arpo: config key {prefix}{old} is deprecated, use {prefix}{new} (the name `arpo train` uses)",
              file=sys.stderr)
        out[new] = out.pop(old)
    return out


def to_dict(obj) -> dict:
    return dataclasses.asdict(obj)


def _set_dotted(d: dict, dotted: str, value) -> None:
    parts = dotted.split(".")
    for p in parts[:-1]:
        d = d.setdefault(p, {})
        if not isinstance(d, dict):
            raise ArpoError(f"override {dotted}: '{p}' is not a section")
    d[parts[-1]] = value


def parse_overrides(items: list[str]) -> dict:
    """['rollout.group_size=8', 'tools.enabled=[python,search]'] -> nested dict (values parsed as YAML)."""
    out: dict = {}
    for item in items:
        if "=" not in item:
            raise ArpoError(f"override {item!r}: expected key=value, e.g. rollout.group_size=8")
        k, v = item.split("=", 1)
        try:
            val = yaml.safe_load(v) if v != "" else ""
        except yaml.YAMLError:
            val = v
        _set_dotted(out, k.strip(), val)
    return out


def merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_config(cls, path: str | None = None, overrides: list[str] | None = None):
    """cls from YAML file `path` (optional) with dotted overrides applied on top."""
    data: dict = {}
    where = ""
    if path:
        p = Path(path)
        where = f"{p}: "
        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except OSError as e:
            raise ArpoError(f"cannot read config {p}: {e.strerror}") from e
        except UnicodeDecodeError as e:
            line = p.read_bytes()[: e.start].count(b"\n") + 1
            raise ArpoError(f"{p}:{line}: not UTF-8 text ({e.reason} at byte {e.start})") from e
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            at = f":{mark.line + 1}" if mark else ""
            raise ArpoError(f"{p}{at}: invalid YAML: {getattr(e, 'problem', e)}") from e
        if not isinstance(data, dict):
            raise ArpoError(f"{p}: top level must be a mapping of sections")
    if overrides:
        data = merge(data, parse_overrides(overrides))
    return from_dict(cls, data, where=where)


# ---- the config explained (`--print-config`) ------------------------------------------------------
def field_comments(cls) -> dict[str, tuple[str, bool]]:
    """{field: (its documentation, whether it stands above the field)}: the trailing `# comment` of
    the field's line in the dataclass source, else the block of `#` lines right above the field (the
    one place each field is documented), inherited fields included."""
    docs: dict[str, tuple[str, bool]] = {}
    for klass in reversed(cls.__mro__):
        if not (isinstance(klass, type) and dataclasses.is_dataclass(klass)):
            continue
        try:
            src = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        lines = src.splitlines()
        names = {f.name for f in dataclasses.fields(klass)}
        line_field: dict[int, str] = {}
        trailing: set[int] = set()
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            if tok.type == tokenize.NAME and tok.start[1] == 4 and tok.string in names:
                line_field.setdefault(tok.start[0], tok.string)
            elif tok.type == tokenize.COMMENT and tok.start[0] in line_field and tok.start[1] > 4:
                docs[line_field[tok.start[0]]] = (tok.string.lstrip("# ").strip(), False)
                trailing.add(tok.start[0])
        for line, name in line_field.items():
            if line in trailing:
                continue
            above: list[str] = []
            j = line - 2  # 0-based index of the line above
            while j >= 0 and lines[j].startswith("    #") and not lines[j].startswith("     "):
                above.insert(0, lines[j].strip().lstrip("#").strip())
                j -= 1
            if above:
                docs[name] = ("\n".join(above), True)
    return docs


def field_docs(cls) -> dict[str, str]:
    """{field: its documentation on one line} (field_comments)."""
    return {k: " ".join(v.split("\n")) for k, (v, _) in field_comments(cls).items()}


def _plain(v):
    """`v` with the dataclasses inside it (tools.options' ToolOptions) as dicts, as YAML dumps them."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return dataclasses.asdict(v)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return [_plain(x) for x in v] if isinstance(v, list) else v


def explain(obj, indent: int = 0) -> str:
    """The resolved config as YAML, each field with its documentation as a comment: on its line, or
    (a longer one) on the lines above it. A section's own line carries the parent's comment on it."""
    docs = field_comments(type(obj))
    out: list[str] = []
    pad = "  " * indent
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        text, above = docs.get(f.name, ("", False))
        if above:
            out.extend(f"{pad}# {line}".rstrip() for line in text.split("\n"))
        doc = f"  # {text}" if text and not above else ""
        if dataclasses.is_dataclass(v):
            out.append(f"{pad}{f.name}:{doc}")
            out.append(explain(v, indent + 1))
        else:
            text = yaml.safe_dump({f.name: _plain(v)}, default_flow_style=True, sort_keys=False, width=10**6).strip()
            out.append(f"{pad}{text[1:-1] if text.startswith('{') else text}{doc}")
    return "\n".join(out)
