"""The engines' names and the choices of their keywords, which the settings (settings/engine.py) check
a config against without loading an engine."""

ENGINES = ("hf", "vllm", "vllm_server")
TRANSFERS = ("disk", "nccl", "ipc")  # vllm_server: how the policy's weights reach the servers (VLLMServerEngine)
PAUSE_MODES = ("wait", "abort", "keep")  # vLLM's /pause modes: finish, drop or freeze other clients' requests
