"""The per-GPU memory estimate (training/memory.py): each term against hand-computed values, the
estimate against a process's measured peak on CPU (two model sizes, with and without activation
checkpointing), every shipped GPU recipe fits its stated GPU, a config that does not fit is refused
naming the keys to change; activation checkpointing leaves the gradients unchanged (float64)."""

import importlib.util
from pathlib import Path

import pytest
import torch

from arpo.config import load_config
from arpo.errors import ArpoError
from arpo.settings import TrainConfig
from arpo.training import memory as M

ROOT = Path(__file__).resolve().parents[2]
GPU_CONFIGS = sorted((ROOT / "configs" / "gpu").glob("*.yaml"))
# a small made-up shape whose numbers are easy to follow by hand
SMALL = M.Arch(layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4, vocab=10, tied=False)


def test_parameter_count_by_hand_and_of_real_models():
    # embed 10·8 twice (untied) = 160; layer: q 8·8 + k,v 2·8·4 + o 8·8 = 192, MLP 3·8·16 = 384, norms 16 -> 592
    assert M.n_params(SMALL) == 160 + 2 * 592 + 8
    from arpo.testing import arch_model, arch_tokenizer

    for arch in ("qwen2", "llama", "qwen3"):
        model = arch_model(arch, arch_tokenizer(arch), hidden=32, layers=2)
        a = M.arch_from_config(model.config)
        extra = 2 * 2 * a.head_dim if arch == "qwen3" else 0  # Qwen3's q/k norms (not in the formula: d per layer)
        assert M.n_params(a) + extra == sum(p.numel() for p in model.parameters()), arch
    assert round(M.n_params(M.KNOWN_ARCHS["qwen2.5-7b"]) / 1e9, 2) == 7.62  # the model card's 7.61B (7.62 rounded)


def test_terms_by_hand():
    assert M.weights_bytes(1000, 2, shards=4) == 500
    assert M.adamw_bytes(1000, 2, shards=4) == 1000
    # K and V: 2 · 2 layers · 1 kv head · 4 dims · 2 bytes = 32 bytes a token
    assert M.kv_cache_bytes(SMALL, sequences=3, tokens=10, b=2) == 32 * 30
    assert M.norm_bytes_per_token(8, 2) == 4 * 8 + 4 + 2 * 2 * 8  # 68
    # 2 norms 136 + q,k,v,out 4·2·8 = 64 + lse 4·2 = 8 + MLP 4·2·16 = 128
    assert M.layer_bytes_per_token(SMALL, 2) == 136 + 64 + 8 + 128
    assert M.mask_bytes_per_token(100, 2) == 200
    per = 336 + 2 * 50  # layer + mask (S = 50)
    assert M.activation_bytes(SMALL, tokens=50, seq=50, b=2, checkpointing=False) == 2 * 50 * per
    assert M.activation_bytes(SMALL, tokens=50, seq=50, b=2, checkpointing=True) == 2 * 50 * 8 * 2 + 50 * per
    # head: per token the final norm 68 + gathered hidden 16; logits 2·4·1024·10; fp32 grad + fp32 weight copy 2·4·80
    assert M.head_bytes(SMALL, 5, 2) == 5 * (68 + 16) + 2 * 4 * 1024 * 10 + 2 * 4 * 80
    assert M.micro_seq(4096, 512, 16, 4096, packed=True) == 4096
    assert M.micro_seq(4096, 512, 16, 1000, packed=False) == 1512


def test_the_7b_layer_against_the_gpt_formula():
    """bf16, heads·d = h: 24h + 8i + 4·heads + 8; Korthikanti's GPT layer: 34h."""
    a = M.KNOWN_ARCHS["qwen2.5-7b"]
    assert M.layer_bytes_per_token(a, 2) == 24 * 3584 + 8 * 18944 + 4 * 28 + 8


def test_peak_is_resident_plus_the_larger_phase():
    e = M.Estimate({"weights": 1, "optimizer": 2, "replica": 3, "kv_cache": 10, "gradients": 1, "activations": 4})
    assert e.peak == 6 + 10
    e = M.Estimate({"weights": 1, "kv_cache": 10, "activations": 4}, resident=("weights", "kv_cache"), generation=())
    assert e.peak == 15


