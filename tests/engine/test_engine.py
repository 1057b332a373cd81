import pytest
import torch

from arpo.engine.base import SamplingParams
from arpo.engine.hf import HFEngine


def full_logprobs(model, tokens, temperature=1.0):
    """Recompute per-position log-softmax from scratch, no cache: (len, V)."""
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].float()
    return torch.log_softmax(logits / temperature, -1)


def assert_matches_recompute(model, seq, tol=1e-4):
    lp = full_logprobs(model, seq.tokens)
    for i, (g, rec_lp, rec_h) in enumerate(zip(seq.gen_mask, seq.logprobs, seq.entropies, strict=True)):
        if not g:
            continue
        pos = seq.prompt_len + i
        ref = lp[pos - 1]
        assert abs(float(ref[seq.tokens[pos]]) - rec_lp) < tol, f"logprob at response token {i}"
        ref_h = float(-(ref.exp() * ref).sum())
        assert abs(ref_h - rec_h) < tol, f"entropy at response token {i}"


@pytest.fixture
def engine(tiny_lm, tiny_tok):
    return HFEngine(tiny_lm, tiny_tok, eos_token_ids=[-1])  # never stops at EOS: long random text


def prompt(tok, text):
    return tok(text)["input_ids"]


def test_batched_decode_matches_recompute(engine, tiny_lm, tiny_tok):
    seqs = engine.generate(
        [prompt(tiny_tok, "What is 17 * 23?"), prompt(tiny_tok, "hello"), prompt(tiny_tok, "print(1) " * 5)],
        SamplingParams(max_len=48, seed=1),
    )
    for s in seqs:
        assert s.finish_reason == "length" and len(s.tokens) == 48
        assert_matches_recompute(tiny_lm, s)


def test_fork_shares_prefix_and_matches_recompute(engine, tiny_lm, tiny_tok):
    a = engine.add(prompt(tiny_tok, "What is 17 * 23? <python>"), SamplingParams(max_len=80, seed=3))
    b = engine.add(prompt(tiny_tok, "hello there " * 4), SamplingParams(max_len=90, seed=4))
    for _ in range(10):
        engine.step()
    prefill_before = engine.stats["prefill_tokens"]
    at = len(engine.seq(a).tokens) - 4  # fork in the past of a running sequence
    kids = engine.fork(a, 3, at=at)
    engine.step()
    # each child recomputes exactly one token (the last shared one): no prefix recomputation
    assert engine.stats["prefill_tokens"] - prefill_before == 3
    while engine.has_unfinished():
        engine.step()
    parent = engine.seq(a)
    for k in kids:
        s = engine.seq(k)
        assert s.parent == a and s.fork_at == at
        assert s.tokens[:at] == parent.tokens[:at]
        assert_matches_recompute(tiny_lm, s)
    assert len({tuple(engine.seq(k).tokens) for k in kids}) == 3  # sampled independently
    assert_matches_recompute(tiny_lm, parent)
    assert_matches_recompute(tiny_lm, engine.seq(b))


def test_pause_append_resume_and_fork_after_append(engine, tiny_lm, tiny_tok):
    a = engine.add(prompt(tiny_tok, "Use python."), SamplingParams(max_len=120, seed=5, stop=("e",)))
    while engine.seq(a).status in ("waiting", "running"):
        engine.step()
    s = engine.seq(a)
    assert s.status == "paused" and s.stop_text == "e"
    result = prompt(tiny_tok, "\n<result>\n391\n</result>\n")
    n_before = len(s.tokens)
    engine.append(a, result)
    kids = engine.fork(a, 2)  # branch right after the tool result, before it was prefilled
    p0 = engine.stats["prefill_tokens"]
    engine.step()
    # the result is prefilled once by the parent path; each fork recomputes only its last token
    assert engine.stats["prefill_tokens"] - p0 == 1 + 2
    for sid in [a] + kids:
        e = engine.seq(sid)
        e.params.stop = ()
    while engine.has_unfinished():
        engine.step()
    for sid in [a] + kids:
        e = engine.seq(sid)
        assert e.tokens[n_before : n_before + len(result)] == result
        r0 = n_before - e.prompt_len
        assert e.gen_mask[r0 : r0 + len(result)] == [0] * len(result)
        assert all(m == 1 for m in e.gen_mask[:r0]) and all(m == 1 for m in e.gen_mask[r0 + len(result) :])
        assert_matches_recompute(tiny_lm, e)


