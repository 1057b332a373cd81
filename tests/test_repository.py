"""The repository is self-contained and its docs tell the truth:

- no tracked file points at a folder outside the repository (the `shared` folder beside a checkout,
  by any of the paths in OUTSIDE): a fresh clone has
  everything (the datasets ship in src/arpo/data/builtin/);
- every `arpo ...` command shown in the README, docs/, quickstart.sh, the configs and the commands'
  own `--help` examples names a real subcommand and real options, and every configs/*.yaml path
  they mention exists.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = "shared"  # spelled in parts, so that this file can check itself like any other
OUTSIDE = ("../" + SHARED, SHARED + "/data", "/work/" + SHARED)


def _tracked() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / p for p in out.decode().split("\0") if p]


def test_no_tracked_file_reaches_outside_the_repository():
    bad = []
    for p in _tracked():
        if p.suffix in (".png", ".gz", ".parquet") or not p.is_file():
            continue
        text = p.read_text(errors="replace")
        for i, line in enumerate(text.splitlines(), 1):
            if any(o in line for o in OUTSIDE):
                bad.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()[:100]}")
    assert not bad, "files that depend on a folder outside the repository:\n" + "\n".join(bad)


# ---- documented commands --------------------------------------------------------------------------
def _doc_texts() -> dict[str, str]:
    texts = {}
    for p in [ROOT / "README.md", ROOT / "quickstart.sh", *sorted((ROOT / "docs").rglob("*.md")),
              *sorted((ROOT / "configs").rglob("*.yaml")), *sorted((ROOT / "examples").rglob("*.md")),
              *sorted((ROOT / "examples").rglob("*.sh"))]:
        if p.is_file():
            texts[str(p.relative_to(ROOT))] = p.read_text()
    return texts


def _epilogs(parser: argparse.ArgumentParser) -> dict[str, str]:
    out = {}
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                if sp.epilog:
                    out[f"arpo {name} --help"] = sp.epilog
                out.update(_epilogs(sp))
    return out


def _command_lines(where: str, text: str) -> list[tuple[str, bool]]:
    """`arpo ...` invocations in a text, as (the rest after `arpo`, strict). Strict ones (markdown code
    blocks and `arpo ...` code spans, quickstart.sh lines, --help example lines) must name a real
    subcommand; in prose and YAML comments only what starts with a real subcommand is checked."""
    out = []
    fenced = False
    for line in text.replace("\\\n", " ").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        line = re.sub(r"\$A\b", "arpo", line)
        code = re.split(r"\s#", line)[0]  # a shell comment is prose
        if where.endswith(".md"):
            if fenced:
                out += [(m.group(1), True) for m in re.finditer(r"(?:^|[\s/])arpo ([a-z][^#]*)", code)]
            else:
                out += [(m.group(1), True) for m in re.finditer(r"`(?:[.\w/]*/)?arpo ([a-z][^`]*)`", line)]
        elif where.endswith(".sh") or where.endswith("--help"):
            strict = where.endswith(".sh") or line.startswith("  arpo ")
            out += [(m.group(1), strict) for m in re.finditer(r"(?:^|[\s/])arpo ([a-z][^#]*)", code)]
        else:
            out += [(m.group(1), False) for m in re.finditer(r"(?:^|[\s`(/])arpo ([a-z][^`#]*)", line)]
    return out


def _subparser(parser, words):
    """Walk `words` down the subcommands; returns (parser, remaining words) or None if unknown."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or not words or words[0].startswith("-"):
            return parser, words
        if words[0] not in subs[0].choices:
            return None if parser.prog == "arpo" or not _has_positionals(parser) else (parser, words)
        parser, words = subs[0].choices[words[0]], words[1:]


def _has_positionals(parser) -> bool:
    return any(not a.option_strings and not isinstance(a, argparse._SubParsersAction) for a in parser._actions)


def _data_specs(words: list[str]) -> list[str]:
    """The values of --data in a command that look like dataset names (`svamp:test`, `bench:gaia`) but
    name no built-in dataset or benchmark split (files, globs and hf: specs are not checked)."""
    from arpo.data import benchmarks
    from arpo.data.sources import is_builtin

    bad = []
    for i, w in enumerate(words):
        if words[i - 1] != "--data" if i else True:
            continue
        if not re.fullmatch(r"[a-z0-9-]+:[a-z0-9:-]+(\[[0-9:]*\])?", w) or w.startswith("hf:"):
            continue
        if benchmarks.is_bench(w):
            try:
                benchmarks.parse(w)
            except Exception:  # noqa: BLE001 - any failure to parse is the finding
                bad.append(w)
        elif not is_builtin(w):
            bad.append(w)
    return bad


