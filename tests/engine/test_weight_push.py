"""The weight push to `vllm serve` endpoints as one protocol (issue 60, findings 3-6), against a real local
HTTP server implementing vLLM's dev-mode routes (tests/engine/fake_vllm_server.py): pause → send → a
weight version → check → resume on every server; a stalled server is an error within push_timeout_s,
not a hang; a server that answers another version is an error; the ranks agree on one server set
(torchrun, gloo); the NCCL/IPC path runs one trainer engine (one gather, packed) for all servers. That
last path is GPU-only in vLLM: here it runs against fakes of vllm's WeightTransferTrainerFactory /
ModuleSource / *TrainerInitInfo that follow the contract read from vllm's source (trainer_init posts the
init info through the client; send_weights drives start → update → finish through it)."""

import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from arpo.errors import ArpoError

sys.path.insert(0, str(Path(__file__).parent))
from fake_vllm_server import FakeVLLM


@pytest.fixture
def servers():
    made = [FakeVLLM(), FakeVLLM()]
    yield made
    for s in made:
        s.close()


def _engine(tok, servers, **kw):
    from arpo.engine.vllm_server import VLLMServerEngine

    return VLLMServerEngine([s.url for s in servers], tok, timeout_s=5, **kw)


DISK = ["/pause", "/collective_rpc", "/reset_prefix_cache", "/update_weight_version", "/weight_info", "/resume"]


def test_disk_push_pauses_sends_versions_checks_and_resumes(tiny_tok, tiny_lm, servers, tmp_path):
    e = _engine(tiny_tok, servers, weights_dir=str(tmp_path))
    try:
        assert e.load_weights(tiny_lm) > 0
        for s in servers:
            assert s.paths() == DISK, s.paths()
            assert dict(s.calls)["/pause"]["mode"] == "wait" and not s.paused
            assert s.version == e.weight_version
        first = e.weight_version
        e.load_weights(tiny_lm)
        assert e.weight_version != first and all(s.version == e.weight_version for s in servers)
    finally:
        e.close()


def test_a_stalled_server_is_an_error_within_the_timeout_and_is_resumed(tiny_tok, tiny_lm, servers, tmp_path):
    servers[1].stall["/collective_rpc"] = 4.0
    e = _engine(tiny_tok, servers, weights_dir=str(tmp_path), push_timeout_s=1.0)
    try:
        t0 = time.perf_counter()
        with pytest.raises(ArpoError, match=r"push_timeout_s=1 s"):
            e.load_weights(tiny_lm)
        assert time.perf_counter() - t0 < 3.5
        time.sleep(0.2)
        assert servers[0].paths()[-1] == "/resume" and not servers[0].paused
    finally:
        e.close()


def test_a_server_answering_another_version_is_an_error(tiny_tok, tiny_lm, servers, tmp_path):
    servers[0].stale_version = True
    e = _engine(tiny_tok, servers, weights_dir=str(tmp_path))
    try:
        with pytest.raises(ArpoError, match=r"answers weight version 'stale'"):
            e.load_weights(tiny_lm)
        assert not servers[0].paused and not servers[1].paused  # resumed all the same
    finally:
        e.close()


def _fake_vllm_modules(monkeypatch, log):
    """vllm.distributed.weight_transfer.{base,factory,clients,nccl_engine,ipc_engine} as the contract reads."""

    class ModuleSource:
        def __init__(self, module):
            self.module = module

        def __iter__(self):
            log["gathers"] += 1  # ModuleSource full_tensor()s every parameter: one gather per iteration
            return iter(list(self.module.named_parameters()))

    class Info:
        def __init__(self, **kw):
            self.kw = kw

    class Trainer:
        def __init__(self, info, client, source):
            self.client, self.source = client, source
            client.init_weight_transfer_engine({"packed": info.kw.get("packed", False)})

        def send_weights(self):
            self.client.start_weight_update()
            names = [n for n, _ in self.source]
            self.client.update_weights({"names": names, "dtype_names": ["float32"] * len(names)})
            self.client.finish_weight_update()

        def shutdown(self):
            log["shutdowns"] += 1

    class Factory:
        @staticmethod
        def trainer_init(info, *, client, source):
            log["inits"].append(info.kw)
            return Trainer(info, client, source)

    mods = {"vllm": types.ModuleType("vllm")}
    contents = {"base": {"ModuleSource": ModuleSource}, "factory": {"WeightTransferTrainerFactory": Factory},
                "clients": {"_json_safe_update_info": lambda d: d},
                "nccl_engine": {"NCCLTrainerInitInfo": Info}, "ipc_engine": {"IPCTrainerInitInfo": Info}}
    for name, attrs in contents.items():
        m = types.ModuleType(f"vllm.distributed.weight_transfer.{name}")
        for k, v in attrs.items():
            setattr(m, k, v)
        mods[m.__name__] = m
    for k, m in mods.items():
        monkeypatch.setitem(sys.modules, k, m)


