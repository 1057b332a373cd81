"""The rules of a run directory (RUN_DIR = run.dir), shared by `arpo train` and `arpo sft`:

* **one writer**: a run holds an exclusive lock on RUN_DIR/.lock (fcntl.flock) for its whole life;
  a second process into the same run dir is refused with the holder's pid. The kernel drops the
  lock when its process dies, so the lock of a crashed or killed run is taken over without help.
* **fresh, resume or overwrite**: a fresh run into a run dir that holds checkpoints is refused;
  `--resume` continues the latest checkpoint; `--overwrite` starts over. `--resume --overwrite`
  together is an error.
* **nothing lost**: everything is validated before the run dir is touched; `--overwrite` moves the
  old checkpoints, metrics and logs into RUN_DIR/.overwritten/ and deletes them only once the new
  run has written its first checkpoint (a new run that fails early leaves the old one recoverable).
  While .overwritten/ holds a run and RUN_DIR has no checkpoint, a plain run and `--resume` are
  refused with the command that restores it (`restore_command`); only `--overwrite` discards it.
* **resume keeps the run's meaning**: the config is compared with the one the run was started
  with; a changed key that changes the training (model, data, optimizer, algorithm, rollout, ...)
  is refused with the list of changes; safe keys (steps, logging, checkpoint cadence, validation,
  threads, memory knobs) may change. config.yaml holds the effective config and every start and
  resume is kept in RUN_DIR/config_history/. `steps` may grow, never drop below the checkpoint's step,
  and the data files must have the content the run started with (RUN_DIR/inputs.json: sha256 each).
* **traceable**: every start and resume appends arpo's commit, whether the source tree had
  uncommitted changes and the package versions to RUN_DIR/provenance.json (arpo/provenance.py).
"""

from __future__ import annotations

import dataclasses
import fcntl
import fnmatch
import hashlib
import json
import os
import shlex
import shutil
import time
from pathlib import Path
from typing import IO

import yaml

from arpo.data.sources import input_paths
from arpo.errors import ArpoError
from arpo.provenance import provenance
from arpo.runs import latest_checkpoint, write_text_atomic
from arpo.settings.web import WebConfig

# run artefacts that belong to one run (moved aside by --overwrite)
RUN_FILES = ("checkpoints", "metrics.jsonl", "errors.log", "tensorboard", "wandb_id", "rollouts", "plots")
# config keys a resumed run may change (dotted; fnmatch patterns): they do not change what is trained
# run.dir: a run copied or moved elsewhere resumes where it now is (its config.yaml still names the old place)
SAFE_ON_RESUME = ("steps", "max_steps", "epochs", "run.dir", "run.save_every", "run.keep_checkpoints", "run.log_every",
                  "run.tensorboard", "run.wandb", "run.threads", "run.save_rollouts", "run.rollout_trees",
                  "validation.*", "micro_tokens", "engine", "engine_options", "engine_options.*", "model.device",
                  "rollout.servers", "tools.cache", "tools.cache_path", "tools.search_url", "tools.web.url",
                  "tools.web.timeout_s", "tools.web.retries", "tools.web.backoff_s", "tools.web.rate_limit",
                  "tools.web.browse_timeout_s", "tools.web.summarizer_url",
                  "memory.*")  # how a step fits in memory (checkpointing, offload, the GPU's size): the same math


# top-level keys renamed since a run may have been saved ({old: new}; settings/sft.py SFTConfig.RENAMED)
RENAMED = {"max_steps": "steps", "batch_size": "prompts_per_step"}


def _new_names(saved: dict, config: dict) -> dict:
    """A saved config with its renamed keys under their new names, where the new config uses those."""
    out = dict(saved)
    for old, new in RENAMED.items():
        if old in out and new not in out and new in config and old not in config:
            out[new] = out.pop(old)
    return out


def _typed_web(saved: dict) -> dict:
    """A config saved before tools.web was typed (issue 64) holds only the web keys its run set: the
    others had their defaults, which a resumed run's whole tools.web now names."""
    tools = saved.get("tools")
    if not (isinstance(tools, dict) and isinstance(tools.get("web"), dict)):
        return saved
    return {**saved, "tools": {**tools, "web": {**dataclasses.asdict(WebConfig()), **tools["web"]}}}


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


# keys whose default became None ("the preset's"), with the value a run saved before meant the same: a
# saved false / 0 was then ignored in favour of the preset's (issue 64 item 2), as None is now
UNSET_ONCE = {"rollout.dynamic_budget": False, "rollout.consecutive_branch_penalty": 0.0}


