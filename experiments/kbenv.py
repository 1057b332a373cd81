"""A procedurally generated tool environment where a small model can learn to use tools in minutes.

The world is a knowledge base of fictional towns. Each town has three numeric attributes and a twin
town; it is described by one short document, indexed by arpo's real BM25 `Index`:

    Page 1: Belmor
    Belmor is a town. area 55. twin town Karvin. population 412. elevation 873.

(attribute order is shuffled per document, so the value must be found by content, not position).
A question needs `<search>` to find the facts and `<python>` for the arithmetic:

    add   What is the population of Belmor plus 35?                       search, python
    sum   What is the population of Belmor minus the area of Karvin?      search, search, python
    twin  What is the elevation of the twin town of Belmor times 3?       search, search, python

`twin` is two-hop: the first search gives the twin's name, the second its attribute. With
`top_k = 2` every search also returns a distractor page: BM25 ranks the asked town first and the
town whose twin it is second (its document mentions the name once), with different numbers.

`expert_trace` writes the scripted solution in the agent protocol and runs it through the *real*
tools (the same ToolRegistry configuration RL uses), so SFT data carries real tool outputs; traces
whose final reward is not 1 (+0.1 multi-tool bonus) are dropped.

`build_tokenizer` trains a byte-level BPE on the environment's own texts (≈ 1,500 tokens: words,
numbers in chunks of up to three digits, one token per chunk, protocol tags single tokens) with a
ChatML template that renders only the user turn: a constant system prompt carries no information
for a model trained from scratch on this one task and would triple every prompt. `build_model`
makes a small random-weight Llama.
"""

from __future__ import annotations

import json
import random
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from arpo.data import hop2
from arpo.rewards import arpo_reward
from arpo.settings import ToolsConfig
from arpo.sft.rows import assemble
from arpo.tools.base import ToolCall, format_result
from arpo.tools.search import format_passages

ATTRIBUTES = ("population", "elevation", "area")
RANGES = {"population": (100, 999), "elevation": (100, 999), "area": (10, 99)}
OPS = {"plus": "+", "minus": "-", "times": "*"}
KINDS = ("add", "sum", "twin")
TAGS = ("<think>", "</think>", "<search>", "</search>", "<python>", "</python>", "<result>", "</result>",
        "<answer>", "</answer>")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# ChatML with the user turn only (see the module docstring); the assistant header ends the prompt.
