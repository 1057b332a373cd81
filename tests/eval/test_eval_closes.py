"""`arpo eval` closes its engine and its judge's HTTP client on every way out (issue 64 item 5): the engine
was never closed, and the judge's client stayed open when an error ended the evaluation.

A real tiny-model engine and a real judge server on localhost; a reward plug-in ends the evaluation
in the second dataset (Ctrl-C there, or an error), after the first dataset was judged through the
server. The engine's and the judge's `close` are watched (they still run)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from arpo.cli import main

pytest.importorskip("httpx")

REWARD = '''
def _answer(response):
    words = response.split()
    return {"reward": 0.0, "answer": words[-1] if words else "x"}


def interrupt(response, example, finish_reason=None):
    if finish_reason is not None and example["id"].startswith("b"):
        raise KeyboardInterrupt  # Ctrl-C in the middle of the second dataset
    return _answer(response)


def crash(response, example, finish_reason=None):
    if finish_reason is not None and example["id"].startswith("b"):
        raise ValueError("a reward that breaks on the second dataset")
    return _answer(response)
'''


@pytest.fixture
def judge_url():
    asked: list[str] = []

    class Judging(BaseHTTPRequestHandler):
        def do_POST(self):
            asked.append(self.rfile.read(int(self.headers["Content-Length"])).decode())
            out = json.dumps({"choices": [{"message": {"role": "assistant",
                                                       "content": "<judgment>Correct</judgment>"}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *a):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Judging)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}/v1", asked
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("reward, rc", [("interrupt", 130), ("crash", 2)])
def test_the_engine_and_the_judge_are_closed_when_the_evaluation_ends_early(tmp_path, monkeypatch, judge_url,
                                                                           reward, rc):
    from arpo.engine.hf import HFEngine
    from arpo.eval.judge import Judge

    url, asked = judge_url
    (tmp_path / "closing_reward.py").write_text(REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    data = []
    for name in ("a", "b"):
        f = tmp_path / f"{name}.jsonl"
        f.write_text("".join(json.dumps({"id": f"{name}{i}", "question": f"Who is {i}?", "answer": f"n{i}",
                                         "task": "qa"}) + "\n" for i in range(2)))
        data.append(str(f))
    engines, judges = [], []
    engine_close, judge_close = HFEngine.close, Judge.close
    monkeypatch.setattr(HFEngine, "close", lambda self: (engines.append(self), engine_close(self))[1])
    monkeypatch.setattr(Judge, "close", lambda self: (judges.append(self), judge_close(self))[1])
    argv = ["eval", "--model", "tiny-random", "--data", *data, "--tools", "", "--max-response-tokens", "6",
            "--device", "cpu", "--reward", f"closing_reward:{reward}", "--quiet", "--judge", "--judge-url", url,
            "--judge-model", "judge", "--judge-retries", "1"]
    assert main(argv) == rc
    assert asked, "the first dataset was judged through the server"
    assert len(engines) == 1 and not engines[0].seqs
    assert len(judges) == 1 and judges[0]._client.is_closed
