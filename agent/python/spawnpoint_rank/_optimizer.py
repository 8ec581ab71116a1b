"""Post-import hook for torch.optim.optimizer: every optimizer step counts as a training step
in the rank's progress record (_progress.py), with no change to the trainer.

`patch(optimmod)` is called by the bootstrap (sitecustomize.py) right after
torch.optim.optimizer is first executed; call it only from there. A step is one completed
call of an optimizer's step() (an exception is not a step), so plain loops, GradScaler
(scaler.step calls optimizer.step unless it skips the step) and Lightning's closures
(optimizer.step(closure)) are all counted. A trainer with two optimizers counts two steps
per iteration; spawnpoint.step() replaces the automatic count where that matters.

torch >= 2.0: torch's global register_optimizer_step_post_hook. torch 1.x has no global
hook: each Optimizer subclass's own step() is wrapped once, when the class is defined
(Optimizer.__init_subclass__) or, for classes defined before the hook, right away. A step()
that calls its base class's step() (super().step()) counts once: only the outermost call on
a thread counts.
"""

import functools
import threading

from . import _progress

_depth = threading.local()  # step() calls in progress on this thread (torch 1.x)


def patch(optimmod):
    optimizer_class = getattr(optimmod, "Optimizer", None)
    if optimizer_class is None or getattr(optimizer_class, "_spawnpoint_counted", False):
        return
    optimizer_class._spawnpoint_counted = True
    register = getattr(optimmod, "register_optimizer_step_post_hook", None)
    if register is not None:
        register(_post_hook)
        return
    previous = optimizer_class.__dict__.get("__init_subclass__")

    def __init_subclass__(cls, **kwargs):
        if previous is not None:
            previous.__func__(cls, **kwargs)
        else:
            super(optimizer_class, cls).__init_subclass__(**kwargs)
        _wrap_step(cls)

    optimizer_class.__init_subclass__ = classmethod(__init_subclass__)
    pending = list(optimizer_class.__subclasses__())
    while pending:  # classes defined before the hook ran
        cls = pending.pop()
        _wrap_step(cls)
        pending.extend(cls.__subclasses__())


def _post_hook(optimizer, args, kwargs):
    _progress.count_step(_progress.OPTIMIZER)


def _wrap_step(cls):
    step = cls.__dict__.get("step")
    if step is None or not callable(step) or getattr(step, "_spawnpoint_counted", False):
        return

    @functools.wraps(step)
    def counted_step(*args, **kwargs):
        depth = getattr(_depth, "n", 0)
        _depth.n = depth + 1
        try:
            result = step(*args, **kwargs)
        finally:
            _depth.n = depth
        if depth == 0:
            _progress.count_step(_progress.OPTIMIZER)
        return result

    counted_step._spawnpoint_counted = True
    cls.step = counted_step