def test_documented_commands_and_configs_exist():
    from arpo.cli import build_parser

    parser = build_parser()
    texts = {**_doc_texts(), **_epilogs(parser)}
    problems, checked = [], 0
    for where, text in texts.items():
        for cmd, strict in _command_lines(where, text):
            cmd = re.sub(r"\[[^\]]*\]", " ", cmd)  # optional parts: [--samples 4]
            try:
                words = shlex.split(cmd, comments=True)
            except ValueError:
                words = cmd.split()
            found = _subparser(parser, words) if words else None
            if found is None:
                if strict:
                    problems.append(f"{where}: `arpo {cmd.strip()}`: no subcommand {words[:1]}")
                continue
            sp, rest = found
            for spec in _data_specs(rest):
                problems.append(f"{where}: `arpo {cmd.strip()}`: {spec} is no built-in dataset or benchmark")
            opts = {o for a in sp._actions for o in a.option_strings}
            for w in rest:
                flag = w.split("=", 1)[0]
                if re.fullmatch(r"--[a-z][a-z0-9-]*", flag) and flag not in opts:
                    problems.append(f"{where}: `arpo {cmd.strip()}`: {sp.prog} has no option {flag}")
            checked += 1
        for cfg in re.findall(r"configs/[A-Za-z0-9_./-]+\.yaml", text):
            if not (ROOT / cfg).is_file():
                problems.append(f"{where}: {cfg} does not exist")
    assert checked > 30, f"only {checked} documented commands found: is the scan broken?"
    assert not problems, "\n".join(problems)


def test_parts_never_import_recipes():
    """Data flows one way and recipes are plain scripts over the parts: no module outside recipes/,
    commands/ and the CLI imports arpo.recipes (eval → recipes.rollout → recipes.train → eval was a
    cycle); the studies (the repository's experiments/) are built from recipes."""
    import ast

    src = ROOT / "src" / "arpo"
    allowed = {"recipes", "commands"}
    bad = []
    for p in src.rglob("*.py"):
        rel = p.relative_to(src)
        if rel.parts[0] in allowed or rel.name in ("cli.py", "__main__.py"):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{rel}:{node.lineno} imports {n}" for n in names if n == "arpo.recipes" or
                    n.startswith("arpo.recipes.")]
    assert not bad, "\n".join(bad)


def test_the_library_never_imports_the_studies():
    """The studies (the repository's top-level experiments/, issue 64 item 6) import the library; no module
    of src/arpo imports them (commands/experiment.py's STUDIES names their modules and imports one only
    when `arpo experiment` runs it), and none of them is left inside the package."""
    import ast

    src = ROOT / "src" / "arpo"
    assert (ROOT / "experiments" / "__init__.py").is_file()
    # no module there (the folder itself may stay in an old checkout, holding an ignored __pycache__)
    left = sorted(str(p.relative_to(ROOT)) for p in (src / "experiments").rglob("*.py"))
    assert not left, f"studies inside the installed package: {left}"
    bad = []
    for p in src.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{p.relative_to(ROOT)}:{node.lineno} imports {n}" for n in names
                    if n.split(".")[0] == "experiments" or n.startswith("arpo.experiments")]
    assert not bad, "\n".join(bad)


def test_the_wheel_carries_the_library_not_the_studies(tmp_path):
    """The wheel built from pyproject.toml holds arpo and its data, and neither the studies (experiments/)
    nor an arpo/experiments/ package: built from a copy of what it is made of (no build/ in the checkout)."""
    import shutil
    import sys
    import zipfile

    pytest.importorskip("setuptools")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    for name in ("src", "experiments"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=ignore)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path / "dist"), str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("arpo-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"arpo", wheel.name.split("-py3")[0] + ".dist-info"}
    assert "arpo/commands/experiment.py" in names and "arpo/cli.py" in names
    assert not [n for n in names if n.startswith(("experiments/", "arpo/experiments/"))]


def _import_edges(level: int) -> dict[str, dict[str, str]]:
    """{importer: {imported: 'file:line'}} over src/arpo, every `import` statement counted, those inside
    functions too; names are cut to `level` dotted parts (2: packages like arpo.tools; 0: modules).
    `from arpo.x import y` counts as an edge to arpo.x.y when that is a module, else to arpo.x."""
    import ast

    src = ROOT / "src" / "arpo"
    modules = {".".join(("arpo",) + p.relative_to(src).with_suffix("").parts).removesuffix(".__init__"): p
               for p in src.rglob("*.py")}

    def cut(name: str) -> str:
        return ".".join(name.split(".")[:level]) if level else name

    edges: dict[str, dict[str, str]] = {}
    for mod, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                           for a in node.names]
            else:
                continue
            for t in targets:
                if t.startswith("arpo") and cut(t) != cut(mod):
                    edges.setdefault(cut(mod), {}).setdefault(cut(t), f"{path.relative_to(ROOT)}:{node.lineno}")
    return edges


