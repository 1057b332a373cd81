"""Chunked log-probs/entropies equal the full-logits reference, values and gradients."""

import pytest
import torch

from arpo.algos.logprobs import model_token_logprobs, naive_token_logprobs, token_logprobs


def _case(n=13, d=6, v=17, seed=0, bias=False):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(v, d, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(v, dtype=torch.float64, generator=g, requires_grad=True) if bias else None
    y = torch.randint(0, v, (n,), generator=g)
    return h, w, b, y, g


@pytest.mark.parametrize("chunk", [1, 4, 7, 100])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_grads_match_naive(chunk, temperature):
    h, w, b, y, g = _case(bias=True)
    up_lp = torch.randn(len(y), dtype=torch.float64, generator=g)
    up_en = torch.randn(len(y), dtype=torch.float64, generator=g)
    outs = []
    for fn in (token_logprobs, naive_token_logprobs):
        lp, en = fn(h, w, y, chunk_size=chunk, temperature=temperature, with_entropy=True, bias=b)
        gh, gw, gb = torch.autograd.grad((lp * up_lp).sum() + (en * up_en).sum(), [h, w, b])
        outs.append((lp, en, gh, gw, gb))
    for a, r in zip(*outs):
        assert torch.allclose(a, r, rtol=1e-10, atol=1e-12)


def test_logprob_only_gradient_and_gradcheck():
    h, w, _, y, _ = _case(n=5, d=3, v=7)
    lp, en = token_logprobs(h, w, y, chunk_size=2)
    assert en is None
    ref, _ = naive_token_logprobs(h, w, y)
    assert torch.allclose(lp, ref)
    assert torch.autograd.gradcheck(lambda a, b: token_logprobs(a, b, y, chunk_size=2, with_entropy=True), (h, w))


def test_model_token_logprobs_matches_logits():
    from arpo.testing import tiny_model, tiny_tokenizer

    model = tiny_model(tiny_tokenizer(), dtype=torch.float64)
    ids = torch.randint(3, 200, (2, 9), generator=torch.Generator().manual_seed(1))
    lp, en = model_token_logprobs(model, ids, chunk_size=5, with_entropy=True)
    lsm = torch.log_softmax(model(ids).logits[:, :-1], -1)
    assert torch.allclose(lp, lsm.gather(-1, ids[:, 1:, None])[..., 0], atol=1e-10)
    assert torch.allclose(en, -(lsm.exp() * lsm).sum(-1), atol=1e-10)