def _gpu_cfg(path, *over):
    return load_config(TrainConfig, str(path), list(over))


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=[p.stem for p in GPU_CONFIGS])
def test_every_gpu_recipe_fits_its_gpu(path):
    """By the estimate with float32 master weights and AdamW state, the FSDP root and buffers and the
    CUDA/NCCL allowances, in GiB of the GPU's real total (issue 60); the margin is printed."""
    cfg = _gpu_cfg(path)
    est, gpu, what = M.config_estimate(cfg)
    assert est is not None and gpu, what
    print(f"{path.stem}: {what}\n  " + "\n  ".join(est.lines(gpu)))
    assert gpu <= 80.0  # GiB: an "80 GB" GPU (H100: 79.6 GiB), not 80 GB read as more
    assert est.margin(gpu) >= 1.0, "\n".join(est.lines(gpu))
    assert cfg.memory.activation_checkpointing
    # without checkpointing the shipped micro-batches would not fit (the finding)
    off, _, _ = M.config_estimate(_gpu_cfg(path, "memory.activation_checkpointing=false"))
    assert off is not None and off.margin(gpu) < 0


def test_master_weights_fsdp_terms_and_overheads_by_hand():
    """bf16 compute on 8 FSDP ranks: float32 shards, gradients and AdamW moments (16 bytes a parameter
    over 8), a bf16 replica, the root's unsharded embeddings + head, two layers' all-gathers and one
    layer's gradients, CUDA + NCCL allowances; memory.cpu_offload moves the float32 state to the host."""
    over = ["model.dtype=bfloat16", "run.distributed=fsdp", "engine=hf"]
    e = M.estimate(load_config(TrainConfig, None, over), SMALL, ranks=8, gpu_gib=80.0)
    n, p = M.n_params(SMALL), 592  # SMALL's layer (test_parameter_count_by_hand_and_of_real_models)
    assert M.layer_params(SMALL) == p
    assert e.terms["weights"] == n * 4 / 8 and e.terms["gradients"] == n * 4 / 8
    assert e.terms["optimizer"] == 2 * n * 4 / 8 and e.terms["replica"] == n * 2
    assert e.terms["fsdp_root"] == 2 * (2 * 10 * 8 + 8) * 2
    assert e.terms["fsdp_buffers"] == 2 * p * 2 + p * (2 + 4)
    assert e.terms["overhead"] == (M.CUDA_CONTEXT_GIB + M.NCCL_GIB) * M.GIB
    off = M.estimate(load_config(TrainConfig, None, [*over, "memory.cpu_offload=true"]), SMALL, ranks=8, gpu_gib=80.0)
    assert off.host == {"weights": n * 4 / 8, "optimizer": 2 * n * 4 / 8, "gradients": n * 4 / 8}
    assert off.terms["weights"] == off.terms["optimizer"] == off.terms["gradients"] == 0 and off.peak < e.peak
    # one process, bf16: float32 masters and a bf16 generation copy; float32: neither
    one = M.estimate(load_config(TrainConfig, None, ["model.dtype=bfloat16", "engine=hf"]), SMALL, ranks=1)
    assert one.terms["weights"] == n * 4 and one.terms["replica"] == n * 2 and "fsdp_root" not in one.terms
    fp32 = M.estimate(load_config(TrainConfig, None, ["model.dtype=float32", "engine=hf"]), SMALL, ranks=1)
    assert fp32.terms["weights"] == n * 4 and fp32.terms["replica"] == 0 and fp32.terms["optimizer"] == 2 * n * 4


def test_gpu_memory_is_gib_and_the_older_gb_key_converts():
    cfg = load_config(TrainConfig, None, ["memory.gpu_memory_gb=80"])
    assert M.gpu_budget_gib(cfg) == pytest.approx(74.51, abs=0.01)  # 80e9 bytes, not 80 GiB
    assert M.gpu_budget_gib(load_config(TrainConfig, None, ["memory.gpu_memory_gib=79.6"])) == 79.6
    with pytest.raises(ArpoError, match="memory.gpu_memory_gb"):
        load_config(TrainConfig, None, ["memory.gpu_memory_gb=80", "memory.gpu_memory_gib=79.6"])


