"""examples/arpo_minimal.py is the library's map: its `arpo_step` must leave the policy with the
weights of one `training.trainer.train_step` (same parts, same seed; a scripted model that calls the
real python tool, so the trees branch)."""

import importlib.util
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def _example():
    spec = importlib.util.spec_from_file_location("arpo_minimal", ROOT / "examples" / "arpo_minimal.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _trainer(tok):
    from arpo.settings import AgentConfig, OptimConfig, RolloutConfig, ToolsConfig, TrainConfig
    from arpo.testing import hook_rollout, scripted_hook, tiny_model, toy_reward
    from arpo.training import trainer as T

    torch.manual_seed(0)
    model = tiny_model(tok)
    cfg = TrainConfig(tools=ToolsConfig(enabled=["python"], cache=False),
                      agent=AgentConfig(max_response_tokens=64, temperature=1.0),
                      rollout=RolloutConfig(group_size=4, initial_rollouts=2, branch_threshold=0.0, entropy_tokens=2),
                      optim=OptimConfig(lr=1e-3), steps=1, prompts_per_step=2, old_logprobs="recompute")
    cfg.validate()
    preset = cfg.algo.resolve()
    exs = [{"id": f"q{i}", "question": f"What is {i} + {i}?", "answers": [str(2 * i)], "task": "math"}
           for i in range(3)]
    tr = T.setup(cfg, preset, exs, toy_reward, model_and_tok=(model, tok))
    hook_rollout(tr.ro, scripted_hook(tok, ["<python> print(2 + 2) </python>", "<answer> \\boxed{4} </answer>"],
                                      free_tokens=2))
    return tr


def test_arpo_step_is_one_train_step(tiny_tok):
    from arpo.training import trainer as T

    a, b = _trainer(tiny_tok), _trainer(tiny_tok)
    try:
        start = {k: v.clone() for k, v in a.model.named_parameters()}
        assert all(torch.equal(start[k], v) for k, v in b.model.named_parameters())
        metrics, trees_a = T.train_step(a, 0)
        trees_b, loss, _ = _example().arpo_step(
            b.model, b.tok, b.ro, b.tools, b.examples, b.preset, b.opt, b.sched, step=0, seed=b.cfg.run.seed,
            prompts_per_step=2, reward_fn=b.reward_fn, grad_clip=b.cfg.optim.grad_clip)
    finally:
        a.close()
        b.close()
    assert metrics["branches"] > 0  # the trees did branch after the tool results
    assert [[t.traj.response_ids for t in x.trajectories] for x in trees_a] == \
        [[t.traj.response_ids for t in x.trajectories] for x in trees_b]
    moved = 0.0
    for (k, va), (_, vb) in zip(a.model.named_parameters(), b.model.named_parameters(), strict=True):
        torch.testing.assert_close(va, vb, rtol=0, atol=1e-6, msg=k)
        moved = max(moved, float((va - start[k]).abs().max()))
    assert moved > 1e-4  # the step did update the weights
    assert abs(loss - metrics["loss"]) < 1e-5
