"""vLLM servers from the command line, the newcomer's mistakes (issue 62): a server URL ending in /v1
(it became /v1/v1/models), `--engine vllm_server` without `--servers` (it got the message of the
opposite mistake), `arpo rollout-servers` with no model folder or without vLLM (each server died on its
own, minutes later)."""

from arpo.cli import main
from arpo.engine.vllm_server import check_server_urls
from arpo.testing import save_tiny_model


def test_a_v1_url_is_the_server_base():
    assert check_server_urls(["http://127.0.0.1:8000/v1", "http://h:8001/v1/"]) == ["http://127.0.0.1:8000",
                                                                                     "http://h:8001"]


def test_vllm_server_without_servers_says_what_is_missing(capsys):
    assert main(["eval", "--model", "tiny-random", "--data", "svamp:test[0:1]", "--engine", "vllm_server"]) == 2
    err = capsys.readouterr().err
    assert "--engine vllm_server needs --servers URL" in err and "goes with" not in err, err


def test_rollout_servers_checks_the_model_folder_and_vllm(tmp_path, capsys):
    from arpo.engine.vllm import vllm_available

    assert main(["rollout-servers", "--model", str(tmp_path / "nothing"), "--port", "8100"]) == 2
    assert "not a model folder (no config.json there)" in capsys.readouterr().err
    if vllm_available():
        return  # the vLLM check needs an environment without it
    save_tiny_model(tmp_path / "m")
    assert main(["rollout-servers", "--model", str(tmp_path / "m"), "--port", "8100"]) == 2
    assert "vLLM is not installed" in capsys.readouterr().err