def test_cpu_offload_needs_sharding():
    from arpo.testing import tiny_model
    from arpo.training.distributed import ParallelModel

    with pytest.raises(ArpoError, match="memory.cpu_offload needs torchrun"):
        ParallelModel(tiny_model(), None, cpu_offload=True)


def test_a_config_that_does_not_fit_is_refused_with_the_keys(tmp_path):
    cfg = _gpu_cfg(GPU_CONFIGS[0], "memory.activation_checkpointing=false")
    with pytest.raises(ArpoError) as e:
        M.check_fits(cfg, 1)
    msg = str(e.value)
    assert "memory.activation_checkpointing=true" in msg and "micro_tokens" in msg and "memory.gpu_memory_gib" in msg
    M.check_fits(_gpu_cfg(GPU_CONFIGS[0]), 1)  # the shipped one passes
    # the recipe refuses before anything loads (the model directory does not exist here)
    from arpo.recipes import train

    with pytest.raises(ArpoError, match="memory: this config needs"):
        train.run(_gpu_cfg(GPU_CONFIGS[0], "memory.activation_checkpointing=false", f"run.dir={tmp_path / 'r'}"))


def test_cpu_configs_are_not_checked_without_a_gpu_budget():
    cfg = load_config(TrainConfig, str(ROOT / "configs" / "train_tiny.yaml"), ["model.device=cpu"])
    assert M.gpu_budget_gib(cfg) is None
    M.check_fits(cfg, 1)


