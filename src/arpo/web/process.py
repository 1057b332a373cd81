"""`arpo web serve` as a child process for a program that needs a local web while it runs (an
experiment on webhop: its SFT data, rollouts and evaluations reach the pages over HTTP, as the web
tools reach the internet):

    with served_web("webhop:pages") as url:   # http://127.0.0.1:PORT, up (GET /health answered)
        ...

The server is the command a user runs (`python -m arpo web serve --corpus C --port P`), not an
in-process copy: the tools under test meet a real server, and its work does not share this process's
interpreter with training. It is stopped when the block ends, however it ends.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

from arpo.errors import ArpoError
from arpo.ports import free_port, stop_process


@contextmanager
def served_web(corpus: str, port: int = 0, host: str = "127.0.0.1", timeout_s: float = 120.0) -> Iterator[str]:
    """Serve `corpus` (`arpo web serve --corpus`) on host:port (0: a free port) until the block ends;
    yields the base URL once GET /health answers 200. ArpoError with the server's own output when it
    exits or does not answer within timeout_s (a bad corpus name, a taken port)."""
    import httpx

    port = port or free_port(host)
    url = f"http://{host}:{port}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen([sys.executable, "-m", "arpo", "web", "serve", "--corpus", corpus, "--host", host,
                                 "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    said = log.read()[-2000:].strip() or "(no output)"
                    why = f"exited with {proc.returncode}" if proc.poll() is not None else \
                        f"did not answer {url}/health within {timeout_s:.0f} s"
                    raise ArpoError(f"arpo web serve --corpus {corpus} --port {port} {why}:\n{said}")
                try:
                    if httpx.get(url + "/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            yield url
        finally:
            stop_process(proc)
