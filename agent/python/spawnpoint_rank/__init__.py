"""spawnpoint's rank side: what runs inside a Python rank started by spawnpoint-agent.

Ask `spawnpoint_rank.current()` what this process is: a frozen RankEnv (rank, world size,
the job's loader settings), or None outside an agent-started rank. The rest is run by the
start-up shim (sitecustomize.py beside this package), never by the trainer:
  env.py          RankEnv, parsed once from the environment, and current()
  policy.py       the decisions, pure functions: loader_defaults, libuv_decision
  _mp.py          hook: spawn becomes multiprocessing's default start method
  _dataloader.py  hook: the job's defaults for every torch DataLoader
  _distributed.py hook: USE_LIBUV=0 where torch lacks libuv; registers _exit's handler
  _exit.py        at exit, the process group's threads finish before the interpreter does
  _optimizer.py   hook: each optimizer step counts as a training step (_progress.py)
  _mp_spawn.py    hook: a script's own torch.multiprocessing.spawn of its ranks runs each as
                  one of the agent's ranks, on the agent's rendezvous
  _progress.py    the rank's writer of its progress record; spawnpoint.step() calls it
  _report.py      one stderr line per problem; warnings at the trainer's line
  _private.py     every private name of torch, multiprocessing and Lightning the hooks rely
                  on, and the rule when one is missing: said once, the feature falls back
  _private_audit.py  checks those names in this interpreter's libraries (tests, tools)
The Python loader worker, run by a pool owner (`python -m spawnpoint_rank.worker`), never
inside a rank:
  worker.py       the worker half of agent/loader/protocol.h for pickled Python datasets
  _batch_codec.py a collated batch as slot fields plus a JSON tree

Loads on CPython 3.9-3.13 and torch 1.7-2.x; torch is never imported here (the hooks get
the modules torch itself imported). This module imports nothing until asked: the
multiprocessing hook runs in every process, loader workers included.
"""

__all__ = ["RankEnv", "current"]


def __getattr__(name):  # PEP 562: env.py (and dataclasses) only when asked for
    if name in __all__:
        from . import env

        return getattr(env, name)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