@pytest.mark.parametrize("transfer", ["ipc", "nccl"])
def test_transfer_is_one_packed_trainer_engine_for_every_server(transfer, tiny_tok, tiny_lm, servers, monkeypatch):
    log = {"gathers": 0, "inits": [], "shutdowns": 0}
    _fake_vllm_modules(monkeypatch, log)
    e = _engine(tiny_tok, servers, transfer=transfer)
    try:
        e.load_weights(tiny_lm)
        e.load_weights(tiny_lm)
        assert len(log["inits"]) == 1 and log["inits"][0]["packed"] is True  # one engine, built once
        assert log["gathers"] == 2  # one gather per push, whatever the number of servers
        for i, s in enumerate(servers):
            push = ["/start_weight_update", "/update_weights", "/finish_weight_update", "/reset_prefix_cache",
                    "/weight_info", "/resume"]
            first = ["/pause", *(["/get_world_size"] if transfer == "nccl" else []), "/init_weight_transfer_engine"]
            assert s.paths() == [*first, *push, "/pause", *push], s.paths()
            assert s.version == e.weight_version and not s.paused and not s.updating
            init = dict(s.calls)["/init_weight_transfer_engine"]["init_info"]
            if transfer == "nccl":  # one group: the trainer is rank 0, server i's workers follow
                assert init["rank_offset"] == 1 + i and log["inits"][0]["world_size"] == 3
                assert log["inits"][0]["master_address"] == "127.0.0.1"  # the servers are on this host
    finally:
        e.close()


def test_server_command_and_env_carry_what_the_push_needs():
    from arpo.engine.vllm_server import server_command, server_env

    cmd = server_command("/m", 8000, transfer="ipc", gpu_memory_utilization=0.3)
    assert cmd[cmd.index("--weight-transfer-config") + 1] == json.dumps({"backend": "ipc"})
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.3"
    assert server_env(transfer="ipc")["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1"
    assert "VLLM_ALLOW_INSECURE_SERIALIZATION" not in server_env(transfer="nccl")
    assert "--weight-transfer-config" not in server_command("/m", 8000)
    with pytest.raises(ArpoError, match="gpu_memory_utilization"):
        server_command("/m", 8000, gpu_memory_utilization=1.5)


def test_rollout_servers_dry_run_prints_the_transfer_settings(capsys):
    from arpo.cli import main

    assert main(["rollout-servers", "--model", "/m", "--count", "2", "--gpus", "0,1", "--transfer", "ipc",
                 "--gpu-memory-utilization", "0.4", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("VLLM_ALLOW_INSECURE_SERIALIZATION=1") == 2 and out.count("--weight-transfer-config") == 2
    assert out.count("--gpu-memory-utilization 0.4") == 2


def test_master_address_is_reachable_or_an_error(monkeypatch):
    from arpo.engine.vllm_server import master_host

    monkeypatch.delenv("MASTER_ADDR", raising=False)
    assert master_host(["http://127.0.0.1:8000"]) == "127.0.0.1"
    with pytest.raises(ArpoError, match="engine_options.master_address: 127.0.0.1"):
        master_host(["http://10.1.2.3:8000"], "127.0.0.1")
    monkeypatch.setenv("MASTER_ADDR", "10.9.9.9")
    assert master_host(["http://10.1.2.3:8000"]) == "10.9.9.9"
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # torchrun --standalone's: not reachable from another host
    assert master_host(["http://10.1.2.3:8000"]) != "127.0.0.1" or pytest.fail("loopback for a remote server")


AGREE = """
import json, sys
import torch.distributed as dist
from arpo.engine.vllm_server import VLLMServerEngine
from arpo.testing import tiny_model, tiny_tokenizer
dist.init_process_group("gloo")
tok = tiny_tokenizer()
e = VLLMServerEngine(sys.argv[1:3], tok, timeout_s=5, weights_dir=sys.argv[3] + f"/r{dist.get_rank()}")
if dist.get_rank() == 1:
    e.servers[1].alive = False  # this rank saw server B fail during its rollout; rank 0 did not
e.load_weights(tiny_model(tok))
print(json.dumps([s.alive for s in e.servers]))
dist.destroy_process_group()
"""


def test_ranks_agree_on_the_servers_before_a_push(servers, tmp_path):
    """torchrun, 2 ranks: rank 1 lost server B, rank 0 did not; after the push both count only A alive and
    B got no update (before: rank 0 pushed to B, which rank 1 no longer used, or vice versa)."""
    script = tmp_path / "agree.py"
    script.write_text(AGREE)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                        str(script), servers[0].url, servers[1].url, str(tmp_path)],
                       env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    assert [json.loads(x) for x in p.stdout.splitlines() if x.startswith("[")] == [[True, False], [True, False]]
    assert servers[0].paths() == DISK and servers[1].paths() == []