def _cycles(edges: dict[str, dict[str, str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b": ""}, "b": {"c": ""}, "c": {"a": ""}, "d": {"a": ""}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b": ""}, "b": {}}) == []


@pytest.mark.parametrize("level", [2, 0], ids=["packages", "modules"])
def test_no_import_cycles(level):
    """Data flows one way: no cycle between arpo's packages (arpo.data, arpo.tools, ...) nor between
    its modules, counting the imports inside functions (they hide cycles, they do not remove them)."""
    edges = _import_edges(level)
    found = _cycles(edges)
    detail = ["  " + " -> ".join((a, b, edges[a][b])) for c in found for a in c for b in c if b in edges.get(a, {})]
    assert not found, "import cycles:\n" + "\n".join(detail)


# Only HEAVY_MODULES may load a third-party library when imported (torch and numpy for the math, starlette
# for the servers, httpcore for browse's guarded connections): the rest of arpo imports the standard library
# and PyYAML only, so `arpo --help`, the settings, the tools, the data and the reports import in a fraction
# of a second, without the optional extras, and the python tool runs from a bare venv. An import kept inside
# a function for this says so in its noqa comment (pyproject.toml: PLC0415, TID253).
LIGHT_THIRD_PARTY = ("yaml",)
HEAVY_MODULES = {
    "arpo.algos.advantages", "arpo.algos.logprobs", "arpo.algos.losses", "arpo.algos.presets", "arpo.data.order",
    "arpo.engine.base", "arpo.engine.graph", "arpo.engine.hf", "arpo.engine.kv", "arpo.engine.rng",
    "arpo.engine.sampling", "arpo.engine.static", "arpo.engine.vllm", "arpo.engine.vllm_server", "arpo.http_guard",
    "arpo.recipes.sft", "arpo.recipes.train", "arpo.retrieval.index", "arpo.rollout.agent", "arpo.rollout.arpo",
    "arpo.rollout.tree", "arpo.serve.app", "arpo.serve.openai_format", "arpo.serve.routes", "arpo.serve.scheduler",
    "arpo.tools.web.webnet", "arpo.training.batch", "arpo.training.checkpoint", "arpo.training.distributed",
    "arpo.training.mismatch", "arpo.training.optim", "arpo.training.packing", "arpo.training.pipeline",
    "arpo.training.safe_state", "arpo.training.sharded", "arpo.training.step_batch", "arpo.training.trainer",
    "arpo.training.tree_attention",
}


def _module_level_imports(src: Path) -> dict[str, set[str]]:
    """{module: what importing it runs}: the imports at module level (not those inside functions, nor
    under `if TYPE_CHECKING:`), the parent packages of each (importing arpo.a.b runs arpo/a/__init__.py),
    third-party packages by their top name."""
    import ast

    modules = {".".join(("arpo",) + p.relative_to(src).with_suffix("").parts).removesuffix(".__init__"): p
               for p in src.rglob("*.py")}

    def executed(body):
        for n in body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
                yield from executed(n.orelse)
                continue
            yield n
            for field in ("body", "orelse", "finalbody", "handlers"):
                yield from executed([c for c in getattr(n, field, None) or [] if isinstance(c, ast.AST)])

    def with_parents(name: str) -> set[str]:
        parts = name.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}

    out: dict[str, set[str]] = {}
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        deps = with_parents(mod) - {mod}
        for n in executed(ast.parse(path.read_text()).body):
            if isinstance(n, ast.Import):
                targets = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - n.level + 1] + [base] * bool(base))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in n.names]
            else:
                continue
            for t in targets:
                deps |= with_parents(t) if t.startswith("arpo") else {t.split(".")[0]}
        out[mod] = deps - {mod}
    return out


