"""The python tool's sandbox: runs model-written code in a pre-forked, namespace-isolated,
one-shot (or, for sessions, forking) interpreter. The tool on top is tools/python.py; the threat
model (what a call reaches, every limit with its default and knob) is docs/sandbox.md.

Design (who runs where)::

    trainer process                         (PythonTool; never runs model code, never forks itself)
      └─ zygote      python -I, minimal env, math/numpy/sympy pre-imported, root, host namespaces
           └─ c1        unshare(pid, mount, net, ipc, uts); forks init; passes init's pidfd up; exits
                └─ init   pid 1 of the new namespaces: private read-only mounts, tmpfs /tmp;
                    │      relays the code, enforces the deadline, reports the exit status
                    └─ runner  rlimits, scrubbed env, own uid, no_new_privs, cwd=/tmp;
                               waits for code on a pipe, runs ONE call, then everything dies

* **Fast.** Forking a zygote that already imported numpy/sympy costs a few ms, against
  ~25 ms for a cold `python -c` (and ~1 s to import sympy). A pool of `pool_size` runners is
  kept ready, so a call only ships code over a pipe and reads the output. Each runner serves
  exactly one call and is then killed; a background thread forks replacements.
* **Nothing outlives a call.** The runner lives in its own PID namespace whose init is a root
  process it cannot signal. When init exits (call done, deadline, parent gone) or is SIGKILLed
  by the trainer through a pidfd (race-free: the pidfd is opened by init's parent), the kernel
  kills every process in the namespace — `setsid`, double forks and fork bombs included.
* **Nothing persists, little is visible.** init builds a minimal root for its mount namespace
  (fsview.py `_minimal_root`): /usr, a few /etc files, the interpreter's own directories (read-only), a
  private /proc, a tiny /dev with a private pty instance, and fresh size-capped tmpfs mounts for
  /tmp (the working directory) and /dev/shm that vanish with the namespace; the host's project
  tree, datasets, home directories and sockets are not in it. The code runs as a uid of its own
  (a block per tool from a persistent counter, one uid per worker) with `no_new_privs`.
* **Bounded memory**: a memory cgroup per call (`memory_mb` + MEMCG_MARGIN_MB) charges heap,
  memfd, shared memory, tmpfs and children alike; a pids cgroup caps processes.
* **A small kernel surface**: a seccomp filter denies keyrings, other processes' memory,
  namespaces and mounts, bpf/perf/io_uring/userfaultfd and the like (seccomp.py SECCOMP_DENY).
* **An unforgeable result**: the runner closes its report pipe before the code runs and reports
  its outcome through its exit status, which init reads with waitpid.
* **No network**: a fresh network namespace with only loopback; no TCP there unless a tool asks (`loopback_tcp`).
* **Bounded**: RLIMIT_AS / CPU / NPROC / FSIZE / NOFILE / CORE, a wall-clock deadline enforced
  both by the trainer and by init, and output read with a byte cap (a flood is stopped, not
  buffered).

Where the machine does not allow namespaces (not root and no unprivileged user namespaces)
the tool degrades to rlimits + process group + temporary directory and warns loudly once;
see `isolation`. Run as root (e.g. in a container with CAP_SYS_ADMIN) or enable
`kernel.unprivileged_userns_clone` / `user.max_user_namespaces` to get full isolation.

Known limits (README, threat model): the kernel is the boundary; without root there are no
cgroups (RLIMIT_AS plus seccomp-denied memfd/shm instead); the hash seed is shared by all workers
of one zygote. `PythonTool.protections` says what this machine allowed.

Modules, one job each. Sandbox side (run in the zygote and its forks; standard library only, since
the zygote loads them from their source text without the `arpo` package: pool.py's bootstrap, ZYGOTE_MODULES):

* protocol.py — the wire protocol: every message between the trainer, the zygote, init and a
                session's processes (letter, fields, descriptors), its encoder and decoder (the
                trainer's modules use it too)
* linux.py    — Linux constants, libc calls (mount, prctl, unshare), reaping and killing children
* fsview.py   — the mount namespace: the minimal root or the host read-only
* netns.py    — the network namespace: loopback up, per-socket buffer caps
* seccomp.py  — the seccomp filter (SECCOMP_DENY) and its probe
* cgroups.py  — tool-wide and per-call memory/pids/cpu cgroups (their margins), the OOM report
* runner.py   — the locked-down process that runs one call's code and reports by its exit status;
                the environment a sandboxed process gets
* session.py  — a session family's init and state processes (tools/python_session.py)
* zygote.py   — the zygote's main loop, the probe, c1 (namespaces) and init (pid 1, the deadline)

Trainer side (never loaded in the zygote):

* limits.py   — `SandboxLimits`: the knobs and their defaults (documented once), resolved into the
                zygote's configuration; the machine-derived defaults
* pool.py     — start the zygote, ask it for workers, keep a pool of ready ones
* capture.py  — `run_with_limits`: a call's output under its deadline and byte cap (both tools)
* result.py   — a call's outcome as the model reads it (the error line, the output cap)
"""
