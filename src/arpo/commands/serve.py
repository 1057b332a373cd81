"""`arpo serve retriever` (the search index over HTTP, retrieval/server.py) and `arpo serve agent` (a trained
agent behind an OpenAI-compatible API, serve/app.py)."""

from __future__ import annotations

import os

from arpo.commands import HELP, POS_INT, add_engine_flags, check_engine_flags, deprecated, number
from arpo.commands.agent_flags import add_agent_flags, resolve
from arpo.commands.from_run import run_settings

EXAMPLES = """examples:
  arpo serve retriever --search-index ~/.cache/arpo/indexes/hotpotqa --port 8001
  curl -s localhost:8001/health
  curl -s localhost:8001/search -H 'content-type: application/json' \\
       -d '{"queries": ["Ed Wood director"], "top_k": 3, "mode": "bm25"}'
  arpo rollout --config configs/rollout_hotpotqa.yaml tools.search_url=http://127.0.0.1:8001

POST /search {queries: [str], top_k: int = 10, mode: bm25|dense|hybrid} -> {results: [[{id, title, text, score}]]}
GET /health -> {status, n_docs, dense};  GET /docs: interactive API documentation."""

AGENT_EXAMPLES = """examples:
  arpo serve agent --model runs/arpo_gsm8k --port 8000
  arpo serve agent --model runs/train_hotpotqa --tools search --search-index ./my-index
  arpo serve agent --model smollm2-135m-instruct --tools python --session --max-batch 32
  arpo serve agent --model runs/arpo_gsm8k --engine vllm_server --servers http://127.0.0.1:8100
  curl -s localhost:8000/v1/chat/completions -H 'content-type: application/json' \\
       -d '{"model": "arpo_gsm8k", "messages": [{"role": "user", "content": "What is 17*23?"}]}'

  from openai import OpenAI
  client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")
  r = client.chat.completions.create(model="arpo_gsm8k", messages=[{"role": "user", "content": "17*23?"}])
  r.choices[0].message.content                          # the final answer turn
  r.choices[0].message.model_extra["agent_messages"]   # the tool calls and results, OpenAI format

The agent loop runs on the server with its tools; concurrent requests are decoded together. --model
takes a run dir (its latest checkpoint; its config.yaml gives the defaults of the tool and agent
flags: its built-in tools, template, call format and budgets; its MCP servers, your own tools, search
URL and web URLs and key variables only with --trust-run-config, which prints what will run), a
checkpoint, a Hugging Face dir or a built-in name. --tools-config FILE adds a tools section (MCP
servers: `mcp: [{command: python, args: [server.py]}]`). The sampling flags are the defaults of a
request that sets none. The model id clients ask for is the
run's name (GET /v1/models), or --served-model-name."""


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve a retrieval index or a trained agent over HTTP",
                       description="Serve components over HTTP: a search index that several processes share "
                       "(retriever), or a trained agent behind an OpenAI-compatible API (agent).",
                       epilog="examples:\n  arpo serve retriever --search-index ~/.cache/arpo/indexes/hotpotqa\n"
                       "  arpo serve agent --model runs/arpo_gsm8k --port 8000\n\n"
                       "`arpo serve retriever --help` and `arpo serve agent --help` say more.", formatter_class=HELP)
    s = p.add_subparsers(dest="what", metavar="{retriever,agent}")
    r = s.add_parser("retriever", help="serve a search index: POST /search, GET /health, GET /docs",
                     description="Serve a search index built by `arpo index build`.", epilog=EXAMPLES,
                     formatter_class=HELP)
    r.add_argument("--search-index", default=None, help="index directory (default: $ARPO_CACHE_DIR/indexes/hotpotqa, "
                   "built on first use from the built-in HotpotQA corpus)")
    deprecated(r, "--index", "--search-index", dest="search_index")
    r.add_argument("--host", default="127.0.0.1", help="interface to bind (0.0.0.0 for all)")
    r.add_argument("--port", type=number(int, 1, 65535), default=8001, help="port")
    r.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level")
    r.add_argument("--api-key-env", default="ARPO_RETRIEVER_KEY", metavar="VAR",
                   help="the environment variable holding the key /search requires (unset: no key; clients send it "
                   "as a Bearer token, the search tool reads the same variable)")
    r.set_defaults(func=run)
    _register_agent(s)
    p.set_defaults(func=lambda a: p.print_help() or 0)


def _register_agent(s) -> None:
    a = s.add_parser("agent", help="serve a trained agent: OpenAI-compatible POST /v1/chat/completions",
                     description="Serve a trained agent behind an OpenAI-compatible Chat Completions API "
                     "(POST /v1/chat/completions, streaming too; GET /v1/models; GET /health). The agent "
                     "calls its tools on the server; the response carries its final answer as `content` "
                     "and the tool calls with their results as `agent_messages`.",
                     epilog=AGENT_EXAMPLES, formatter_class=HELP)
    a.add_argument("--model", default="smollm2-135m-instruct",
                   help="run dir, checkpoint, Hugging Face dir or built-in name")
    a.add_argument("--served-model-name", default=None, help="the model id clients ask for (default: the run's name)")
    add_agent_flags(a, "serve")  # tools, template, budgets, sampling, --tools-config, --web-*
    add_engine_flags(a, "the served agent")
    a.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (hf engine)")
    a.add_argument("--max-batch", type=POS_INT, default=64, help="conversations decoded together; more wait")
    a.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` (default: $ARPO_API_KEY)")
    a.add_argument("--host", default="127.0.0.1", help="interface to bind (0.0.0.0 for all)")
    a.add_argument("--port", type=number(int, 1, 65535), default=8000, help="port")
    a.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level")
    a.set_defaults(func=run_agent)


def run(args) -> int:
    from arpo.retrieval.server import serve

    serve(args.search_index, args.host, args.port, log_level=args.log_level,
          api_key=os.environ.get(args.api_key_env) or None)
    return 0


def run_agent(args) -> int:
    from arpo.serve.app import serve

    serve(agent_config(args, run_settings(args.model), os.environ.get("ARPO_API_KEY")))
    return 0


def agent_config(args, run: dict, env_key: str | None = None):
    """ServeConfig from the flags; what they leave unset comes from the run dir (`run`: from_run.run_settings,
    its plain tool settings; its code and network settings with --trust-run-config, from_run.admit), then
    serve's defaults (commands/agent_flags.py)."""
    from arpo.settings import ServeConfig

    check_engine_flags(args)
    r = resolve(args, "serve", run)
    return ServeConfig(
        model=args.model, served_model_name=args.served_model_name, agent=r.agent, tools=r.tools, template=r.template,
        engine=args.engine, servers=list(args.servers or []), device=args.device, max_batch=args.max_batch,
        api_key=args.api_key or env_key, trust_run_config=bool(getattr(args, "trust_run_config", False)),
        host=args.host, port=args.port, log_level=args.log_level,
    )
