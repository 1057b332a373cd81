"""Reading a run directory's checkpoint layout (written by training/checkpoint.py):

    RUN_DIR/checkpoints/step_000004/state.json   a complete checkpoint (state.json is written last)
    RUN_DIR/checkpoints/latest                    the name of the newest complete one

Below every package that reads runs (models resolves `--model RUN_DIR`, training resumes, view and
serve read them), so none of them has to import the training package to find a checkpoint; and the
atomic write every file of a run directory goes through (write_text_atomic). Also which directory is a
run's (`run_dir_of`) and the one flag that trusts a run's settings (TRUST_FLAG; commands/from_run.py
and chat_templates.py say what it admits)."""

from __future__ import annotations

import os
from pathlib import Path

TRUST_FLAG = "--trust-run-config"


def run_dir_of(model: str) -> Path | None:
    """The run directory of a model spec: RUN_DIR itself, or RUN_DIR/checkpoints/step_N[/model]."""
    p = Path(model).expanduser()
    if not p.is_dir():
        return None
    parts = p.resolve().parts
    d = Path(*parts[: len(parts) - 1 - parts[::-1].index("checkpoints")]) if "checkpoints" in parts else p
    return d if (d / "config.yaml").is_file() or (d / "agent.yaml").is_file() else None


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints (those with state.json), oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    done = [p for p in root.glob("step_*") if p.is_dir() and (p / "state.json").is_file()]
    return sorted(done, key=lambda p: int(p.name.split("_")[1]))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run, or None."""
    root = Path(run_dir) / "checkpoints"
    pointer = root / "latest"
    if pointer.is_file():
        cand = root / pointer.read_text().strip()
        if (cand / "state.json").is_file():
            return cand
    done = list_checkpoints(run_dir)
    return done[-1] if done else None


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable (a directory without read access is skipped)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` so a crash leaves the old file or the new one, never half of each."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:  # a full disk: the old file stays, the half-written copy goes, the error names the file
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(path)) from e
    os.replace(tmp, path)
    fsync_dir(path.parent)
