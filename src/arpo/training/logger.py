"""Metrics: one JSON line per step in RUN_DIR/metrics.jsonl, mirrored to tensorboard and, when
asked (`run.wandb: PROJECT`), to Weights & Biases (optional: `pip install wandb`; offline with
WANDB_MODE=offline). The wandb run id is kept in RUN_DIR/wandb_id, so a resumed run continues the
same wandb run. `run.trackio: PROJECT` mirrors them to trackio (`pip install 'arpo[envs]'`; local-first:
its own store under $TRACKIO_DIR, `trackio show` to browse); the trackio run is named after the run dir
and a resumed run continues it.

Every line is flushed when written. On resume from step k the file is first cut back to the lines
with step <= k (atomically), so a resumed run's log reads exactly like an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from arpo.errors import ArpoError
from arpo.runs import write_text_atomic


def read_metrics(path: str | Path) -> list[dict]:
    p = Path(path)
    if p.is_dir():
        p = p / "metrics.jsonl"
    if not p.is_file():
        return []
    rows = []
    for line in p.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a crash
                continue
    return rows


class MetricsLogger:
    def __init__(self, run_dir: str | Path, resume_step: int | None = None, tensorboard: bool = True,
                 enabled: bool = True, wandb_project: str | None = None, config: dict | None = None):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.jsonl"
        self.enabled = enabled
        self._tb = None
        self._wandb = None
        self._trackio = None
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if resume_step is not None:
            kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
            write_text_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        elif self.path.exists():
            self.path.unlink()
        self._f = open(self.path, "a")  # noqa: SIM115 - held for the run, closed by close()
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=resume_step + 1
                                         if resume_step is not None else None)
            except Exception:  # noqa: BLE001 - no tensorboard: the JSONL log is the source of truth
                self._tb = None
        if wandb_project:
            self._wandb = _start_wandb(self.run_dir, wandb_project, config, resume_step is not None)
        trackio_project = ((config or {}).get("run") or {}).get("trackio")  # run.trackio of the saved config
        if trackio_project:
            self._trackio = _start_trackio(self.run_dir, trackio_project, config, resume_step is not None)

    def log(self, step: int, metrics: dict, prefix: str = "") -> None:
        if not self.enabled:
            return
        row = {"step": step, **{f"{prefix}{k}": v for k, v in metrics.items()}}
        self._f.write(json.dumps(row, default=float) + "\n")
        self._f.flush()
        if self._tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step, walltime=time.time())
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float))}, step=step)
        if self._trackio is not None:
            self._trackio.log({k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float))
                               and not isinstance(v, bool) and math.isfinite(v)}, step=step)

    def close(self) -> None:
        if not self.enabled:
            return
        self._f.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._trackio is not None:
            self._trackio.finish()


def _start_wandb(run_dir: Path, project: str, config: dict | None, resuming: bool):
    try:
        import wandb
    except ImportError as e:
        raise ArpoError("run.wandb is set but wandb is not installed: `pip install wandb` "
                        "(or set run.wandb: null)") from e
    id_file = run_dir / "wandb_id"
    run_id = id_file.read_text().strip() if resuming and id_file.is_file() else None
    run_id = run_id or wandb.util.generate_id()
    write_text_atomic(id_file, run_id + "\n")
    return wandb.init(project=project, id=run_id, resume="allow", dir=str(run_dir), name=run_dir.name,
                      config=config or {})


def _start_trackio(run_dir: Path, project: str, config: dict | None, resuming: bool):
    try:
        import trackio  # noqa: PLC0415 - optional extra, loaded only when asked for
    except ImportError as e:
        raise ArpoError("run.trackio is set but trackio is not installed: `pip install 'arpo[envs]'` "
                        "(or set run.trackio: null)") from e
    return trackio.init(project=project, name=run_dir.name, config=config or {},
                        resume="allow" if resuming else "never", embed=False)
