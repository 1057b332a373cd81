"""OpenEnv environments (openenv-core 0.3.0, `pip install 'arpo[envs]'`) over OpenEnv's own protocol.

`openenv:http://HOST:PORT` plays the server at that URL; `openenv:mypkg.server:app` starts the app
(`openenv.core.env_server.create_app(...)`) as a local process first (uvicorn on a free port, stopped
when arpo exits). Each episode is one WebSocket session (`/ws`, OpenEnv's stateful protocol: the HTTP
`/reset` and `/step` make a fresh environment per request), through openenv's own GenericEnvClient.

An action is the model's text put in the action's one text field (found in the server's `/schema`, or
`?field=NAME`); an action with several fields is a JSON object the model writes. The observation the
model reads is the observation's text field (text, message, output, ...) or its JSON.

Errors are one line that names the server: unreachable, an answer that is not JSON or has no
observation, a server that exits while it starts. An action the server rejects (validation) is the
model's mistake: its error is the observation, the episode goes on.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

from arpo.envs.base import EnvError, Step, observation_text
from arpo.ports import free_port, stop_process


def _get(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def start_server(app: str, timeout_s: float = 120.0) -> tuple[str, subprocess.Popen]:
    """Start `module:app` with uvicorn on a free local port; (its URL, the process) once /health answers."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    log = tempfile.TemporaryFile()  # noqa: SIM115 - the server writes to it while it lives
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port),
                             "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT, env=env)
    atexit.register(stop_process, proc)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            tail = log.read().decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise EnvError(f"the OpenEnv server {app} exited with status {proc.returncode} while starting: {tail[0]}")
        try:
            _get(f"{url}/health", 1.0)
            return url, proc
        except (OSError, ValueError):
            time.sleep(0.2)
    stop_process(proc)
    raise EnvError(f"the OpenEnv server {app} did not answer {url}/health within {timeout_s:.0f} s")


class OpenEnvEnvironment:
    """An OpenEnv server (a URL, or an app started here) as an arpo Environment (envs/base.py)."""

    deterministic = True  # assumed; a replay checks every observation (tools/plugins/env.py)

    def __init__(self, target: str, field: str | None = None, timeout_s: float = 120.0):
        self.proc: subprocess.Popen | None = None
        if target.startswith(("http://", "https://")):
            self.url = target.rstrip("/")
        else:
            self.url, self.proc = start_server(target, timeout_s)
        self.name, self.timeout_s = f"OpenEnv {target}", timeout_s
        self.field = field or self._text_field()

    def _text_field(self) -> str | None:
        """The action's one text field, from the server's /schema (None: the action is a JSON object)."""
        try:
            schema = _get(f"{self.url}/schema")
        except (OSError, urllib.error.URLError) as e:
            raise EnvError(f"cannot reach the OpenEnv server at {self.url} ({getattr(e, 'reason', e)}); start it, "
                           "or give openenv:module.path:app to have arpo start it") from e
        except ValueError as e:
            raise EnvError(f"the OpenEnv server at {self.url} answered /schema with malformed JSON ({e})") from e
        props = {k: v for k, v in (schema.get("action", {}).get("properties") or {}).items() if k != "metadata"}
        text = [k for k, v in props.items() if v.get("type") == "string"]
        return text[0] if len(props) == 1 and text else None

    def open(self) -> OpenEnvEpisode:
        return OpenEnvEpisode(self)

    def close(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)


def _client_class():
    from openenv.core.generic_client import GenericEnvClient  # noqa: PLC0415 - optional extra (openenv-core)

    class Client(GenericEnvClient):
        """openenv's dict client, strict about the answer's shape (a missing observation is an error)."""

        async def _receive(self) -> dict[str, Any]:
            try:
                return await super()._receive()
            except json.JSONDecodeError as e:
                raise EnvError(f"the OpenEnv server at {self._ws_url} answered with malformed JSON ({e})") from e

        def _parse_result(self, payload):
            if not isinstance(payload, dict) or "observation" not in payload:
                raise EnvError(f"the OpenEnv server at {self._ws_url} answered without an observation: {payload!r:.80}")
            return super()._parse_result(payload)

    return Client


class OpenEnvEpisode:
    """One WebSocket session of the server: reset, step, close."""

    def __init__(self, env: OpenEnvEnvironment):
        self.env = env
        try:
            self.client = _client_class()(base_url=env.url, connect_timeout_s=min(10.0, env.timeout_s),
                                          message_timeout_s=env.timeout_s).sync()
            self.client.connect()
        except ImportError as e:
            raise EnvError("openenv: environments need openenv-core (pip install 'arpo[envs]')") from e
        except ConnectionError as e:
            raise EnvError(f"cannot reach the OpenEnv server at {env.url} ({str(e).splitlines()[0]})") from e

    def _result(self, call, what: str) -> Step:
        from websockets.exceptions import ConnectionClosed  # noqa: PLC0415 - openenv-core's dependency

        try:
            r = call()
        except EnvError:
            raise
        except RuntimeError as e:
            if "CAPACITY_REACHED" in str(e):  # not the model's mistake: the server has no session for it
                raise EnvError(self._capacity(str(e).removeprefix("Server error: "))) from e
            if str(e).startswith("Server error"):  # the server refused this action: the model reads why
                return Step(f"Error: {e}")
            raise EnvError(f"OpenEnv server {self.env.url}: {what} failed ({e})") from e
        except ConnectionClosed as e:  # a server at capacity sends its error, then closes the session
            raise EnvError(self._capacity(f"it closed the session during {what}: {e}")) from e
        except (OSError, TimeoutError) as e:
            raise EnvError(f"OpenEnv server {self.env.url}: {what} failed ({type(e).__name__}: {e})") from e
        return Step(observation_text(r.observation), r.reward, bool(r.done))

    def _capacity(self, said: str) -> str:
        return (f"OpenEnv server {self.env.url} refused an episode ({said}); a server holds at most its "
                "create_app(..., max_concurrent_envs=N) sessions at once: run fewer episodes at a time (arpo eval "
                "--batch-size; train: prompts_per_step x rollout.group_size) or raise N")

    def reset(self, **task: Any) -> Step:
        return self._result(lambda: self.client.reset(**task), f"reset({task})")

    def step(self, action: str) -> Step:
        if self.env.field is not None:
            payload: Any = {self.env.field: action}
        else:
            try:
                payload = json.loads(action)
            except ValueError:
                payload = None
            if not isinstance(payload, dict):
                return Step("Error: write the action as a JSON object of the action's fields")
        return self._result(lambda: self.client.step(payload), "step")

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:  # noqa: BLE001 - closing a session that already broke: nothing to keep
            pass