def config_changes(old: dict, new: dict) -> list[tuple[str, object, object]]:
    """(key, old value, new value) for every dotted key whose value differs (a saved UNSET_ONCE value
    and None do not)."""
    a, b = _flatten(old), _flatten(new)
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)
            and not (k in UNSET_ONCE and b.get(k) is None and a.get(k) == UNSET_ONCE[k])]


def unsafe_changes(old: dict, new: dict) -> list[tuple[str, object, object]]:
    return [c for c in config_changes(old, new) if not any(fnmatch.fnmatch(c[0], p) for p in SAFE_ON_RESUME)]


def restore_command(path: str | Path) -> str:
    """The shell command that puts back the run an interrupted `--overwrite` moved into
    RUN_DIR/.overwritten/ (the interrupted new run's files in RUN_DIR are removed first)."""
    d = shlex.quote(str(path))
    names = " ".join(RUN_FILES + ("config.yaml", INPUTS, PROVENANCE))
    return f"cd {d} && rm -rf {names} && mv .overwritten/* . && rmdir .overwritten"


INPUTS = "inputs.json"  # sha256 of the run's data files: a resume must see the same content
PROVENANCE = "provenance.json"  # per start / resume: arpo's commit, dirty or not, package versions


def input_hashes(config: dict) -> dict[str, str]:
    """{file: sha256} of the local data files a config trains on (data.path, validation.path; a
    built-in name, a glob or a list of files; a Hugging Face dataset has no file and is left out)."""
    specs = []
    for sec in ("data", "validation"):
        p = (config.get(sec) or {}).get("path") if isinstance(config.get(sec), dict) else None
        specs += p if isinstance(p, list) else [p] if p else []
    out = {}
    for f in input_paths(specs):
        if f.is_file():
            h = hashlib.sha256()
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
            out[str(f)] = h.hexdigest()
    return out