def _import_paths(graph: dict[str, set[str]], start: str, targets) -> dict[str, list[str]]:
    """For each target reachable from `start`: one shortest import chain to it (breadth first)."""
    prev: dict[str, str | None] = {start: None}
    queue = [start]
    for x in queue:
        for y in sorted(graph.get(x, ())):
            if y not in prev:
                prev[y] = x
                queue.append(y)
    paths = {}
    for t in targets:
        if t in prev:
            chain = [t]
            while prev[chain[-1]] is not None:
                chain.append(prev[chain[-1]])  # type: ignore[arg-type]
            paths[t] = chain[::-1]
    return paths


def _third_party(graph: dict[str, set[str]]) -> set[str]:
    import sys

    return {d for deps in graph.values() for d in deps
            if not d.startswith("arpo") and d not in sys.stdlib_module_names and d != "__future__"
            and d not in LIGHT_THIRD_PARTY}


def test_light_modules_stay_light():
    """Only HEAVY_MODULES load torch, numpy, an optional extra or any other third-party library but PyYAML
    when imported: a module-level import that drags one into another module fails here, with the chain."""
    graph = _module_level_imports(ROOT / "src" / "arpo")
    heavy = _third_party(graph)
    bad = []
    for mod in sorted(graph):
        if mod in HEAVY_MODULES:
            continue
        for lib, chain in _import_paths(graph, mod, heavy).items():
            bad.append(f"{mod} loads {lib}: {' -> '.join(chain)}")
    assert not bad, "\n".join(bad)
    stale = sorted(m for m in HEAVY_MODULES if m not in graph or not _import_paths(graph, m, heavy))
    assert not stale, f"HEAVY_MODULES lists modules that are light now (drop them): {stale}"


def test_the_light_module_check_sees_a_chain(tmp_path):
    """The static check follows module-level imports, parent packages and relative imports, and skips
    imports inside functions and under TYPE_CHECKING."""
    pkg = tmp_path / "arpo"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import deep\n")
    (pkg / "sub" / "deep.py").write_text("import torch.nn\n")
    (pkg / "lazy.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import numpy\n"
                                 "def f():\n    import numpy\n")
    (pkg / "user.py").write_text("from arpo.sub import other_name\n")
    graph = _module_level_imports(pkg)
    assert _third_party(graph) == {"torch"}
    assert _import_paths(graph, "arpo.user", {"torch", "numpy"}) == {
        "torch": ["arpo.user", "arpo.sub", "arpo.sub.deep", "torch"]}
    assert _import_paths(graph, "arpo.lazy", {"torch", "numpy"}) == {}


