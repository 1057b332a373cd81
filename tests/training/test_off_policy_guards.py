"""What would bias the importance weights or the loss is refused or masked (issue 60, finding 7):
truncated sampling with one step off-policy or with the engine's records as π_old, the full entropy
estimator with a vLLM engine (which returns top-k log-probs only), and a NaN behaviour log-prob."""

import pytest
import torch

from arpo.config import load_config
from arpo.errors import ArpoError
from arpo.settings import TrainConfig


def _cfg(*over):
    return load_config(TrainConfig, None, list(over))


@pytest.mark.parametrize("over, key", [
    (["agent.top_p=0.95"], "agent.top_p"),
    (["agent.top_k=20"], "agent.top_k"),
])
def test_truncated_sampling_is_refused_one_step_off_policy(over, key):
    from arpo.training.pipeline import check_off_policy

    cfg = _cfg("rollout.max_off_policy_steps=1", *over)
    with pytest.raises(ArpoError, match=key.replace(".", r"\.") + ".*importance weights"):
        check_off_policy(cfg, cfg.algo.resolve(), multi=False)
    synchronous = _cfg(*over)  # recomputed π_old: allowed
    check_off_policy(synchronous, synchronous.algo.resolve(), multi=False)


def test_rollout_old_logprobs_with_truncated_sampling_is_refused():
    with pytest.raises(ArpoError, match=r"old_logprobs"):
        _cfg("old_logprobs=rollout", "agent.top_p=0.9")
    _cfg("old_logprobs=recompute", "agent.top_p=0.9")


def test_repetition_penalty_is_refused_for_training():
    with pytest.raises(ArpoError, match=r"agent\.repetition_penalty"):
        _cfg("agent.repetition_penalty=1.1")


@pytest.mark.parametrize("engine", ["vllm", "vllm_server"])
def test_full_entropy_with_a_vllm_engine_is_refused(engine):
    extra = ["rollout.servers=[http://127.0.0.1:8000]"] if engine == "vllm_server" else []
    with pytest.raises(ArpoError, match=r"rollout\.entropy_estimator.*topk"):
        _cfg(f"engine={engine}", *extra)
    _cfg(f"engine={engine}", "rollout.entropy_estimator=topk", *extra)


def test_a_nan_behaviour_logprob_is_masked_out_of_the_loss():
    from arpo.algos.presets import get_preset
    from arpo.training.batch import TreeBatch
    from arpo.training.step_batch import make_loss_fn, weight_lagged_tokens

    trees = [{"prompt": [1, 2], "responses": [[3, 4, 5], [3, 6]], "parent": [-1, 0], "branch_at": [0, 1]}]
    batch = TreeBatch.from_trees(trees, TreeBatch.all_generated(trees))
    batch.advantages = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]])
    batch.old_logp = torch.full(batch.mask.shape, -1.0)
    behav = torch.full(batch.mask.shape, -1.1)
    behav[0, 1] = float("nan")
    cfg = _cfg("rollout.max_off_policy_steps=1")
    m = weight_lagged_tokens(batch, behav, cfg.rollout)
    assert m["behaviour_nonfinite_tokens"] == 1 and batch.mask[0, 1] == 0 and batch.mask.sum() == 4
    assert torch.isfinite(batch.advantages).all()
    assert m["is_weight_mean"] == pytest.approx(float(torch.exp(torch.tensor(0.1))))  # π_old/π_behav = e^0.1
    logp = torch.full(batch.mask.shape, -1.05, requires_grad=True)
    loss, _ = make_loss_fn(batch, get_preset("arpo"))(logp, None)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all() and logp.grad[0, 1] == 0
