"""Reading a run directory's checkpoint layout (written by training/checkpoint.py):

    RUN_DIR/checkpoints/step_000004/state.json   a complete checkpoint (state.json is written last)
    RUN_DIR/checkpoints/latest                    the name of the newest complete one

Below every package that reads runs (models resolves `--model RUN_DIR`, training resumes, view and
serve read them), so none of them has to import the training package to find a checkpoint."""

from __future__ import annotations

from pathlib import Path


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