def test_building_the_cli_imports_no_heavy_library():
    """`arpo --help` builds every command's parser (cli.py imports the command modules by name, which the
    static check cannot follow): none of it may load torch, numpy, transformers or an optional extra."""
    import sys

    libs = ("torch", "numpy", "transformers", "tokenizers", "fastapi", "httpx", "httpcore", "matplotlib", "peft")
    code = ("import sys\nfrom arpo.cli import build_parser\nbuild_parser()\n"
            f"print(sorted(m for m in {libs!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout


def _layout_ranks() -> dict[str, int]:
    """docs/architecture.md's Layout: {arpo.part: its line}, for each top-level package (`name/`) and
    module (`name.py`) a line indented by two spaces names."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    src = ROOT / "src" / "arpo"
    ranks: dict[str, int] = {}
    for rank, line in enumerate((ln for ln in block.splitlines() if re.match(r"  \S", ln)), 1):
        names = [n for n in re.findall(r"(?<![\w/.])([a-z_0-9]+)/(?:\s|$)", line) if (src / n).is_dir()]
        names += [n for n in re.findall(r"(?<![\w/.])([a-z_0-9]+)\.py\b", line) if (src / f"{n}.py").is_file()]
        for n in names:
            ranks.setdefault(f"arpo.{n}", rank)
    return ranks


def test_the_layout_lists_the_parts_in_import_order():
    """docs/architecture.md lists src/arpo's parts in layers, each importing only its own line and the
    lines above it (imports inside functions too): every part is listed, no import points down.
    (The claim was stated but unchecked: data and rollout imported rewards, listed below them.)"""
    ranks = _layout_ranks()
    edges = {a: outs for a, outs in _import_edges(2).items() if a != "arpo"}
    unlisted = sorted({m for a, outs in edges.items() for m in (a, *outs) if m != "arpo" and m not in ranks})
    assert not unlisted, f"docs/architecture.md's Layout does not list {unlisted}"
    down = [f"{a} -> {b} ({where})" for a, outs in edges.items() for b, where in outs.items()
            if b != "arpo" and ranks[b] > ranks[a]]
    assert not down, "imports of a part listed below (docs/architecture.md's Layout):\n" + "\n".join(down)


def test_settings_import_only_what_they_check_against():
    """arpo.settings (every config a user edits) sits below the parts that use it: besides arpo's leaves
    (errors, plugins, and config, the loader that parses a library caller's dict of tools.web or
    tools.options) it reads defaults and registries from models, engine and algos, never the tools,
    rollout, training, serve, eval or recipes (a config loads and is checked without them; the tools
    read their defaults from it)."""
    found = set(_import_edges(2).get("arpo.settings", {}))
    allowed = {"arpo.errors", "arpo.plugins", "arpo.config", "arpo.models", "arpo.engine", "arpo.algos"}
    assert found <= allowed, f"arpo.settings imports {sorted(found - allowed)}"


def test_every_config_a_user_edits_is_in_settings():
    """One place for the settings (issue 42 item 1): every `...Config` dataclass is in arpo/settings/
    (the studies' own configs stay beside their studies, in the repository's experiments/). tools.web's
    WebConfig sat in tools/web/web_config.py."""
    import ast

    src = ROOT / "src" / "arpo"
    outside = []
    for p in src.rglob("*.py"):
        rel = p.relative_to(src)
        if rel.parts[0] == "settings":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Config") and any(
                    "dataclass" in ast.unparse(d) for d in node.decorator_list):
                outside.append(f"src/arpo/{rel}:{node.lineno} {node.name}")
    assert not outside, "config dataclasses outside arpo/settings/:\n" + "\n".join(outside)


# config fields whose values are free-form on purpose, each with its reason; any other dict or Any is a
# section to type (tools.web, tools.options and engine_options were plain dicts, issue 64 item 3)
FREE_FORM = {
    "ToolsConfig.mcp": "an MCP server's spec ({command, args, env, cwd} or {url}) is the MCP SDK's to read",
    "EngineOptions.extra": "vllm.LLM's own keywords arpo does not name, passed to vLLM as they are",
}
# fields with no default, each with its reason
REQUIRED = {"JudgeConfig.base_url": "the judge's endpoint is the user's (--judge-url)",
            "JudgeConfig.model": "the judge's model is the user's (--judge-model)"}


def _config_dataclasses() -> dict[type, str]:
    """{dataclass: the key it sits at} for every dataclass reachable from a config a user edits (each
    `...Config` of arpo.settings) through its fields' annotations (dict values and list items too)."""
    import dataclasses
    import typing

    import arpo.settings as settings

    found: dict[type, str] = {}

    def walk(cls: type, key: str) -> None:
        if cls in found:
            return
        found[cls] = key
        for f in dataclasses.fields(cls):
            stack = [typing.get_type_hints(cls)[f.name]]
            while stack:
                t = stack.pop()
                stack += typing.get_args(t)
                if isinstance(t, type) and dataclasses.is_dataclass(t):
                    walk(t, f"{key}.{f.name}")

    for name in settings.__all__:
        obj = getattr(settings, name)
        if name.endswith("Config") and isinstance(obj, type) and dataclasses.is_dataclass(obj):
            walk(obj, name)
    return found


def _untyped(t) -> bool:
    """A bare dict, Any, or a dict / list of those: a value the loader cannot check."""
    import typing

    if t is dict or t is typing.Any:
        return True
    return any(_untyped(a) for a in typing.get_args(t) if a is not type(None))


def test_every_dataclass_a_config_reaches_is_typed_and_documented():
    """Every dataclass reachable from a config field (issue 64 item 3: tools.web's WebConfig was re-parsed
    from a dict at five call sites, tools.options' ToolOptions lived in tools/plugins/function.py,
    engine_options was a dict, and `--print-config` showed `web: {}`) lives in arpo/settings/, documents
    every field on its line or above it (what --print-config prints), gives each a default, and types
    each value: no dict or Any but FREE_FORM's (a dict keyed by the user's names, like tools.options,
    has typed values)."""
    import dataclasses
    import typing

    from arpo.config import field_docs

    found = _config_dataclasses()
    assert {"WebConfig", "ToolOptions", "EngineOptions"} <= {c.__name__ for c in found}
    bad = []
    for cls, key in found.items():
        if not cls.__module__.startswith("arpo.settings."):
            bad.append(f"{key}: {cls.__name__} is defined in {cls.__module__}, not in arpo/settings/")
        docs, hints = field_docs(cls), typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            name = f"{cls.__name__}.{f.name}"
            if not docs.get(f.name):
                bad.append(f"{key}.{f.name} ({name}): no comment documents it")
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and name not in REQUIRED:
                bad.append(f"{key}.{f.name} ({name}): no default")
            if _untyped(hints[f.name]) and name not in FREE_FORM:
                bad.append(f"{key}.{f.name} ({name}): untyped {hints[f.name]}; type it, or add it to FREE_FORM "
                           "with the reason")
    stale = sorted((set(FREE_FORM) | set(REQUIRED)) - {f"{c.__name__}.{f.name}" for c in found
                                                        for f in dataclasses.fields(c)})
    assert not stale, f"FREE_FORM / REQUIRED name fields that are gone: {stale}"
    assert not bad, "\n".join(bad)


def test_the_config_dataclass_check_sees_a_bare_dict():
    """The check above is not vacuous: a bare dict field and an undocumented one are what it looks for."""
    import dataclasses

    from arpo.config import field_docs

    @dataclasses.dataclass
    class Loose:
        web: dict = dataclasses.field(default_factory=dict)  # a section
        n: int = 0

    assert _untyped(dict) and _untyped(list[dict]) and not _untyped(dict[str, int])
    assert [f.name for f in dataclasses.fields(Loose) if _untyped(f.type if f.type != "dict" else dict)] == ["web"]
    assert "n" not in field_docs(Loose)


def test_require_port_free_names_the_address_of_a_taken_port():
    import socket

    from arpo.errors import ArpoError
    from arpo.ports import require_port_free

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(ArpoError, match=f"cannot listen on 127.0.0.1:{port}.*another --port"):
            require_port_free("127.0.0.1", port)
    require_port_free("127.0.0.1", port)  # free again once closed


_PATH_RE = re.compile(
    r"(?<![\w./~$-])((?:src|tests|docs|configs|examples|benchmarks|scripts)/[A-Za-z0-9_./-]*[A-Za-z0-9_]"
    r"(?:::[A-Za-z_][A-Za-z0-9_]*)?)")
_MODULE_RE = re.compile(r"`((?!src/|tests/|docs/|configs/|examples/|benchmarks/|scripts/)[a-z_]+/[a-z_/]*\.py)`")
_BARE_PY_RE = re.compile(r"(?<![\w./-])([a-z_][a-z0-9_/]*\.py)\b")
_LINK_RE = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# a module and a name in it, as docstrings write them: `file.py:function`, file.py's `name`, (file.py name);
# a name counts when it is in backticks, snake_case or CamelCase (not an English word after a path)
_PAIR_RE = re.compile(r"(?<![\w./-])((?:[a-z_][a-z0-9_]*/)*[a-z_][a-z0-9_]*\.py)(?::|(?:'s|:)? )(`?)"
                      r"([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)\2(?![\w(/.-]|\.\w)")


def _names_a_symbol(name: str, ticked: str) -> bool:
    return bool(ticked) or "_" in name or re.fullmatch(r"[A-Z][a-z0-9]+[A-Z]\w*", name) is not None


def _defines(text: str, name: str) -> bool:
    """`name` is defined in a module's text: a def or class, an assignment, field or parameter, an import."""
    return re.search(rf"^\s*(?:async\s+)?(?:def|class) {name}\b|\b{name}\s*[:=]|^\s*(?:from|import) .*\b{name}\b",
                     text, re.M) is not None


def _doc_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md")),
            *sorted((ROOT / "examples").rglob("*.md")), *sorted((ROOT / "src").rglob("*.py")),
            *sorted((ROOT / "experiments").rglob("*.py"))]


