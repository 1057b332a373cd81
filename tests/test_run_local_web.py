"""A run's `tools.web.provider: local` (or its default) does not let browse read 127.0.0.1:8090 without
--trust-run-config (issue 61): the local web is whatever listens there. A real server on that port
holds a secret; browse reads it only with the flag, or when you name the provider yourself."""

import http.server
import socket
import threading

import pytest
import yaml

pytest.importorskip("httpx")
pytest.importorskip("trafilatura")

from arpo.cli import build_parser


@pytest.fixture()
def local_8090():
    try:
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 8090), Secret)
    except OSError:
        pytest.skip("127.0.0.1:8090 is taken")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield "http://127.0.0.1:8090"
    srv.shutdown()
    srv.server_close()


class Secret(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"the dashboard's secret"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def browse(argv, url):
    from arpo.commands.agent_flags import resolve
    from arpo.tools import tools_from_config

    r = resolve(build_parser().parse_args(argv), "chat")
    reg = tools_from_config(r.tools)
    try:
        return reg["browse"](url)
    finally:
        reg.close()


@pytest.mark.parametrize("web", [{"provider": "local"}, None])
def test_a_runs_local_provider_does_not_open_the_local_port(tmp_path, local_8090, capsys, web):
    run = tmp_path / "run"
    run.mkdir()
    tools: dict = {"enabled": ["browse"]}
    if web:
        tools["web"] = web
    (run / "config.yaml").write_text(yaml.safe_dump({"tools": tools}))
    assert socket.create_connection(("127.0.0.1", 8090), timeout=5)
    r = browse(["chat", "--model", str(run), "hi"], local_8090 + "/x")
    assert not r.ok and "secret" not in r.output and "refused to fetch 127.0.0.1" in r.output, r.output
    assert "browse does not fetch the local web at http://127.0.0.1:8090 for this run" in capsys.readouterr().err
    for more in (["--trust-run-config"], ["--web-provider", "local"]):
        r = browse(["chat", "--model", str(run), *more, "hi"], local_8090 + "/x")
        assert r.ok and "the dashboard's secret" in r.output, (more, r.output)
