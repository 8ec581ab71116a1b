"""The private names of torch, multiprocessing, Python and Lightning the rank side relies on
(one list), and the one rule for a hook that finds one missing.

A private name (an underscore attribute, or anything in a private module such as
torch.utils.data._utils) is no promise: a new torch or Lightning may rename it. NAMES lists
every one the rank side reads, patches or overrides, each with the feature it serves;
FEATURES says what each feature is and what happens without it. The list is checked against
real libraries: tests/python/test_private_names.py checks it in the torch and Python it runs
with (Debian's 1.13) and that no source of the rank side uses a private name missing from it;
tests/frameworks/private_names_under_frameworks.py checks it in torch 2.6 and Lightning 2.6
(`python -m spawnpoint_rank._private_audit` checks it anywhere).

The rule. Before a hook relies on a feature, it asks `missing(feature, scope)`, which looks
up all the feature's names it can (a feature works whole or not at all). When one is absent
the feature is off: one line on stderr, once per process,
    spawnpoint-shim: <the feature> is off: torch 2.9.0 has no <name>; <what happens instead>
and the hook takes the feature's fallback (FEATURES[feature].instead says which). A missing
name never raises into the trainer. A multiprocessing child (torch's spawned loader workers)
says nothing: its parent runs the same interpreter and torch and has said it.

Imports nothing beyond the package's _report (the multiprocessing hook uses it in every
process), and _distributed only to tell a multiprocessing child when a name is missing.
Thread-safe.
"""

import sys
import threading
from collections import namedtuple

from ._report import report_once

# what: the feature, as the line names it ("... is off"); instead: what happens without it.
Feature = namedtuple("Feature", "what instead")

FEATURES = {
    "spawn_default": Feature(
        "spawn as multiprocessing's default start method",
        "code that chooses no start method gets multiprocessing's own default (fork on Linux "
        "before Python 3.14), which a process with a GPU context or OpenMP threads does not "
        "survive; DataLoaders with workers still get multiprocessing_context='spawn'"),
    "popen_guard": Feature(
        "the check for multiprocessing children started at the script's unguarded top level",
        "such a child runs the script again, as without the agent, and no line says why"),
    "unguarded_script": Feature(
        "the check for code at the script's unguarded top level that starts processes",
        "spawned children of such a script run it again, as without the agent, and no line "
        "says why"),
    "iterator_hook": Feature(
        "the agent's loader pool and the job's loader workers",
        "every DataLoader keeps the workers the code asked for, on torch's own workers (a "
        "DataLoader given the job's workers could not go back to the main process when its "
        "dataset does not pickle)"),
    "pool": Feature(
        "the agent's loader pool",
        "DataLoaders run on torch's own workers"),
    "key_error_message": Feature(
        "torch's wording of a KeyError raised in a pool worker's dataset",
        "the KeyError's message is shown as a plain KeyError shows it"),
    "lightning": Feature(
        "running Lightning's DDP strategies on the agent's ranks",
        "strategy='ddp' runs on the agent's ranks as it is (TORCHELASTIC_RUN_ID tells Lightning "
        "not to launch), but a strategy that spawns or forks processes of its own (ddp_spawn, "
        "ddp_fork, ddp_notebook) ends the rank with one line when it would start them, and "
        "Trainer(devices, num_nodes) is not checked against the job"),
    "lightning_devices": Feature(
        "the check of Trainer(devices, num_nodes) against the job",
        "a Trainer that contradicts the job is not stopped at its creation (its DDP world "
        "then disagrees with the agent's ranks)"),
    "lightning_auto": Feature(
        "naming strategy='auto' in the agent's Lightning line",
        "the line names the strategy Lightning chose"),
    "lightning_launcher": Feature(
        "running a DDPStrategy that makes its own launcher (a class of its own overriding "
        "_configure_launcher) on the agent's ranks",
        "such a strategy object with start method spawn, fork or forkserver keeps its start "
        "method and its class's launcher, and the rank ends with one line when that launcher "
        "would start its processes; DDPStrategy objects that do not override it are mapped "
        "as before"),
    "lightning_refusal": Feature(
        "refusing the processes of a Lightning strategy the agent cannot map",
        "a strategy that spawns or forks starts a second set of ranks under each of the "
        "agent's"),
    "shim_import": Feature(
        "the bootstrap's cheaper import of module_from_spec",
        "sitecustomize.py takes importlib.util's, the same function (nothing is lost, so "
        "nothing is said)"),
    "launch_fast_exit": Feature(
        "ending a spawnpoint.launch rank whose function raised right after its exit handlers",
        "the rank finalizes as usual (its peers may fail in a collective first, which the agent "
        "waits for: GangOptions::dying_wait)"),
    "notebook_lightning": Feature(
        "running Lightning's process function on the agent's ranks (%load_ext spawnpoint)",
        "notebook.py finds the name missing before it patches anything, says so once, and "
        "Lightning's own launcher runs the strategy"),
    "child_detection": Feature(
        "telling torch's spawned loader workers from ranks before Python 3.10",
        "(no sys.orig_argv there) such a worker takes itself for a rank: it registers the exit "
        "handler and times collectives it never calls"),
}