USER_ONLY_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{'<|im_start|>' + message['role'] + '\\n' "
    "+ message['content'] + '<|im_end|>' + '\\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# town names: data/hop2.py's generator with one more coda and 2-3 syllables (the KB of seed s is unchanged)
_CODAS = ["", "n", "r", "l", "s", "m", "th", "nd", "rk"]


@dataclass
class Town:
    name: str
    population: int
    elevation: int
    area: int
    twin: str

    def value(self, attr: str) -> int:
        return getattr(self, attr)


@dataclass
class KB:
    towns: list[Town]
    seed: int

    def __post_init__(self):
        self.by_name = {t.name: t for t in self.towns}

    def document(self, town: Town) -> dict:
        """The town's document ({id, title, text}), attribute order shuffled by a per-town RNG."""
        facts = [f"{a} {town.value(a)}." for a in ATTRIBUTES] + [f"twin town {town.twin}."]
        random.Random(f"{self.seed}:{town.name}").shuffle(facts)
        return {"id": town.name, "title": town.name, "text": f"{town.name} is a town. " + " ".join(facts)}

    def documents(self) -> list[dict]:
        return [self.document(t) for t in self.towns]


def make_kb(n_towns: int = 40, seed: int = 0) -> KB:
    """`n_towns` towns with distinct names, random attributes and a twin each (a random derangement:
    nobody is their own twin; twinship is not symmetric in general)."""
    rng = random.Random(f"kb:{seed}")
    names = hop2.town_names(rng, n_towns, codas=_CODAS, syllables=(2, 2, 3))
    twin = hop2.derangement(rng, names)
    return KB([_town(rng, nm, twin[nm]) for nm in names], seed)


def _town(rng: random.Random, name: str, twin: str) -> Town:
    """A town with random attributes, drawn in ATTRIBUTES order."""
    population, elevation, area = (rng.randint(*RANGES[a]) for a in ATTRIBUTES)
    return Town(name, population, elevation, area, twin=twin)


# ---- questions -----------------------------------------------------------------------------------
def _operand(rng: random.Random, op: str) -> int:
    return rng.randint(2, 9) if op == "times" else rng.randint(2, 99)


def make_question(kb: KB, rng: random.Random, kind: str) -> dict:
    """One question with its gold answer and the expert's plan ({search queries, values, code})."""
    x, y = rng.sample(kb.towns, 2)
    a1, a2 = rng.choice(ATTRIBUTES), rng.choice(ATTRIBUTES)
    if kind == "add":
        op = rng.choice(list(OPS))
        k = _operand(rng, op)
        q = f"What is the {a1} of {x.name} {op} {k}?"
        steps = [(f"{a1} of {x.name}", f"{a1} {x.value(a1)}.")]
        code = f"print({x.value(a1)}{OPS[op]}{k})"
        think = f"I need the {a1} of {x.name}."
    elif kind == "sum":
        op = rng.choice(["plus", "minus"])
        q = f"What is the {a1} of {x.name} {op} the {a2} of {y.name}?"
        steps = [(f"{a1} of {x.name}", f"{a1} {x.value(a1)}."), (f"{a2} of {y.name}", f"{a2} {y.value(a2)}.")]
        code = f"print({x.value(a1)}{OPS[op]}{y.value(a2)})"
        think = f"I need the {a1} of {x.name} and the {a2} of {y.name}."
    elif kind == "twin":
        op = rng.choice(list(OPS))
        k = _operand(rng, op)
        t = kb.by_name[x.twin]
        q = f"What is the {a1} of the twin town of {x.name} {op} {k}?"
        steps = [(f"twin town of {x.name}", f"twin town {t.name}."), (f"{a1} of {t.name}", f"{a1} {t.value(a1)}.")]
        code = f"print({t.value(a1)}{OPS[op]}{k})"
        think = f"I need the twin town of {x.name}, then its {a1}."
    else:
        raise ValueError(f"unknown question kind {kind!r}; choose from {KINDS}")
    answer = str(eval(code[len("print("):-1]))  # eval: our own arithmetic on ints
    return {"question": q, "answers": [answer], "task": "math", "kind": kind,
            "plan": {"think": think, "searches": [s for s, _ in steps], "evidence": [e for _, e in steps],
                     "code": code}}


def make_questions(kb: KB, n: int, seed: int, kinds=KINDS, exclude: Collection[str] = frozenset(),
                   prefix: str = "q") -> list[dict]:
    """`n` distinct questions (kinds cycled in order), none of whose texts is in `exclude`."""
    rng = random.Random(f"questions:{kb.seed}:{seed}")
    out: list[dict] = []
    seen = set(exclude)
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 100 * n + 1000:
            raise ValueError(f"cannot make {n} distinct questions from this KB; use more towns")
        ex = make_question(kb, rng, kinds[len(out) % len(kinds)])
        if ex["question"] in seen:
            continue
        seen.add(ex["question"])
        ex["id"] = f"{prefix}{len(out)}"
        out.append(ex)
    return out


def write_jsonl(rows: list[dict], path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


# ---- the search index and the tools --------------------------------------------------------------
def build_index(kb: KB, out_dir: str | Path):
    """arpo's BM25 Index over the KB documents (written to `out_dir`)."""
    from arpo.retrieval.index import Doc, Index  # noqa: PLC0415 - loads numpy; kept out of this light module's import

    return Index.build([Doc(**d) for d in kb.documents()], out_dir, dense=False, progress=False,
                       sources=[f"kbenv seed={kb.seed} towns={len(kb.towns)}"])


def tools_config(index_dir: str | Path, top_k: int = 2, cls=None):
    """The ToolsConfig of this environment (python + search over the KB index): used for the
    expert traces, RL and evaluation alike. `cls` may be a ToolsConfig subclass."""
    return (cls or ToolsConfig)(enabled=["python", "search"], search_index=str(index_dir), search_top_k=top_k,
                                search_max_chars=200, python_timeout_s=5.0, max_output_chars=200)


# ---- scripted expert traces ----------------------------------------------------------------------
def expert_trace(example: dict, tools) -> dict:
    """The scripted solution of `example`, run through `tools` (a ToolRegistry): an SFT row
    {question, response, tool_results, system, task, ...} where `tool_results` are the [start, end)
    character spans of the environment's result blocks (masked out of the SFT loss)."""
    plan = example["plan"]
    pieces: list[tuple[str, bool]] = [(f"<think>{plan['think']}</think>\n", True)]
    calls = [("search", s) for s in plan["searches"]] + [("python", plan["code"])]
    outputs = []
    for tag, body in calls:
        pieces.append((f"<{tag}>{body}</{tag}>", True))
        r = tools.run(ToolCall(tag, body))
        outputs.append(r.output)
        pieces.append((format_result(r.output), False))
    pieces.append((f"<answer>\\boxed{{{outputs[-1].strip()}}}</answer>", True))
    text, spans = assemble([(piece, "model" if generated else "result") for piece, generated in pieces])
    return {"question": example["question"], "response": text, "tool_results": spans, "system": "both",
            "task": "math", "id": example["id"], "kind": example["kind"], "answers": example["answers"],
            "tool_outputs": outputs}


def trace_is_valid(row: dict, example: dict) -> tuple[bool, str]:
    """A trace is kept when each search puts the needed fact (e.g. `population 412.`) on its first
    page and arpo's reward of the response (with its tool calls) is 1 + the 0.1 multi-tool bonus."""
    # one fact per search; the last output is the python call's (no fact): zip stops before it
    for out, fact in zip(row["tool_outputs"], example["plan"]["evidence"], strict=False):
        first_page = out.split("\n\nPage 2:")[0]
        if fact not in first_page.split("\n", 1)[-1]:
            return False, f"fact {fact!r} not on the first page of {out[:80]!r}"
    calls = [{"tool": "search", "ok": True}] * len(example["plan"]["searches"]) + [{"tool": "python", "ok": True}]
    res = arpo_reward(row["response"], example, tool_calls=calls, tool_spans=row["tool_results"])
    if not (res.correct and abs(res.reward - 1.1) < 1e-9):
        return False, f"reward {res.reward} ({res.format_error or res.answer})"
    return True, ""


def sft_rows(examples: list[dict], tools, workers: int = 8) -> tuple[list[dict], int]:
    """Expert traces of `examples` through the real tools (concurrently); (valid rows, dropped)."""
    with ThreadPoolExecutor(workers) as pool:
        rows = list(pool.map(lambda ex: expert_trace(ex, tools), examples))
    kept = [r for r, ex in zip(rows, examples, strict=True) if trace_is_valid(r, ex)[0]]
    return kept, len(rows) - len(kept)


# ---- tokenizer and model -------------------------------------------------------------------------
def build_tokenizer(texts: list[str], vocab_size: int = 512, number_chunks: bool = True):
    """Byte-level BPE over `texts` as a transformers PreTrainedTokenizerFast with eos/pad and the
    user-only chat template. Numbers are split into chunks of up to three digits and every chunk
    0..999 is one token (Llama 3 / cl100k tokenize numbers the same way), so copying a number from a
    search or python result is copying one token; protocol tags are single (added) tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    def strip_tags(s: str) -> str:  # tags become added tokens; BPE learns the words next to them
        for t in TAGS:
            s = s.replace(t, "\n")
        return s

    words = Tokenizer(models.BPE())
    words.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                   pre_tokenizers.ByteLevel(add_prefix_space=False)])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    words.train_from_iterator([strip_tags(t) for t in texts] + ["user\nassistant\n"] * 50, trainer=trainer)
    spec = json.loads(words.to_str())["model"]
    vocab = dict(spec["vocab"])
    for n in range(10, 1000 if number_chunks else 0):
        vocab.setdefault(str(n), len(vocab))
    # ignore_merges: a pre-token that is in the vocabulary (here: every digit chunk) is one token
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m) for m in spec["merges"]], ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\d{1,3}" if number_chunks else r"\d"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", unk_token="<|endoftext|>",
                                   clean_up_tokenization_spaces=False)
    fast.add_tokens(list(TAGS))
    fast.chat_template = USER_ONLY_TEMPLATE
    return fast


def build_model(tokenizer, hidden: int = 128, layers: int = 4, heads: int = 4, intermediate: int | None = None,
                seed: int = 0, max_positions: int = 1024):
    """A random-weight LlamaForCausalLM (SmolLM2's architecture, tiny) for `tokenizer`."""
    import torch  # noqa: PLC0415 - loads torch; kept out of this light module's import
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=intermediate or 4 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=max_positions, tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


def tokenizer_corpus(kb: KB, rows: list[dict], questions: list[dict]) -> list[str]:
    """Texts the tokenizer is trained on: search-result pages, questions and expert responses."""
    docs = kb.documents()
    pages = [format_passages([docs[i], docs[(i + 1) % len(docs)]]) for i in range(len(docs))]
    return pages * 4 + [q["question"] for q in questions] + [r["response"] for r in rows]
