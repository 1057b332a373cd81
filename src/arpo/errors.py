"""User-facing errors: the CLI prints them without a traceback and exits with status 2.

`explain(e)` is the one place that decides which exceptions are the user's input or environment (one
line, exit 2) and which are bugs (a traceback): ArpoError, an OSError on a named path (an unwritable
output, a missing file), a corrupt weights file and a missing optional package. `ARPO_DEBUG=1` shows
the traceback of any of them."""

import errno

# optional package (import name) -> the extra that installs it
OPTIONAL = {"vllm": "vllm", "peft": "train", "tensorboard": "train", "matplotlib": "train", "pyarrow": "train",
            "bm25s": "search", "fastapi": "search", "uvicorn": "search", "httpx": "search", "datasets": "hf",
            "mcp": "mcp", "wandb": None, "trl": "bench"}


class ArpoError(Exception):
    """A problem with the user's input or environment, phrased so they can fix it
    (name the file, line, key or flag, and what to do)."""


def require(ok: bool, key: str, what: str) -> None:
    """Config validation in one line: ArpoError('<key>: <what>') unless ok."""
    if not ok:
        raise ArpoError(f"{key}: {what}")


def explain(e: BaseException) -> str | None:
    """One line for an exception the user can fix, None for a bug (which keeps its traceback)."""
    if isinstance(e, ArpoError):
        return str(e)
    if isinstance(e, ImportError):
        root = (e.name or "").split(".")[0]
        if root in OPTIONAL:
            extra = OPTIONAL[root]
            how = f"pip install 'arpo[{extra}]'" if extra else f"pip install {root}"
            return f"{root} is not installed ({how})"
        if "not installed" in str(e):  # an install hint of our own (engine/vllm.py)
            return str(e)
        return None
    if isinstance(e, OSError) and e.filename is not None:
        what = e.strerror or type(e).__name__
        two = f" -> {e.filename2}" if getattr(e, "filename2", None) else ""
        return f"{e.filename}{two}: {what}"
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):  # a write with no file name on it
        return f"no space left on the device ({e}): free some space, or write to another disk"
    if "No space left on device" in str(e) or "os error 28" in str(e):  # safetensors, torch.save: no errno
        return f"no space left on the device ({e}): free some space, or write to another disk"
    if type(e).__name__ == "SafetensorError" or type(e).__module__.startswith("safetensors"):
        return f"cannot read a .safetensors weights file ({e}): it is corrupt or truncated; copy or save it again"
    return None