def _missing_names(doc: Path, i: int, line: str) -> list[str]:
    """The `file.py:function` pairs (_PAIR_RE) of line i of a doc whose module does not define the name."""
    bad = []
    for m in _PAIR_RE.finditer(line):
        path, ticked, name = m.groups()
        if path.startswith(("vllm/", "torch/", "transformers/")) or not _names_a_symbol(name, ticked):
            continue
        bases = (ROOT / "src" / "arpo", ROOT / "src", ROOT, doc.parent, doc.parent.parent)
        module = next((b / path for b in bases if (b / path).is_file()), None)
        if module is not None and not _defines(module.read_text(), name.split(".")[-1]):
            bad.append(f"{doc.relative_to(ROOT)}:{i}: {path}: no {name} there")
    return bad


def _missing_paths(doc: Path, text: str) -> list[str]:
    """Every repository path a doc names (`src/...`, `tests/x.py::test_name`, `docs/...`, a relative
    link) that does not exist, as 'doc:line: path'."""
    bad, lines = [], text.splitlines()
    for i, line in enumerate(lines, 1):
        for m in _PATH_RE.finditer(line):
            ref = m.group(1)
            path, _, func = ref.partition("::")
            if line[m.end():m.end() + 1] in ("*", "{", "<", "[") or path.endswith("/."):
                continue  # a pattern (`configs/rollout_{a,b}.yaml`), not a path
            target = ROOT / path
            if not target.exists():
                bad.append(f"{doc.relative_to(ROOT)}:{i}: {ref}")
            elif func and target.is_file() and not re.search(rf"\bdef {func}\b|\bclass {func}\b",
                                                                target.read_text()):
                bad.append(f"{doc.relative_to(ROOT)}:{i}: {ref} (no such test)")
        for m in (_MODULE_RE if doc.suffix == ".md" else _BARE_PY_RE).finditer(line):
            path = m.group(1)  # `tools/python_session.py` in a doc, server.py in a docstring
            if path.startswith(("vllm/", "torch/", "transformers/")):
                continue  # a path in an installed package's source (docs/vllm_backend.md cites vLLM's)
            if path.startswith("my") or line[:m.start()].endswith("args: ["):
                continue  # the user's own file in an example (mytools.py, args: [server.py])
            if "RUC-NLPIR" in lines[i - 2] + line:  # a path in the reference's repository, not in this one
                continue
            bases = (ROOT / "src" / "arpo", ROOT / "src", ROOT, doc.parent, doc.parent.parent)
            if not any(base.joinpath(path).exists() for base in bases):
                bad.append(f"{doc.relative_to(ROOT)}:{i}: {path}")
        bad += _missing_names(doc, i, line)
        for m in _LINK_RE.finditer(line if doc.suffix == ".md" else ""):
            link = m.group(1)
            if "://" in link or link.startswith("mailto:"):
                continue
            if not (doc.parent / link).exists():
                bad.append(f"{doc.relative_to(ROOT)}:{i}: link {link}")
    return bad


