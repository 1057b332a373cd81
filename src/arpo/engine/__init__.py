"""Generation engines: `hf` (transformers, engine/hf.py), `vllm` (engine/vllm.py, optional extra) and
`vllm_server` (engine/vllm_server.py: stock `vllm serve` endpoints over HTTP).

    engine = make_engine(kind, model, tokenizer, model_dir=cfg.model.name)   # kind: hf | vllm | vllm_server
    ...rollouts...
    sync_weights(engine, model)   # after each policy update: a no-op for hf (it runs the policy itself)

Both implement the interface in engine/base.py. Importing this package imports neither backend.
"""

from __future__ import annotations

import arpo.models
from arpo.engine.names import ENGINES as ENGINES  # re-exported: the engines' names
from arpo.errors import ArpoError
from arpo.models import resolve_model_dir


def make_engine(kind: str = "hf", model=None, tokenizer=None, model_dir=None, **opts):
    """An engine of the given kind over a policy.

    hf:   HFEngine(model, tokenizer, **opts) — decodes with the policy module itself (loaded from
          `model_dir` when no model is given).
    vllm: VLLMEngine.from_model(model, tokenizer, model_dir=model_dir, **opts) — vLLM starts from
          `model_dir` (an HF directory or a built-in model name; without one, the policy is written to
          a temporary directory) and the policy's current weights are pushed in; call
          `sync_weights(engine, model)` after every update. opts go to VLLMEngine (max_model_len,
          topk_entropy, kv_cache_gib, multiprocessing, enable_sleep_mode, ... and any vllm.LLM keyword).
    vllm_server: VLLMServerEngine(servers, tokenizer, **opts) over running `vllm serve` endpoints
          (`servers=[url, ...]`, from rollout.servers); no vLLM is needed in this process. The policy's
          weights are pushed with `sync_weights` (the servers reload them), as for vllm.
    """
    k = (kind or "hf").lower()
    if k == "hf":
        from arpo.engine.hf import HFEngine  # noqa: PLC0415 - loads torch; kept out of this light module's import

        if model is None:
            if model_dir is None:
                raise ArpoError("engine hf: needs a model or a model_dir")

            model, tok = arpo.models.load_model(str(model_dir))
            tokenizer = tokenizer or tok
        return HFEngine(model, tokenizer, **opts)
    if k == "vllm":
        from arpo.engine.vllm import INSTALL_HINT, VLLMEngine, vllm_available  # noqa: PLC0415 - loads torch; kept out of this light module's import

        if not vllm_available():
            raise ArpoError(f"engine vllm: {INSTALL_HINT}")

        return VLLMEngine.from_model(model, tokenizer, model_dir=model_dir, **opts)
    if k == "vllm_server":
        from arpo.engine.vllm_server import VLLMServerEngine  # noqa: PLC0415 - loads torch; kept out of this light module's import

        servers = opts.pop("servers", None)
        if tokenizer is None:
            if model_dir is None:
                raise ArpoError("engine vllm_server: needs a tokenizer or a model_dir to load one from")
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_dir(str(model_dir))))
        return VLLMServerEngine(servers, tokenizer, **opts)
    raise ArpoError(f"engine: unknown engine {kind!r}; choose one of {', '.join(ENGINES)}")


def sync_weights(engine, model) -> None:
    """Make the engine generate with the policy's current weights: vLLM gets them pushed
    (VLLMEngine.load_weights); engines that run the policy module itself (hf) need nothing."""
    engine.load_weights(model)