def test_print_config_shows_the_estimate(capsys):
    from arpo.cli import main

    assert main(["train", "--config", str(GPU_CONFIGS[0]), "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "# memory per GPU (estimate" in out and "activations:" in out and "-> fits" in out
    import yaml

    assert yaml.safe_load(out)["memory"]["activation_checkpointing"] is True  # still a loadable config


def test_memory_keys_are_validated():
    with pytest.raises(ArpoError, match="memory.gpu_memory_gb"):
        load_config(TrainConfig, None, ["memory.gpu_memory_gb=-1"])
    with pytest.raises(ArpoError, match="run.distributed"):
        load_config(TrainConfig, None, ["run.distributed=zero3"])
    with pytest.raises(ArpoError, match="run.hsdp_shard_size"):
        load_config(TrainConfig, None, ["run.distributed=hsdp", "run.hsdp_shard_size=-2"])


def test_hsdp_mesh_shape():
    from arpo.training.distributed import hsdp_mesh_shape

    assert hsdp_mesh_shape(16, 0, 8) == (2, 8)  # one shard group per node
    assert hsdp_mesh_shape(16, 4, 8) == (4, 4)
    assert hsdp_mesh_shape(2, 1, 2) == (2, 1)
    with pytest.raises(ArpoError, match="run.hsdp_shard_size=3"):
        hsdp_mesh_shape(16, 3, 8)


def test_checkpointing_gives_the_same_gradients_float64():
    from arpo.testing import arch_model, arch_tokenizer
    from arpo.training.batch import TreeBatch, loss_and_backward
    from arpo.training.optim import checkpoint_activations

    tok = arch_tokenizer("qwen2")
    trees = [{"prompt": list(range(10, 30)), "responses": [list(range(40, 52)), list(range(40, 46)) + [7, 8, 9]],
              "parent": [-1, 0], "branch_at": [0, 6]}]
    batch = TreeBatch.from_trees(trees, TreeBatch.all_generated(trees))

    def grads(checkpointing: bool):
        torch.manual_seed(0)
        model = arch_model("qwen2", tok, hidden=32, layers=3).double()
        if checkpointing:
            checkpoint_activations(model)
        model.train()
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            loss_and_backward(model, batch, lambda lp, en: (-(lp * batch.mask).sum() - en.sum(), {}), need_entropy=True)
        return {n: p.grad.clone() for n, p in model.named_parameters()}, sum(saved)

    (plain, kept_plain), (ckpt, kept_ckpt) = grads(False), grads(True)
    assert kept_ckpt < kept_plain / 2  # checkpointing is on: the forward keeps far less for the backward
    assert plain.keys() == ckpt.keys()
    for n in plain:
        assert torch.allclose(plain[n], ckpt[n], rtol=0, atol=1e-10), (n, float((plain[n] - ckpt[n]).abs().max()))
        assert plain[n].abs().sum() > 0, n


def _bench():
    spec = importlib.util.spec_from_file_location("bench_checkpointing", ROOT / "benchmarks" / "bench_checkpointing.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
@pytest.mark.parametrize("hidden,layers", [(128, 2), (256, 4)])
def test_estimate_within_15_percent_of_the_measured_peak(hidden, layers):
    """Peak resident memory of a child process's training steps (benchmarks/bench_checkpointing.py:
    VmHWM after resetting it, minus the RSS before the model) vs weights + gradients + AdamW +
    activations + head of the estimate; float32 on CPU, one micro-batch of 1024 packed tokens."""
    bench = _bench()
    off, on = (bench.measure(hidden, layers, 1024, ck) for ck in (False, True))
    for r in (off, on):
        assert r["estimate_mb"] == pytest.approx(r["peak_mb"], rel=0.15), r
    assert on["peak_mb"] < off["peak_mb"]


def test_engine_terms_by_hand():
    """hf: every live sequence's K/V; vLLM on a GPU: its gpu_memory_utilization share (weights + cache),
    freed in training only with sleep mode."""
    over = ["model.dtype=bfloat16", "prompts_per_step=3", "rollout.group_size=4", "rollout.initial_rollouts=2",
            "agent.max_response_tokens=488", "run.distributed=fsdp", "rollout.entropy_estimator=topk"]
    cfg = load_config(TrainConfig, None, over)
    e = M.estimate(cfg, SMALL, ranks=2, shard_group=2)
    assert e.terms["kv_cache"] == 32 * (2 * 4) * (512 + 488)  # ceil(3/2)=2 prompts x 4 trajectories x 1000 tokens
    # bf16: float32 master shards, a bf16 replica
    assert e.terms["weights"] == M.n_params(SMALL) * 4 / 2 and e.terms["replica"] == M.n_params(SMALL) * 2
    vllm = load_config(TrainConfig, None, [*over, "engine=vllm",
                                           "engine_options={gpu_memory_utilization: 0.5, enable_sleep_mode: true}"])
    e = M.estimate(vllm, SMALL, ranks=2, shard_group=2, gpu_gib=1.0)
    assert e.terms["engine_weights"] + e.terms["kv_cache"] == pytest.approx(0.5 * M.GIB)  # of the GPU's real total
    assert "kv_cache" in e.generation
    awake = load_config(TrainConfig, None, [*over, "engine=vllm", "engine_options={gpu_memory_utilization: 0.5}"])
    assert "kv_cache" in M.estimate(awake, SMALL, ranks=2, shard_group=2, gpu_gib=1.0).resident


def test_the_architecture_of_a_local_model_and_of_a_run_dir(tmp_path):
    from arpo.testing import save_tiny_model

    save_tiny_model(tmp_path / "m")
    a = M.find_arch(str(tmp_path / "m"))
    assert a is not None and a.hidden == 64 and a.layers == 2
    ck = tmp_path / "run" / "checkpoints" / "step_000001"
    ck.mkdir(parents=True)
    (ck / "state.json").write_text("{}")
    (tmp_path / "run" / "checkpoints" / "latest").write_text("step_000001\n")
    import shutil

    shutil.copytree(tmp_path / "m", ck / "model")
    assert M.find_arch(str(tmp_path / "run")) == a  # a run dir: its latest checkpoint's model
    assert M.find_arch("/models/Qwen3-14B-deep-search-sft") == M.KNOWN_ARCHS["qwen3-14b"]
    assert M.find_arch("/nowhere/unknown-model") is None


def test_a_run_saved_before_the_new_memory_keys_resumes():
    """A run's saved config without memory.gpu_memory_gib / cpu_offload (issue 60 added them), or with
    another memory setting, is not a change of what the run trains."""
    from arpo.training.rundir import unsafe_changes

    old = {"memory": {"activation_checkpointing": False, "gpu_memory_gb": 0.0, "gpus": 0}}
    new = {"memory": {"activation_checkpointing": True, "gpu_memory_gb": 0.0, "gpus": 0, "gpu_memory_gib": 79.6,
                      "cpu_offload": True}}
    assert unsafe_changes(old, new) == []