def test_every_path_the_docs_name_exists():
    """The README, BENCHMARKS.md, docs/ and the examples' READMEs name files, folders and tests
    (`tests/x.py::test_name`), docstrings modules and names in them (`file.py:function`, file.py's
    `name`): each must exist (a doc that cites a deleted test, module or function is stale)."""
    bad = [b for doc in _doc_files() if doc.is_file() for b in _missing_paths(doc, doc.read_text())]
    assert not bad, "\n".join(bad)


def test_the_doc_path_check_finds_a_stale_path(tmp_path):
    doc = ROOT / "docs" / "x.md"
    text = "see `src/arpo/no_such_module.py` and `tests/test_repository.py::test_nope` and [a](nowhere.md)"
    assert len(_missing_paths(doc, text)) == 3
    assert _missing_paths(ROOT / "src" / "arpo" / "web" / "__init__.py", "made by trajectories.py") != []
    assert _missing_paths(ROOT / "src" / "arpo" / "web" / "__init__.py", "server.py over site.py") == []
    assert _missing_paths(doc, "`tests/test_repository.py::test_every_path_the_docs_name_exists`") == []
    src = ROOT / "src" / "arpo" / "rollout" / "arpo.py"
    for named in ("`rollout/branch_rules.py:get_branch_rule`", "rollout/branch_rules.py's `BranchContext`",
                  "(rollout/branch_rules.py get_branch_rule)", "(settings/rollout.py: BRANCH_RULES)"):
        assert _missing_paths(src, named) == [], named
    for stale in ("`rollout/branch_rules.py:no_such_rule`", "rollout/branch_rules.py's `RULE_SUMMARIES`",
                  "(rollout/staged_rules.py STAGED_RULES)"):
        assert _missing_paths(src, stale) != [], stale
