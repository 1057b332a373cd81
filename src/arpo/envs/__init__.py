"""Bring your own environment (docs/environments.md): tasks, actions and rewards from outside arpo,
trained with the same agent loop, branch rules and reward stage as the built-in tools.

    base.py           the contract: an Environment opens Episodes; reset(task) -> the first observation,
                      step(action) -> observation, optional reward, done; optional snapshot/restore
    spec.py           `env:module.path:Class` and `openenv:URL|module:app` specs -> an Environment; the
                      data rows an environment's resets give (data/sources.py reads them)
    openenv.py        OpenEnv servers (openenv-core) over their own protocol, at a URL or started here
    reasoning_gym.py  `rg:NAME` data specs and reasoning-gym's own score_answer as the reward
    verifiers.py      `vf:TASKSET` verifiers environments: tasks, tools and rubric from a worker process
                      (verifiers_worker.py) run by verifiers' own venv (scripts/install_verifiers.sh)

tools/plugins/env.py makes an environment a tool with sessions: an action is a call, the observation its
result, the rewards ride on the call records; a fork replays the actions or restores a snapshot.
"""