# Features no hook looks up at run time; the audit checks their names all the same.
#   lightning_refusal: the refusal finds Lightning's frames in start_processes, whatever the
#     launcher is called; the name says where the audit finds that call.
#   shim_import: sitecustomize.py falls back to the same function.
#   child_detection: an absent mark cannot be told from a process that is no child.
#   launch_fast_exit: spawnpoint/_launched.py looks it up itself (getattr) and finalizes
#     as usual without it.
#   notebook_lightning: spawnpoint/notebook.py checks these names (and the caller side's
#     others) in the kernel before it patches Lightning (its _METHODS), and keeps Lightning's
#     own launcher when one is missing; the ranks use only what the kernel found.
AUDIT_ONLY = frozenset(("lightning_refusal", "shim_import", "child_detection",
                        "launch_fast_exit", "notebook_lightning"))

# path: "module:attribute.path", "()" marking an instance of the class before it
# ("torch.utils.data.dataloader:DataLoader()._dataset_kind" is an attribute of every
# DataLoader). mentions: ("module:function", word): the audit also checks that the library's
# own code there still uses `word` (a name torch no longer calls is as good as gone).
# since: (major, minor) of the library before which the name is absent by design, and the
# feature does without it, as that library does.
Name = namedtuple("Name", "path feature mentions since")
Name.__new__.__defaults__ = (None, None)

_DL = "torch.utils.data.dataloader:"
_ITER = _DL + "_BaseDataLoaderIter"
_AC = "lightning.pytorch.trainer.connectors.accelerator_connector:_AcceleratorConnector"

