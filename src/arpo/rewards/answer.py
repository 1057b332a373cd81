"""Answer extraction and correctness (spec §5.2): the last \\boxed{} of the answer, SQuAD-normalized
token F1 / exact match for QA (yes/no must match exactly), and a real math-equivalence check."""

from __future__ import annotations

import collections
import re
import string

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)


def extract_answer_block(response: str) -> str | None:
    m = _ANSWER.findall(response)
    return m[-1] if m else None


def extract_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (nested braces allowed) or `\\boxed 5`; None if absent."""
    if text is None:
        return None
    i = text.rfind("\\boxed")
    if i < 0:
        return None
    j = i + len("\\boxed")
    while j < len(text) and text[j] == " ":
        j += 1
    if j < len(text) and text[j] == "{":
        depth, k = 0, j
        while k < len(text):
            if text[k] == "{":
                depth += 1
            elif text[k] == "}":
                depth -= 1
                if depth == 0:
                    return text[j + 1 : k].strip()
            k += 1
        return None  # unbalanced
    m = re.match(r"[^\s$<]+", text[j:])
    return m.group(0) if m else None


def normalize_answer(s: str) -> str:
    """SQuAD normalization: lowercase, drop punctuation, articles and extra whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def f1_score(pred: str, gold: str) -> float:
    p, g = normalize_answer(pred), normalize_answer(gold)
    if p in ("yes", "no", "noanswer") or g in ("yes", "no", "noanswer"):
        return float(p == g)  # HotpotQA's official rule: yes/no answers are exact
    pt, gt = p.split(), g.split()
    common = collections.Counter(pt) & collections.Counter(gt)
    same = sum(common.values())
    if same == 0:
        return 0.0
    prec, rec = same / len(pt), same / len(gt)
    return 2 * prec * rec / (prec + rec)


def exact_match(pred: str, gold: str) -> float:
    return float(normalize_answer(pred) == normalize_answer(gold))


def max_over_golds(fn, pred: str, golds: list[str]) -> float:
    return max((fn(pred, g) for g in golds), default=0.0)


def _clean_number(s: str) -> str:
    s = s.strip().strip(".")
    s = re.sub(r"\\text\{([^}]*)\}", r"\1", s)
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "").replace("\\!", "")
    s = re.sub(r"(?<=\d),(?=\d{3}\b)", "", s)  # thousands separators
    s = re.sub(r"^[^\d\-+.\\(]*", "", s) if re.search(r"\d", s) else s  # leading words/units
    s = re.sub(r"\s*[a-zA-Z ]+$", "", s) if re.match(r"^[\d\-+.,/ ]+[a-zA-Z ]+$", s) else s  # trailing units
    return s.strip()


def _as_float(s: str) -> float | None:
    s = _clean_number(s)
    m = re.fullmatch(r"\\(?:d?frac)\{(-?[\d.]+)\}\{(-?[\d.]+)\}", s)
    try:
        if m:
            return float(m.group(1)) / float(m.group(2))
        if re.fullmatch(r"-?\d+/\d+", s):
            a, b = s.split("/")
            return float(a) / float(b)
        return float(s)
    except (ValueError, ZeroDivisionError):
        return None


def math_equal(pred: str, gold: str) -> bool:
    """Symbolic/numeric equivalence: `18`, `18.0`, `$18`, `\\frac{36}{2}`, `1,8`... via math-verify
    (signal timeouts disabled, so it is safe off the main thread), numeric and sympy fallbacks."""
    if pred is None:
        return False
    a, b = _as_float(pred), _as_float(gold)
    if a is not None and b is not None:
        return abs(a - b) <= 1e-6 * max(1.0, abs(b))
    try:
        from math_verify import parse, verify

        pg = parse(f"${gold}$", parsing_timeout=None)
        pp = parse(f"${pred}$", parsing_timeout=None)
        if pg and pp and verify(pg, pp, timeout_seconds=None):
            return True
    except Exception:
        pass
    try:
        import sympy

        return bool(sympy.simplify(sympy.sympify(_clean_number(pred)) - sympy.sympify(_clean_number(gold))) == 0)
    except Exception:
        return normalize_answer(pred) == normalize_answer(gold)