def test_same_seed_same_tokens_different_seed_differs(tiny_lm, tiny_tok):
    def run(seed, other_prompt):
        eng = HFEngine(tiny_lm, tiny_tok, eos_token_ids=[-1])
        a = eng.add(prompt(tiny_tok, "What is 2 + 2?"), SamplingParams(max_len=40, seed=seed))
        eng.add(prompt(tiny_tok, other_prompt), SamplingParams(max_len=30, seed=99))
        while eng.has_unfinished():
            eng.step()
        return eng.seq(a).tokens

    assert run(7, "x") == run(7, "x")
    assert run(7, "x") != run(8, "x")


def test_sampling_controls(tiny_lm, tiny_tok):
    eng = HFEngine(tiny_lm, tiny_tok, eos_token_ids=[-1])
    greedy = eng.generate([prompt(tiny_tok, "abc")] * 2, SamplingParams(max_len=20, temperature=0.0))
    assert greedy[0].tokens == greedy[1].tokens
    lp = full_logprobs(tiny_lm, greedy[0].tokens)
    for i in range(greedy[0].prompt_len, 20):
        assert greedy[0].tokens[i] == int(lp[i - 1].argmax())
    topk1 = eng.generate([prompt(tiny_tok, "abc")], SamplingParams(max_len=20, top_k=1, seed=3))[0]
    assert topk1.tokens == greedy[0].tokens
    # top-p: every sampled token lies inside the nucleus of its distribution
    s = eng.generate([prompt(tiny_tok, "abc")], SamplingParams(max_len=40, top_p=0.05, seed=3))[0]
    lp = full_logprobs(tiny_lm, s.tokens)
    for i in range(s.prompt_len, len(s.tokens)):
        p = lp[i - 1].exp()
        sorted_p, order = p.sort(descending=True)
        keep = int(((sorted_p.cumsum(0) - sorted_p) < 0.05).sum())
        assert s.tokens[i] in order[:keep].tolist()


def test_stops_at_each_closing_tag(tiny_lm, tiny_tok):
    from arpo.testing import scripted_hook
    from arpo.tools.base import STOP_REGEX

    for text, expected in [
        ("<python> print(1) </python> tail", "</python>"),
        ("<search> Paris </search> tail", "</search>"),
        ("<answer> \\boxed{1} </answer> tail", "</answer>"),
        ("<calc> 1+1 </calc> tail", "</calc>"),
    ]:
        eng = HFEngine(tiny_lm, tiny_tok)
        params = SamplingParams(
            max_len=200, stop=("</python>", "</search>", "</answer>"), stop_regex=STOP_REGEX,
            logits_hook=scripted_hook(tiny_tok, [text]),
        )
        s = eng.generate([prompt(tiny_tok, "Q")], params)[0]
        assert s.status == "paused" and s.finish_reason == "stop", text
        assert s.stop_text == expected
        assert tiny_tok.decode(s.response).rstrip().endswith(expected)
    # </think> and </result> are not calls
    eng = HFEngine(tiny_lm, tiny_tok)
    s = eng.generate(
        [prompt(tiny_tok, "Q")],
        SamplingParams(max_len=200, stop_regex=STOP_REGEX,
                       logits_hook=scripted_hook(tiny_tok, ["<think> a </think> b"])),
    )[0]
    assert s.finish_reason == "eos"


def test_many_sequences_join_and_leave(tiny_lm, tiny_tok):
    """Sequences of different lengths joining mid-flight (with compactions) all stay exact."""
    eng = HFEngine(tiny_lm, tiny_tok, eos_token_ids=[-1])
    sids = []
    for i in range(6):
        sids.append(eng.add(prompt(tiny_tok, "word " * (1 + 3 * i)), SamplingParams(max_len=20 + 7 * i, seed=i)))
        eng.step()
        eng.step()
    while eng.has_unfinished():
        eng.step()
    for sid in sids:
        assert_matches_recompute(tiny_lm, eng.seq(sid))
    eng.release(sids[0])
    assert sids[0] not in eng.seqs


def test_identical_prompts_share_one_prefill(tiny_lm, tiny_tok):
    """A group's samples of one prompt (ARPO's N globals, GRPO's M) prefill the prompt once; the
    samples are those of separate prefills (same tokens, log-probs within float tolerance)."""
    p1, p2 = prompt(tiny_tok, "What is 17 * 23? Think step by step."), prompt(tiny_tok, "hello " * 6)
    prompts = [p1] * 4 + [p2] * 3 + [prompt(tiny_tok, "alone")]
    runs = {}
    for share in (False, True):
        eng = HFEngine(tiny_lm, tiny_tok, eos_token_ids=[-1], share_prompts=share)
        sids = [eng.add(p, SamplingParams(max_len=len(p) + 12, seed=10 + i)) for i, p in enumerate(prompts)]
        while eng.has_unfinished():
            eng.step()
        runs[share] = (eng, [eng.seq(s) for s in sids])
    (e0, plain), (e1, shared) = runs[False], runs[True]
    assert e1.stats["shared_prefill_tokens"] == 3 * (len(p1) - 1) + 2 * (len(p2) - 1)
    assert e0.stats["prefill_tokens"] - e1.stats["prefill_tokens"] == e1.stats["shared_prefill_tokens"]
    for a, b in zip(plain, shared, strict=True):
        assert a.tokens == b.tokens
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
        assert_matches_recompute(tiny_lm, b)