NAMES = (
    # _mp.py: spawn becomes the default start method (an instance attribute of the default
    # context, which multiprocessing/__init__ exports), and children of unguarded lines stop.
    Name("multiprocessing.context:_default_context", "spawn_default",
         ("multiprocessing", "_default_context")),
    Name("multiprocessing.context:DefaultContext()._default_context", "spawn_default",
         ("multiprocessing.context:DefaultContext.get_context", "_default_context")),
    Name("multiprocessing.context:SpawnProcess._Popen", "popen_guard",
         ("multiprocessing.process:BaseProcess.start", "_Popen")),
    Name("multiprocessing.context:ForkServerProcess._Popen", "popen_guard",
         ("multiprocessing.process:BaseProcess.start", "_Popen")),
    # _script.py: the caller's frames.
    Name("sys:_getframe", "unguarded_script"),
    # _dataloader.py: iter() of every DataLoader goes through the hook.
    Name(_DL + "DataLoader._get_iterator", "iterator_hook",
         ("torch.utils.data.dataloader:DataLoader.__iter__", "_get_iterator")),
    # _pool_iter.py: the pool's iterator is torch's _BaseDataLoaderIter with the workers
    # replaced; worker.py (the pool's workers, the rank's interpreter and torch) builds
    # batches as torch's _worker_loop does. The rank checks both before it uses the pool.
    Name(_DL + "_DatasetKind", "pool"),
    Name(_DL + "_DatasetKind.Map", "pool"),
    Name(_DL + "_DatasetKind.create_fetcher", "pool"),
    Name(_DL + "DataLoader()._dataset_kind", "pool"),
    Name(_DL + "DataLoader()._auto_collation", "pool"),
    Name(_ITER, "pool"),
    Name(_ITER + "._reset", "pool", ("torch.utils.data.dataloader:DataLoader.__iter__", "_reset")),
    Name(_ITER + "._next_index", "pool"),
    Name(_ITER + "._next_data", "pool",
         ("torch.utils.data.dataloader:_BaseDataLoaderIter.__next__", "_next_data")),
    Name(_ITER + "()._base_seed", "pool"),
    Name(_ITER + "()._num_workers", "pool"),
    Name(_ITER + "()._dataset", "pool"),
    Name(_ITER + "()._dataset_kind", "pool"),
    Name(_ITER + "()._auto_collation", "pool"),
    Name(_ITER + "()._drop_last", "pool"),
    Name(_ITER + "()._index_sampler", "pool"),
    Name(_ITER + "()._collate_fn", "pool"),
    Name(_ITER + "()._pin_memory", "pool"),
    Name(_ITER + "()._persistent_workers", "pool"),
    Name("torch.utils.data._utils.worker:_worker_info", "pool",
         ("torch.utils.data._utils.worker:get_worker_info", "_worker_info")),
    Name("torch.utils.data._utils.worker:WorkerInfo", "pool"),
    Name("torch.utils.data._utils.worker:HAS_NUMPY", "pool", since=(1, 9)),
    Name("torch.utils.data._utils.worker:_generate_state", "pool", since=(1, 9)),
    Name("torch.utils.data._utils.collate:default_collate", "pool"),
    Name("torch.utils.data._utils.collate:default_convert", "pool"),
    Name("torch.utils.data._utils.pin_memory:pin_memory", "pool"),
    Name("torch._utils:KeyErrorMessage", "key_error_message"),
    # _lightning.py: the strategy is settled in _check_strategy_and_fallback; a DDPStrategy
    # object's start method; and what the refusal relies on when the hook is off: Lightning's
    # own processes start in torch.multiprocessing.start_processes.
    Name(_AC, "lightning"),
    Name(_AC + "._check_strategy_and_fallback", "lightning",
         (_AC + ".__init__", "_check_strategy_and_fallback")),
    Name(_AC + "()._strategy_flag", "lightning"),
    Name("lightning.pytorch.strategies.ddp:DDPStrategy()._start_method", "lightning",
         ("lightning.pytorch.strategies.ddp:DDPStrategy._configure_launcher", "_start_method")),
    Name("lightning.pytorch.strategies.launchers.multiprocessing:_MultiProcessingLauncher.launch",
         "lightning_refusal", ("lightning.pytorch.strategies.launchers.multiprocessing:"
                       "_MultiProcessingLauncher.launch", "start_processes")),
    # A DDPStrategy object whose class overrides _configure_launcher (RF-DETR's ddp_notebook)
    # is given DDPStrategy's own, which the connector calls after _check_strategy_and_fallback.
    Name("lightning.pytorch.strategies.ddp:DDPStrategy._configure_launcher",
         "lightning_launcher", (_AC + "._lazy_init_strategy", "_configure_launcher")),
    Name(_AC + "()._parallel_devices", "lightning_devices"),
    Name(_AC + "()._num_nodes_flag", "lightning_devices"),
    Name(_AC + "._choose_strategy", "lightning_auto", (_AC + ".__init__", "_choose_strategy")),
    # spawnpoint/_notebook_rank.py: Lightning's process function, run on each agent rank.
    Name("lightning.pytorch.strategies.launchers.multiprocessing:"
         "_MultiProcessingLauncher._wrapping_function", "notebook_lightning"),
    Name("lightning.pytorch.strategies.launchers.multiprocessing:"
         "_MultiProcessingLauncher()._strategy", "notebook_lightning",
         ("lightning.pytorch.strategies.launchers.multiprocessing:"
          "_MultiProcessingLauncher.__init__", "_strategy")),
    # spawnpoint/_launched.py: atexit's handlers run before the rank ends without finalizing.
    Name("atexit:_run_exitfuncs", "launch_fast_exit"),
    # sitecustomize.py (never looked up at run time: its fallback is the same function).
    Name("importlib._bootstrap:module_from_spec", "shim_import"),
    # _distributed.multiprocessing_child() before Python 3.10: spawn's _main() marks the
    # process object while it prepares the child (not a class attribute: only mentioned).
    Name("multiprocessing.process:BaseProcess()._inheriting", "child_detection",
         ("multiprocessing.spawn", "_inheriting")),
)

LIGHTNING = "lightning.pytorch"  # the standalone package is pytorch_lightning


def in_package(module, package=None):
    """`module` of lightning.pytorch as the same module of `package` ("pytorch_lightning",
    Lightning's standalone package; None: lightning.pytorch); any other module as it is."""
    if package and (module == LIGHTNING or module.startswith(LIGHTNING + ".")):
        return package + module[len(LIGHTNING):]
    return module


