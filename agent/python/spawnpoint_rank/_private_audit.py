"""Checks every private name the rank side relies on (_private.NAMES) in this interpreter's
torch, multiprocessing and Lightning, so that a new torch's rename fails a test, not a job.

    python -m spawnpoint_rank._private_audit [--require-lightning]

For each name: it must exist (an instance's attribute on a real instance: a DataLoader, its
iterator, the default multiprocessing context, Lightning's connector and DDPStrategy); where
NAMES gives a mention, the library's own code there must still use it (a method torch no
longer calls is as good as gone); a name absent before its `since` version counts as
present. Lightning's names are checked in each of lightning.pytorch and pytorch_lightning
that imports here; none importing is not a pass: `audit()` lists those names as unchecked,
and --require-lightning makes that a failure. One line per name; exit status 1 when a name
is missing or a required one was not checked, 0 otherwise.

Imports torch (and Lightning); never run by a rank. Not thread-safe (it builds objects).
"""

import importlib
import inspect
import sys

from . import _private

_LIGHTNING_PACKAGES = (None, "pytorch_lightning")  # None: lightning.pytorch


def _instances(package):
    """{instance owner, as NAMES spells it: a function making one}."""
    def dataloader():
        from torch.utils.data import DataLoader

        return DataLoader(list(range(4)), batch_size=2)

    def iterator():
        dlmod = importlib.import_module("torch.utils.data.dataloader")
        it = iter(dataloader())  # torch's single-process iterator, a _BaseDataLoaderIter
        base = getattr(dlmod, "_BaseDataLoaderIter", None)
        if base is None or not isinstance(it, base):
            raise TypeError("iter(DataLoader) is a %s, not a _BaseDataLoaderIter" % type(it))
        return it

    def lightning(module, name, **kwargs):
        def make():
            owner = importlib.import_module(_private.in_package(module, package))
            return getattr(owner, name)(**kwargs)
        return make

    return {
        "multiprocessing.context:DefaultContext()":
            lambda: importlib.import_module("multiprocessing.context")._default_context,
        "torch.utils.data.dataloader:DataLoader()": dataloader,
        "torch.utils.data.dataloader:_BaseDataLoaderIter()": iterator,
        _private.LIGHTNING + ".trainer.connectors.accelerator_connector:_AcceleratorConnector()":
            lightning(_private.LIGHTNING + ".trainer.connectors.accelerator_connector",
                      "_AcceleratorConnector", accelerator="cpu", devices=1),
        _private.LIGHTNING + ".strategies.ddp:DDPStrategy()":
            lightning(_private.LIGHTNING + ".strategies.ddp", "DDPStrategy"),
    }


def _is_lightning(path):
    module = path.partition(":")[0]
    return module == _private.LIGHTNING or module.startswith(_private.LIGHTNING + ".")


def lightning_packages():
    """The Lightning packages that import here: None for lightning.pytorch, and/or
    "pytorch_lightning"."""
    found = []
    for package in _LIGHTNING_PACKAGES:
        try:
            importlib.import_module(package or _private.LIGHTNING)
            found.append(package)
        except Exception:
            pass
    return found


def check(name, package=None, made=None):
    """None when `name` (a _private.Name) holds here, else what is wrong. `made` caches the
    instances built ({owner: object or the exception making it raised})."""
    made = {} if made is None else made
    module, _, instance = _private.split(name.path, package)
    scope = {}
    if instance is not None:
        factory = _instances(package).get(instance)
        if factory is None:
            if name.mentions is None:
                return "no way to make a %s here, and no mention to check" % instance
        else:
            key = (instance, package)
            if key not in made:
                try:
                    made[key] = factory()
                except Exception as err:
                    made[key] = err
            if isinstance(made[key], Exception):
                return "cannot make a %s (%s: %s)" % (instance, type(made[key]).__name__,
                                                     made[key])
            scope[instance] = made[key]
    if instance is None or scope:
        found = _private.resolve(name.path, scope, package)
        if found is _private._ABSENT:
            have = _private.release(module)
            if name.since is None or have is None or have >= name.since:
                return "missing"
    if name.mentions is not None:
        where, word = name.mentions
        target = _private.resolve(where, None, package)
        if target is _private._ABSENT or target is None:
            return "%s, where it is used, is missing" % _private.shown(where, package)
        try:
            source = inspect.getsource(target)
        except (OSError, TypeError) as err:
            return "cannot read the source of %s (%s)" % (_private.shown(where, package), err)
        if word not in source:
            return "%s no longer uses %s" % (_private.shown(where, package), word)
    return None


def audit(require_lightning=False):
    """(lines, failed): one line per name and package checked, and whether any failed."""
    lines, failed = [], False
    packages = lightning_packages()
    made = {}
    for name in _private.NAMES:
        for package in (packages if _is_lightning(name.path) else [None]):
            problem = check(name, package, made)
            module = _private.split(name.path, package)[0]
            lines.append("%s %s (%s, feature %s)%s" % (
                "ok     " if problem is None else "MISSING", _private.shown(name.path, package),
                _private.library(module), name.feature, "" if problem is None else ": " + problem))
            failed = failed or problem is not None
        if _is_lightning(name.path) and not packages:
            lines.append("unchecked %s: no Lightning imports here (tests/frameworks/"
                         "private_names_under_frameworks.py checks it in Lightning 2.6)"
                         % _private.shown(name.path))
            failed = failed or require_lightning
    return lines, failed


def main(argv):
    lines, failed = audit(require_lightning="--require-lightning" in argv)
    for line in lines:
        print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