class RunDir:
    """One run's claim on its directory. `open()` checks and locks (touching nothing else);
    `begin(config)` writes the config and moves an overwritten run aside; `checkpoint_written()`
    drops the overwritten run once the new one has a checkpoint; `close()` releases the lock.
    `main=False` (non-zero ranks of a distributed run): no locking and no file operations."""

    def __init__(self, path: str | Path, *, resume: bool = False, overwrite: bool = False, main: bool = True,
                 command: str = "train"):
        if resume and overwrite:
            raise ArpoError("--resume and --overwrite contradict each other: --resume continues the run in "
                            f"{path}, --overwrite starts it over; pass one of them")
        self.path, self.resume, self.overwrite, self.main, self.command = Path(path), resume, overwrite, main, command
        self._lock: IO[str] | None = None

    # -- before anything is written ----------------------------------------------------------------
    def open(self) -> RunDir:
        if not self.main:
            return self
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ArpoError(f"run.dir {self.path} cannot be created: {e.strerror}") from e
        if not os.access(self.path, os.W_OK):
            raise ArpoError(f"run.dir {self.path} is not writable")
        f = open(self.path / ".lock", "a+")  # noqa: SIM115 - held for the run's life: close() unlocks and closes it
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise ArpoError(f"run.dir {self.path} is in use by {holder}: one run writes a run dir at a time "
                            "(wait for it, stop it, or choose another run.dir)") from None
        f.seek(0)
        f.truncate()
        f.write(f"arpo {self.command} (pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')})\n")
        f.flush()
        self._lock = f
        old = latest_checkpoint(self.path)
        aside = self.path / ".overwritten"
        if aside.is_dir() and any(aside.iterdir()) and not self.overwrite and old is None:
            # an --overwrite was interrupted before its first checkpoint: the old run is only in .overwritten/
            self.close()
            raise ArpoError(f"{aside} holds the run an interrupted --overwrite moved aside "
                            f"({', '.join(sorted(p.name for p in aside.iterdir()))}); a "
                            f"{'resumed' if self.resume else 'new'} run here would delete it. Restore it with:\n"
                            f"  {restore_command(self.path)}\nthen --resume it; or pass --overwrite to discard it")
        if self.resume and old is None:
            self.close()
            raise ArpoError(f"--resume: no checkpoint in {self.path}/checkpoints")
        if not self.resume and old is not None and not self.overwrite:
            self.close()
            raise ArpoError(f"run.dir {self.path} already holds checkpoints (latest: {old.name}): pass --resume "
                            "to continue that run, --overwrite to start over, or choose another run.dir")
        return self

    @property
    def checkpoint(self) -> Path | None:
        """The checkpoint a resumed run continues from (every rank reads it)."""
        return latest_checkpoint(self.path) if self.resume else None

    def check_resume_config(self, config: dict) -> None:
        """On --resume: refuse config changes that would change what the run trains."""
        saved = self.path / "config.yaml"
        if not (self.resume and self.main and saved.is_file()):
            return
        try:
            old = yaml.safe_load(saved.read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ArpoError(f"{saved}: cannot read the run's saved config ({e})") from e
        old = _typed_web(_new_names(old, config))
        bad = unsafe_changes(old, config)
        ckpt = self.checkpoint
        done = int(ckpt.name.rpartition("_")[2]) if ckpt is not None and ckpt.name.rpartition("_")[2].isdigit() else 0
        total = config.get("steps", config.get("max_steps"))
        if isinstance(total, int) and total < done:
            self.close()
            raise ArpoError(f"--resume with steps={total}: the run in {self.path} is already at step {done}; give "
                            f"steps > {done} to train further, or leave steps out to keep the run's "
                            f"{old.get('steps', old.get('max_steps'))}")
        changed = [f for f, h in input_hashes(config).items() if self._saved_inputs().get(f, h) != h]
        if changed:
            self.close()
            raise ArpoError(f"--resume: the content of {', '.join(changed)} changed since the run started "
                            f"({self.path / INPUTS} has the hashes it trained on); a resumed run must see the same "
                            "data: restore the file, or start a new run (another run.dir, or --overwrite)")
        if bad:
            lines = "\n".join(f"  {k}: {a!r} -> {b!r}" for k, a, b in bad)
            self.close()
            raise ArpoError(f"--resume with a config that changes the run ({saved}):\n{lines}\n"
                            f"only these may change on resume: {', '.join(SAFE_ON_RESUME)}; start a new run "
                            "(another run.dir, or --overwrite) to train with the new settings")

    # -- the run starts ----------------------------------------------------------------------------
    def begin(self, config: dict) -> None:
        """Write config.yaml (the effective config) and its history entry; with --overwrite, move the
        old run's files into .overwritten/ (deleted at the new run's first checkpoint)."""
        if not self.main:
            return
        if self.overwrite and not self.resume:
            aside = self.path / ".overwritten"
            moving = [n for n in RUN_FILES if (self.path / n).exists()]
            if moving:
                if aside.exists():  # an earlier --overwrite never reached its checkpoint: keep the older run
                    for name in moving:
                        p = self.path / name
                        shutil.rmtree(p) if p.is_dir() else p.unlink()
                else:
                    aside.mkdir()
                    # the old run's config and data hashes go with it (restore)
                    moving += [n for n in ("config.yaml", INPUTS, PROVENANCE) if (self.path / n).is_file()]
                    for name in moving:
                        os.replace(self.path / name, aside / name)
        text = yaml.safe_dump(config, sort_keys=False)

        write_text_atomic(self.path / "config.yaml", text)
        if not self.resume or not (self.path / INPUTS).is_file():
            write_text_atomic(self.path / INPUTS, json.dumps(input_hashes(config), indent=1) + "\n")
        hist = self.path / "config_history"
        hist.mkdir(exist_ok=True)
        n = len(list(hist.glob("*.yaml"))) + 1
        kind = "resume" if self.resume else "start"
        write_text_atomic(hist / f"{n:03d}_{kind}_{time.strftime('%Y%m%d-%H%M%S')}.yaml", text)
        self._record_provenance(kind)

    def _record_provenance(self, kind: str) -> None:
        """RUN_DIR/provenance.json: one entry per start and resume (arpo's commit, whether its tree was
        dirty, the package versions), so a checkpoint can be traced to the code that trained it."""
        path = self.path / PROVENANCE
        try:
            runs = json.loads(path.read_text()) if path.is_file() and (self.resume or not self.overwrite) else []
        except ValueError:
            runs = []
        runs = runs if isinstance(runs, list) else []
        runs.append({"kind": kind, **provenance()})
        write_text_atomic(path, json.dumps(runs, indent=1) + "\n")

    def _saved_inputs(self) -> dict:
        try:
            return json.loads((self.path / INPUTS).read_text())
        except (OSError, ValueError):
            return {}  # a run from before inputs.json: nothing to compare

    def checkpoint_written(self) -> None:
        if self.main:
            shutil.rmtree(self.path / ".overwritten", ignore_errors=True)

    def close(self) -> None:
        if self._lock is not None:
            try:
                fcntl.flock(self._lock, fcntl.LOCK_UN)
            finally:
                self._lock.close()
                self._lock = None

    def __enter__(self) -> RunDir:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()