def split(path, package=None):
    """(owner module, [attribute parts], instance owner or None) of a NAMES path, the module
    in_package(`package`); the instance owner keeps the NAMES spelling ("module:Class()")."""
    module, _, attrs = path.partition(":")
    module = in_package(module, package)
    parts = attrs.split(".") if attrs else []
    instance = None
    for index, part in enumerate(parts):
        if part.endswith("()"):
            instance = "%s:%s" % (path.partition(":")[0], ".".join(parts[:index + 1]))
            parts = parts[index + 1:]
            break
    return module, parts, instance


def shown(path, package=None):
    """A NAMES path as the line shows it: module.Class.attribute, "()" for an instance's."""
    module, _, attrs = path.partition(":")
    return in_package(module, package) + ("." + attrs if attrs else "")


def library(module):
    """The library and version a module belongs to, as the line names it ("torch 2.6.0")."""
    root = module.split(".")[0]
    if root == "torch":
        version = getattr(sys.modules.get("torch"), "__version__", None) or getattr(
            sys.modules.get("torch.version"), "__version__", None)  # set while torch imports
        return "torch %s" % (version or "(version unknown)")
    if root in ("lightning", "pytorch_lightning"):
        version = getattr(sys.modules.get(root), "__version__", None)
        return "%s %s" % (root, version or "(version unknown)")
    return "Python %d.%d.%d" % sys.version_info[:3]


def release(module):
    """(major, minor) of the library of `module` (Python's for the standard library), or None."""
    import re

    match = re.match(r"\S+ (\d+)\.(\d+)", library(module))
    return (int(match.group(1)), int(match.group(2))) if match else None


_ABSENT = object()


def resolve(path, scope=None, package=None):
    """The object a NAMES path names, looked up through `scope` ({owner: object}, keyed as
    NAMES spells them: "torch.utils.data.dataloader" or "..._BaseDataLoaderIter()"); a module
    not in `scope` comes from sys.modules, imported if need be. _ABSENT when the name is
    missing; None when `scope` has no instance for an instance's name."""
    scope = scope or {}
    module, parts, instance = split(path, package)
    if instance is not None:
        obj = scope.get(instance)
        if obj is None:
            return None
    else:
        obj = scope.get(split(path)[0])
        if obj is None:
            obj = sys.modules.get(module)
        if obj is None:
            try:
                import importlib

                obj = importlib.import_module(module)
            except Exception:
                return _ABSENT
    for part in parts:
        obj = getattr(obj, part, _ABSENT)
        if obj is _ABSENT:
            return _ABSENT
    return obj


_off = {}  # feature -> the paths found missing in this process (tests and tools read off())
_lock = threading.Lock()


def off():
    """{feature: [paths found missing]} in this process so far."""
    with _lock:
        return {feature: list(paths) for feature, paths in _off.items()}


def missing(feature, scope=None, package=None):
    """The paths of `feature`'s names that are missing, among those that can be looked up now
    (instance names only with their instance in `scope`, keyed like "module:Class()"; module
    names from `scope` or sys.modules); [] when none is. When any is, says once that the
    feature is off (the module docstring). `package`: Lightning's standalone package's name."""
    if feature not in FEATURES or feature in AUDIT_ONLY:
        raise KeyError("no run-time feature %r in spawnpoint_rank._private" % feature)
    lost = []
    for name in NAMES:
        if name.feature != feature:
            continue
        if resolve(name.path, scope, package) is not _ABSENT:
            continue
        module = split(name.path, package)[0]
        if name.since is not None:
            have = release(module)
            if have is not None and have < name.since:
                continue  # absent by design in this version, as the feature expects
        lost.append(name.path)
    if lost:
        with _lock:
            known = _off.setdefault(feature, [])
            known.extend(p for p in lost if p not in known)
        say_off(feature, lost, package)
    return lost


def off_line(feature, paths, package=None):
    """The line that says `feature` is off because `paths` are missing."""
    what, instead = FEATURES[feature]
    module = split(paths[0], package)[0]
    return "%s is off: %s has no %s; %s" % (
        what, library(module), " or ".join(shown(p, package) for p in paths), instead)


def say_off(feature, paths, package=None):
    """Says once (per process, per line) that `feature` is off; not in a multiprocessing child."""
    if _in_multiprocessing_child():
        return
    report_once(off_line(feature, paths, package))


def _in_multiprocessing_child():
    try:
        from ._distributed import multiprocessing_child

        return multiprocessing_child()
    except Exception:
        return False
