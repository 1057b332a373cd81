"""Answer extraction and correctness (spec §5.2): the last \\boxed{} of the answer, SQuAD-normalized
token F1 / exact match for QA (yes/no/noanswer must match exactly, as in HotpotQA's official
evaluation), and a real math-equivalence check (math-verify, then numeric and sympy fallbacks)."""

from __future__ import annotations

import collections
import itertools
import logging
import math
import re
import string
import threading
from collections.abc import Callable

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_PUNCT = frozenset(string.punctuation)
_EXACT_ONLY = ("yes", "no", "noanswer")


def extract_answer_block(response: str) -> str | None:
    """Text of the last <answer>…</answer>, or None."""
    m = _ANSWER.findall(response)
    return m[-1] if m else None


def extract_boxed(text: str | None) -> str | None:
    """Content of the last \\boxed{...} (nested braces allowed) or `\\boxed 5`; None if absent.
    A trailing unclosed `\\boxed{` (a truncated response) is skipped for the one before it."""
    if not text:
        return None
    for m in reversed(list(re.finditer(r"\\boxed(?![A-Za-z])\s*", text))):
        j = m.end()
        if j < len(text) and text[j] == "{":
            depth = 0
            for k in range(j, len(text)):
                depth += {"{": 1, "}": -1}.get(text[k], 0)
                if depth == 0:
                    return text[j + 1 : k].strip()
            continue  # unbalanced
        tok = re.match(r"[^\s$<{}]+", text[j:])  # `\boxed 5`
        if tok:
            return tok.group(0).rstrip(".")
    return None


