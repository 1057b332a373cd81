"""The generation-engine interface that rollouts are written against.

It is deliberately small so that a second backend (vLLM, issue #7) can implement it: sequences are
added, stepped, paused at stop strings, extended with appended tokens, forked and released.

    sid = engine.add(prompt_ids, params)          # starts generating on the next step()
    outs = engine.step()                          # one decode step for every running sequence
    engine.append(sid, result_ids)                # a paused sequence gets tool-result tokens and resumes
    kids = engine.fork(sid, n, at=len_tokens)     # n new sequences sharing tokens[:at] (KV shared, not recomputed)
    engine.release(sid)                           # free its KV cache

Every generated token carries its log-probability and the entropy of the full sampling distribution;
appended tokens carry `gen_mask = 0` (they are masked out of the loss).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from arpo.errors import ArpoError


def check_prompt_fits(prompt_len: int, context_len: int | None, what: str = "the prompt") -> int:
    """Tokens the model's context leaves for the response: context_len - prompt_len (>= 1), or an
    ArpoError naming both numbers. Every engine runs it in `add`, before any compute (a prompt past the
    context used to run for minutes and die of memory); `arpo serve` answers it as HTTP 400
    context_length_exceeded. context_len None: unknown, no check."""
    if context_len is None:
        return 1 << 30
    left = int(context_len) - int(prompt_len)
    if left < 1:
        raise ArpoError(f"{what} has {prompt_len} tokens; this model's context holds {context_len}: "
                        "shorten the question (or the system prompt), or use a model with a longer context")
    return left


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_len: int = 2048  # cap on prompt + response tokens of the sequence
    stop: tuple[str, ...] = ()  # pause when the generated text ends with one of these
    stop_regex: str | None = None  # or when a match appears in the newly generated text
    pause_token_ids: tuple[int, ...] = ()  # these tokens pause instead of ending (json tool format: end of turn)
    seed: int | None = None  # per-sequence RNG: same seed -> same tokens, whatever else is in the batch
    # Optional hook (sequence so far, logits (V,)) -> logits, e.g. constrained decoding or scripted tests.
    logits_hook: Callable[[Sequence, torch.Tensor], torch.Tensor] | None = None


@dataclass
class Sequence:
    """A sequence's state, owned by the engine; rollouts read it (never mutate it)."""

    sid: int
    tokens: list[int]  # prompt + response so far
    prompt_len: int
    params: SamplingParams
    gen_mask: list[int] = field(default_factory=list)  # per response token: 1 generated, 0 appended
    logprobs: list[float] = field(default_factory=list)  # per response token (0.0 for appended ones)
    entropies: list[float] = field(default_factory=list)  # per response token (0.0 for appended ones)
    # entropy from the top-k probabilities only (the reference's estimator), if the engine records it
    topk_entropies: list[float] = field(default_factory=list)
    status: str = "waiting"  # waiting | running | paused | finished
    finish_reason: str | None = None  # stop | eos | length (stop = paused at a stop string)
    stop_text: str | None = None  # which stop string/regex match paused it
    parent: int | None = None  # sid this one was forked from
    fork_at: int | None = None  # number of tokens shared with the parent

    @property
    def response(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    def append_unsampled(self, token_ids: list[int], topk: bool = True) -> None:
        """Engines' `append`: a paused sequence takes tokens it did not generate (mask 0, log-prob and
        entropies 0.0; `topk`: the engine records top-k entropies) and waits to resume."""
        if self.status != "paused":
            raise RuntimeError(f"sequence {self.sid} is {self.status}; only paused sequences take appended tokens")
        n = len(token_ids)
        self.tokens += list(token_ids)
        self.gen_mask += [0] * n
        self.logprobs += [0.0] * n
        self.entropies += [0.0] * n
        if topk:
            self.topk_entropies += [0.0] * n
        self.status, self.finish_reason, self.stop_text = "waiting", None, None


@dataclass
class StepOutput:
    sid: int
    token: int
    logprob: float
    entropy: float
    finish_reason: str | None  # None while still running


class Tokenizer(Protocol):
    """What the rollout uses of an engine's tokenizer (a transformers tokenizer has it)."""

    def decode(self, token_ids: list[int]) -> str: ...

    def __len__(self) -> int: ...


class Engine(Protocol):
    tokenizer: Tokenizer
    context_len: int | None  # tokens the model's context holds (add() refuses longer prompts); None: unknown
    topk_entropy: int  # each sampled token also records the entropy over the top-k tokens (0: none)

    def add(self, prompt_ids: list[int], params: SamplingParams) -> int: ...

    def step(self) -> list[StepOutput]: ...

    def append(self, sid: int, token_ids: list[int]) -> None: ...

    def fork(self, sid: int, n: int, at: int | None = None, seeds: list[int] | None = None) -> list[int]: ...

    def release(self, sid: int) -> None: ...

    def finish(self, sid: int, reason: str = "stop") -> None: ...  # end a sequence now (with this reason)

    def seq(self, sid: int) -> Sequence: ...

    def has_unfinished(self) -> bool: ...

    # lifecycle between rollouts; engines that run the policy module itself (hf) implement them as no-ops
    stats: dict

    def load_weights(self, model) -> int: ...  # push the policy's current weights; returns tensors sent

    def sleep(self, level: int = 1) -> bool: ...  # free accelerator memory while training; False if unsupported

    def wake_up(self) -> bool: ...  # undo sleep(); False if it was awake or sleep is unsupported

    def close(self) -> None: ...


STOP_TAIL = 16  # tokens decoded to look for a stop string that the newest token completed


def stop_match(tokenizer, tokens: list[int], seg_start: int, params: SamplingParams) -> str | None:
    """The stop string / regex match that the newest token completed in the current segment, or None.
    Shared by every engine so that all pause at exactly the same token."""
    if not (params.stop or params.stop_regex):
        return None
    seg = tokens[max(seg_start, len(tokens) - STOP_TAIL):]
    now, before = tokenizer.decode(seg), tokenizer.decode(seg[:-1])
    for stop in params.stop:
        if stop in now and stop not in before:
            return stop
    if params.stop_regex:
        m = re.search(params.stop_regex, now)
        if m and not re.search(params.stop_regex, before):
            return m.group(0)
    return None


def check_new(prompt_ids: list[int], params: SamplingParams | None, context_len: int | None) -> SamplingParams:
    """What every engine's `add` checks before it takes a prompt: not empty, and it fits the context
    (`check_prompt_fits`). Returns the sampling parameters to use (None: the defaults)."""
    if not prompt_ids:
        raise ValueError("empty prompt")
    check_prompt_fits(len(prompt_ids), context_len)
    return params or SamplingParams()


def fork_point(s: Sequence, n: int, at: int | None, seeds: list[int] | None) -> int:
    """Where `fork(sid, n, at, seeds)` splits sequence `s`: `at` (None: after its last token), which
    must lie in [prompt_len, len(tokens)] (a fork shares the prompt), with a seed per fork if seeds
    are given."""
    at = len(s.tokens) if at is None else at
    if not s.prompt_len <= at <= len(s.tokens):
        raise ValueError(f"fork point {at} outside [{s.prompt_len}, {len(s.tokens)}]")
    if seeds is not None and len(seeds) < n:
        raise ValueError(f"{n} forks need {n} seeds, got {len(seeds)}")
    return at


def segment_end(s: Sequence, seg_start: int, tokenizer, eos, max_len: int) -> str | None:
    """Why the newest token ends the current segment, or None. In this order: a pause token (first:
    an end-of-turn token may also be EOS) → "stop" with `s.stop_text` its text; an EOS id → "eos"; a
    stop string or regex the token completed in the segment (stop_match) → "stop"; `max_len` tokens
    → "length". Every engine asks this, so that all end a segment at the same token."""
    last = s.tokens[-1]
    if last in s.params.pause_token_ids:
        s.stop_text = tokenizer.decode([last])
        return "stop"
    if last in eos:
        return "eos"
    stop = stop_match(tokenizer, s.tokens, seg_start, s.params)
    if stop is not None:
        s.stop_text = stop
        return "stop"
    if len(s.tokens) >= max_len:
        return "length"
    return None


class SequenceTable:
    """What every engine does alike with its table of sequences, `self.seqs` (sid → Sequence): look
    one up, tell whether any still generates, resume one, run prompts to their first stop, and close
    at the end of a `with` block. The engine brings add / step / append / close."""

    seqs: dict[int, Sequence]
    context_len: int | None = None  # an engine that knows its model's context sets it
    topk_entropy: int = 0  # an engine that records top-k entropies sets its k

    def add(self, prompt_ids: list[int], params: SamplingParams | None = None) -> int:
        raise NotImplementedError

    def step(self) -> list[StepOutput]:
        raise NotImplementedError

    def append(self, sid: int, token_ids: list[int]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def seq(self, sid: int) -> Sequence:
        return self.seqs[sid]

    def has_unfinished(self) -> bool:
        return any(s.status in ("waiting", "running") for s in self.seqs.values())

    def resume(self, sid: int) -> None:
        """Let a paused sequence go on with nothing appended."""
        self.append(sid, [])

    def generate(self, prompts: list[list[int]], params: SamplingParams | None = None) -> list[Sequence]:
        """Convenience: run prompts to their first stop (no tools); returns the sequences."""
        sids = [self.add(p, params) for p in prompts]
        while self.has_unfinished():
            self.step()
        return [self.seqs[s] for s in sids]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
