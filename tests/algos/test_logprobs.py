"""Chunked log-probs/entropies equal the full-logits reference, values and gradients (float64)."""

import pytest
import torch

from arpo.algos.logprobs import model_token_logprobs, naive_token_logprobs, token_logprobs

TOL = dict(rtol=1e-10, atol=1e-12)


def _case(n=13, d=6, v=17, seed=0, bias=False):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(v, d, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(v, dtype=torch.float64, generator=g, requires_grad=True) if bias else None
    y = torch.randint(0, v, (n,), generator=g)
    return h, w, b, y, g


@pytest.mark.parametrize("chunk", [1, 4, 7, 13, 100])
@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
@pytest.mark.parametrize("bias", [False, True])
def test_values_and_grads_match_naive(chunk, temperature, bias):
    h, w, b, y, g = _case(bias=bias, seed=chunk)
    up_lp = torch.randn(len(y), dtype=torch.float64, generator=g)
    up_en = torch.randn(len(y), dtype=torch.float64, generator=g)
    params = [h, w] + ([b] if bias else [])
    outs = []
    for fn in (token_logprobs, naive_token_logprobs):
        lp, en = fn(h, w, y, chunk_size=chunk, temperature=temperature, with_entropy=True, bias=b)
        grads = torch.autograd.grad((lp * up_lp).sum() + (en * up_en).sum(), params)
        outs.append((lp, en, *grads))
    for a, r in zip(*outs, strict=True):
        assert torch.allclose(a, r, **TOL)


@pytest.mark.parametrize("which", ["logp", "entropy"])
@pytest.mark.parametrize("chunk", [1, 7, 100])
def test_one_output_used_grad_of_other_is_none(which, chunk):
    """with_entropy=True but only one output in the loss: the other's gradient arrives as None."""
    h, w, _, y, g = _case(seed=3)
    up = torch.randn(len(y), dtype=torch.float64, generator=g)
    outs = []
    for fn in (token_logprobs, naive_token_logprobs):
        lp, en = fn(h, w, y, chunk_size=chunk, temperature=0.8, with_entropy=True)
        out = lp if which == "logp" else en
        outs.append(torch.autograd.grad((out * up).sum(), [h, w]))
    for a, r in zip(*outs, strict=True):
        assert torch.allclose(a, r, **TOL)


def test_logprob_only_and_single_input_grads():
    h, w, _, y, g = _case(n=11, seed=4)
    lp, en = token_logprobs(h, w, y, chunk_size=3)
    assert en is None and lp.shape == (11,) and lp.dtype == torch.float64
    ref, _ = naive_token_logprobs(h, w, y)
    assert torch.allclose(lp, ref, **TOL)
    adv = torch.randn(11, dtype=torch.float64, generator=g)
    (gh_ref,) = torch.autograd.grad(-(ref * adv).mean(), [h])
    # only hidden requires grad, then only weight
    (gh,) = torch.autograd.grad(-(token_logprobs(h, w.detach(), y, chunk_size=3)[0] * adv).mean(), [h])
    assert torch.allclose(gh, gh_ref, **TOL)
    (gw_ref,) = torch.autograd.grad(-(naive_token_logprobs(h.detach(), w, y)[0] * adv).mean(), [w])
    (gw,) = torch.autograd.grad(-(token_logprobs(h.detach(), w, y, chunk_size=3)[0] * adv).mean(), [w])
    assert torch.allclose(gw, gw_ref, **TOL)
    with torch.no_grad():  # no graph: plain values
        lp2, _ = token_logprobs(h, w, y, chunk_size=5)
    assert not lp2.requires_grad and torch.allclose(lp2, ref, **TOL)


def test_gradcheck():
    h, w, b, y, _ = _case(n=5, d=3, v=7, bias=True)
    assert torch.autograd.gradcheck(
        lambda a, c, d: token_logprobs(a, c, y, chunk_size=2, temperature=0.9, with_entropy=True, bias=d), (h, w, b))
    assert torch.autograd.gradcheck(lambda a, c: token_logprobs(a, c, y, chunk_size=3)[0], (h, w))


def test_extreme_logits_and_empty():
    h, w, _, y, _ = _case(n=6, d=4, v=9, seed=5)
    h = (h.detach() * 40).requires_grad_()  # logits in the hundreds: no overflow
    lp, en = token_logprobs(h, w, y, chunk_size=4, with_entropy=True)
    ref_lp, ref_en = naive_token_logprobs(h, w, y, with_entropy=True)
    assert torch.isfinite(lp).all() and torch.allclose(lp, ref_lp, **TOL) and torch.allclose(en, ref_en, atol=1e-9)
    e = torch.zeros(0, 4, dtype=torch.float64, requires_grad=True)
    lp0, en0 = token_logprobs(e, w, y[:0], with_entropy=True)
    assert lp0.shape == en0.shape == (0,)
    (lp0.sum() + en0.sum()).backward()
    assert e.grad.shape == (0, 4)


def test_bf16_inputs_use_fp32_logits():
    h, w, _, y, _ = _case(n=9, d=32, v=50, seed=6)
    hb, wb = h.detach().bfloat16().requires_grad_(), w.detach().bfloat16().requires_grad_()
    lp, en = token_logprobs(hb, wb, y, chunk_size=4, with_entropy=True)
    assert lp.dtype == torch.float32
    ref_lp, ref_en = naive_token_logprobs(hb.double(), wb.double(), y, with_entropy=True)
    assert torch.allclose(lp.double(), ref_lp, atol=1e-4) and torch.allclose(en.double(), ref_en, atol=1e-4)
    (lp.sum() + en.sum()).backward()
    assert hb.grad.dtype == wb.grad.dtype == torch.bfloat16


def test_model_token_logprobs_matches_logits():
    from arpo.testing import tiny_model, tiny_tokenizer

    model = tiny_model(tiny_tokenizer(), dtype=torch.float64)
    ids = torch.randint(3, 200, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    up = torch.randn(2, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    params = [p for p in model.parameters()]

    lp, en = model_token_logprobs(model, ids, mask, position_ids=pos, chunk_size=5, temperature=0.9,
                                  with_entropy=True)
    assert lp.shape == en.shape == (2, 8)
    g = torch.autograd.grad((lp * up).sum() + (0.1 * en * up).sum(), params, allow_unused=True)

    logits = model(ids, attention_mask=mask, position_ids=pos).logits[:, :-1] / 0.9
    lsm = torch.log_softmax(logits, -1)
    ref_lp, ref_en = lsm.gather(-1, ids[:, 1:, None])[..., 0], -(lsm.exp() * lsm).sum(-1)
    assert torch.allclose(lp, ref_lp, atol=1e-10) and torch.allclose(en, ref_en, atol=1e-10)
    g_ref = torch.autograd.grad((ref_lp * up).sum() + (0.1 * ref_en * up).sum(), params, allow_unused=True)
    for a, r in zip(g, g_ref, strict=True):
        assert (a is None) == (r is None)
        if a is not None:
            assert torch.allclose(a, r, atol=1e-10)