def test_topk_entropy_adds_the_sampled_token_when_outside_the_top_k():
    """Hand-computed: p = (0.5, 0.3, 0.15, 0.05), k = 2. A sampled token inside the top 2 adds
    nothing; token 3 (outside) adds −0.05·ln 0.05, as the reference's vLLM map (top k + sampled)."""
    import math

    from arpo.engine.sampling import sample_stats, topk_entropy

    p = [0.5, 0.3, 0.15, 0.05]
    logp = torch.tensor([p, p]).log()
    top2 = -(0.5 * math.log(0.5) + 0.3 * math.log(0.3))
    got = topk_entropy(logp, 2, torch.tensor([1, 3]))
    assert got.tolist() == pytest.approx([top2, top2 - 0.05 * math.log(0.05)], abs=1e-6)
    assert topk_entropy(logp, 2).tolist() == pytest.approx([top2, top2], abs=1e-6)  # no tokens: top k only
    # the engine's record: inverse-CDF sampling with u = 0.99 picks token 3 (cdf 0.95 < 0.99)
    toks, _, _, topk = sample_stats(logp, torch.ones(2), torch.tensor([0.1, 0.99]), 2)
    assert toks.tolist() == [0, 3]
    assert topk.tolist() == pytest.approx([top2, top2 - 0.05 * math.log(0.05)], abs=1e-6)


def test_segment_end_in_its_order_by_hand():
    """engine.base.segment_end, which every engine asks after each token: a pause token first (even
    when it is also EOS), then EOS, then a stop string completed in the current segment (not one that was
    there before it), then the length cap."""
    from arpo.engine.base import Sequence, segment_end

    class Chars:  # token id = a character's code point
        def decode(self, ids):
            return "".join(map(chr, ids))

    def seq(text: str, **kw) -> Sequence:
        return Sequence(0, [ord(c) for c in text], 1, SamplingParams(**kw))

    tok, eos = Chars(), {ord("$")}
    s = seq("Q$", pause_token_ids=(ord("$"),), max_len=100)
    assert segment_end(s, 1, tok, eos, 100) == "stop" and s.stop_text == "$"  # pause beats EOS
    assert segment_end(seq("Q$"), 1, tok, eos, 100) == "eos"
    s = seq("Qab</x>", stop=("</x>",))
    assert segment_end(s, 1, tok, eos, 100) == "stop" and s.stop_text == "</x>"
    assert segment_end(seq("Q</x>a", stop=("</x>",)), 1, tok, eos, 100) is None  # completed earlier
    assert segment_end(seq("Qab", stop=("ab",)), 1, tok, eos, 100) == "stop"
    assert segment_end(seq("Qab", stop=("ab",)), 2, tok, eos, 100) is None  # "a" was appended, not generated
    assert segment_end(seq("Qabc"), 1, tok, eos, 4) == "length"
    assert segment_end(seq("Qabc"), 1, tok, eos, 5) is None


def test_add_and_fork_checks_by_hand():
    """engine.base.check_new and fork_point, what every engine's add and fork check first: an empty
    prompt or one past the context is refused; a fork point lies in [prompt_len, len(tokens)] (None:
    the end) and needs a seed per fork when seeds are given."""
    from arpo.engine.base import Sequence, check_new, fork_point
    from arpo.errors import ArpoError

    p = SamplingParams(temperature=0.5)
    assert check_new([1, 2], p, 3) is p and check_new([1, 2], None, None) == SamplingParams()
    with pytest.raises(ValueError, match="empty prompt"):
        check_new([], p, 3)
    with pytest.raises(ArpoError, match="has 3 tokens; this model's context holds 3"):
        check_new([1, 2, 3], p, 3)
    s = Sequence(0, [7, 8, 9, 10, 11], 2, p)  # prompt [7, 8], generated [9, 10, 11]
    assert fork_point(s, 2, None, None) == 5 and fork_point(s, 2, 2, [1, 2]) == 2 and fork_point(s, 1, 4, [3, 4]) == 4
    for at in (1, 6):
        with pytest.raises(ValueError, match=f"fork point {at} outside \\[2, 5\\]"):
            fork_point(s, 1, at, None)
    with pytest.raises(ValueError, match="3 forks need 3 seeds, got 2"):
        fork_point(s, 3, 5, [1, 2])