def normalize_answer(s: str) -> str:
    """SQuAD normalization: lowercase, drop punctuation, articles (a/an/the) and extra whitespace."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def f1_score(pred: str, gold: str) -> float:
    """SQuAD token F1; a yes/no/noanswer prediction or gold scores 1 only on an exact match."""
    p, g = normalize_answer(pred), normalize_answer(gold)
    if p in _EXACT_ONLY or g in _EXACT_ONLY:
        return float(p == g)
    common = collections.Counter(p.split()) & collections.Counter(g.split())
    same = sum(common.values())
    if same == 0:
        return 0.0
    prec, rec = same / len(p.split()), same / len(g.split())
    return 2 * prec * rec / (prec + rec)


def exact_match(pred: str, gold: str) -> float:
    return float(normalize_answer(pred) == normalize_answer(gold))


def max_over_golds(fn: Callable[[str, str], float], pred: str, golds: list[str]) -> float:
    return max((float(fn(pred, g)) for g in golds), default=0.0)


# ---- math equivalence ----------------------------------------------------------------------

logging.getLogger("math_verify").setLevel(logging.ERROR)  # silence its "timeout is disabled" warnings

_UNITS = r"cm|mm|km|kg|mg|ml|lbs?|oz|ft|mph|hrs?|min|mins|sec|secs|dollars?|cents?|units?"
_NUMBER = re.compile(r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)(?:\s+[A-Za-z][A-Za-z ]*|(?:" + _UNITS + r"))?")
_FRAC = re.compile(r"(-?)\\[dt]?frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}|(-?[\d.]+)/(-?[\d.]+)")


def _strip_latex(s: str) -> str:
    """Drop what never changes a number's value: $, \\text{…} wrappers, thousands separators,
    %, degrees, `x =` prefixes and thin spaces."""
    s = re.sub(r"\\(?:text|mathrm|textbf|mbox)\{([^{}]*)\}", r"\1", s)
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = re.sub(r"\\[,!;: ]|~", "", s)
    s = re.sub(r"\^\s*\{?\\circ\}?|°|\\left|\\right", "", s)
    s = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", s)
    s = re.sub(r"^\s*[A-Za-z]\s*=\s*", "", s)
    return s.strip().rstrip(".").strip()


def _as_float(s: str) -> float | None:
    """The value of a plain number, fraction or `18 dollars`; None for anything else."""
    s = _strip_latex(s)
    try:
        if m := _FRAC.fullmatch(s):
            sign, a, b, c, d = m.groups()
            return (-1 if sign else 1) * float(a) / float(b) if a is not None else float(c) / float(d)
        if m := _NUMBER.fullmatch(s):
            return float(m.group(1))
    except (ValueError, ZeroDivisionError):
        pass
    return None


def _too_costly(s: str) -> bool:
    """Inputs that would make sympy run unboundedly (power towers, huge exponents or factorials):
    with the signal timeouts off (worker threads) nothing could stop them."""
    if len(s) > 400 or re.search(r"\d{6,}\s*!", s):
        return True
    for m in re.finditer(r"\^|\*\*", s):
        rest = s[m.end() :].lstrip()
        if rest[:1] in ("{", "("):
            close = {"{": "}", "(": ")"}[rest[0]]
            depths = itertools.accumulate((ch == rest[0]) - (ch == close) for ch in rest)
            k = next((i for i, depth in enumerate(depths) if depth == 0), len(rest) - 1)  # the closing bracket
            exp, after = rest[1:k], rest[k + 1 :]
        else:
            tok = re.match(r"[-\w.]*", rest)
            assert tok is not None  # the pattern matches the empty string
            exp, after = tok.group(0), rest[tok.end() :]
        if "^" in exp or "**" in exp or after.lstrip().startswith(("^", "**")):
            return True
        if re.fullmatch(r"\s*\d{6,}\s*", exp):
            return True
    return False


def _math_verify(pred: str, gold: str) -> bool | None:
    """math-verify's verdict, or None when it cannot parse either side. Its signal-based timeouts
    only work on the main thread, so off it they are disabled (thread-safe); `_too_costly` guards."""
    try:
        from math_verify import parse, verify
    except ImportError:
        return None
    t = 5 if threading.current_thread() is threading.main_thread() else None
    try:
        g = parse(f"${gold.strip().strip('$')}$", parsing_timeout=t)
        p = parse(f"${pred.strip().strip('$')}$", parsing_timeout=t)
        if not g or not p:
            return None
        return bool(verify(g, p, timeout_seconds=t))
    except Exception:  # noqa: BLE001 - math-verify's parser raises many kinds on odd LaTeX: not comparable
        return None


_SAFE_NAMES = {"sqrt", "pi", "sin", "cos", "tan", "log", "exp", "E", "I"}


def _sympy_equal(pred: str, gold: str) -> bool | None:
    """sympy fallback on plain expressions. Only digits, operators and whitelisted names reach
    `sympify` (which evaluates its input as Python)."""
    exprs = []
    for s in (pred, gold):
        s = _strip_latex(s).replace("^", "**")
        names = re.findall(r"[A-Za-z_]\w*", s)
        if "_" in s or not re.fullmatch(r"[\w+\-*/().\s]*", s):
            return None
        if any(len(n) > 1 and n not in _SAFE_NAMES for n in names):
            return None
        exprs.append(s)
    try:
        import sympy

        return bool(sympy.simplify(sympy.sympify(exprs[0]) - sympy.sympify(exprs[1])) == 0)
    except Exception:  # noqa: BLE001 - sympy raises many kinds on what it cannot parse: not comparable
        return None


def _text_equal(pred: str, gold: str) -> bool:
    """Same text: SQuAD-normalized for words (`\\text{(C)}` = `C`), else ignoring case and spaces
    only (normalizing `-3` or `1/2` would drop the sign or the slash)."""
    p, g = _strip_latex(pred), _strip_latex(gold)
    if not re.search(r"[\d+\-*/^=<>\\]", p + g):
        return normalize_answer(p) == normalize_answer(g) != ""
    return "".join(p.lower().split()) == "".join(g.lower().split())


def math_equal(pred: str | None, gold: str) -> bool:
    """Symbolic/numeric equivalence (spec §5.2): `18` = `18.0` = `$18` = `18 dollars` = `\\frac{36}{2}`,
    `1,000` = `1000`, `0.5` = `\\frac{1}{2}`, `x+1` = `1+x`. The same text is equal; plain
    numbers are compared directly (relative tolerance 1e-6); anything else goes to math-verify, or
    to sympy when math-verify cannot parse it. Safe to call from worker threads."""
    if pred is None or not pred.strip():
        return False
    if _text_equal(pred, gold):
        return True
    a, b = _as_float(pred), _as_float(gold)
    if a is not None and b is not None:
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
    if _too_costly(pred) or _too_costly(gold):
        return False
    verdict = _math_verify(pred, gold)
    if verdict is None:
        verdict = _sympy_equal(pred, gold)
    return bool(verdict)
