"""The private names of torch, multiprocessing and Lightning the rank side relies on
(spawnpoint_rank/_private.py), and its rule when one is missing. Run through
run_shim_tests.py (ctest).

PrivateNamesTest (torch): every name of _private.NAMES holds in this interpreter's torch and
Python (Debian's 1.13; Lightning's names are checked by tests/frameworks/
private_names_under_frameworks.py in Lightning 2.6, which this test makes sure exists), and
no source of the rank side uses a private name the list lacks.
MissingNameTest (no torch: fakes) and PoolMissingNameTest (torch): each name taken away in
turn, as a torch or Lightning that renamed it would look to the rank side: the hook says once
which feature is off, the feature falls back, and the trainer goes on.
"""

import ast
import contextlib
import io
import multiprocessing
import multiprocessing.context
import os
import re
import sys
import types
import unittest
from unittest import mock

from test_rank_side import SHIM_DIR, SOURCE_DIR  # and spawnpoint_rank, from SHIM_DIR

from spawnpoint_rank import (_dataloader, _distributed, _lightning, _mp,  # noqa: E402,F401
                             _pool, _pool_iter, _private, _report, _script)

# Underscore names of the standard library that are documented API, not private.
DOCUMENTED = {
    "_exit": "os._exit, documented in the os module's reference",
    "_fields": "a namedtuple's documented field names",
    "_find_unused_parameters_": "part of Lightning's public strategy names, not an attribute",
}
# Classes of the rank side built on a library's class (found in the sources by the scan): a
# private method defined there that the base also has is an override, a name the base's own
# code calls, and must be listed.
LIBRARY_BASES = {"_PoolDataLoaderIter": "torch.utils.data.dataloader:_BaseDataLoaderIter"}


# The spawnpoint package's caller side: it runs in the user's own process (a notebook's
# kernel), never under the shim. notebook.py looks up every private name it needs there before
# it patches Lightning and keeps Lightning's own launcher when one is missing, said once (its
# _METHODS); launcher.py's (cloudpickle's _code_reduce, IPython's cell map) are getattr()s with
# a fallback (tracebacks without the cells' source lines).
CALLER_SIDE = ("launcher.py", "notebook.py")


def rank_side_sources():
    """{path: source} of everything the shim runs: sitecustomize.py and both packages, but the
    list itself and its audit (their names are the list) and the caller side (CALLER_SIDE)."""
    files = [os.path.join(SHIM_DIR, "sitecustomize.py")]
    for package in ("spawnpoint_rank", "spawnpoint"):
        folder = os.path.join(SHIM_DIR, package)
        files += sorted(os.path.join(folder, f) for f in os.listdir(folder)
                        if f.endswith(".py") and f not in ("_private.py", "_private_audit.py")
                        and not (package == "spawnpoint" and f in CALLER_SIDE))
    sources = {}
    for path in files:
        with open(path) as f:
            sources[path] = f.read()
    return sources


_PRIVATE = re.compile(r"^_[A-Za-z]\w*$")
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.\w+)+$")
_OUR_PACKAGES = ("spawnpoint_rank", "spawnpoint")


def _dunder(name):
    return name.startswith("__") and name.endswith("__")


def _private_module(name):
    parts = name.split(".")
    return (parts[0] not in _OUR_PACKAGES
            and any(p.startswith("_") and not _dunder(p) for p in parts))


class _Scan(ast.NodeVisitor):
    """One source's uses of names (see private_uses), given what the sources define."""

    def __init__(self, path, ours, own_modules, library_based, use):
        self.path, self.ours, self.own_modules = path, ours, own_modules
        self.library_based, self.use = library_based, use
        self.stack = []  # enclosing ClassDef and FunctionDef nodes

    def generic_visit(self, node):
        self.stack.append(node)
        ast.NodeVisitor.generic_visit(self, node)
        self.stack.pop()

    def visit_ClassDef(self, node):
        self.generic_visit(node)

    def visit_FunctionDef(self, node):
        self.generic_visit(node)

    def method_of(self):
        """The class whose method the innermost function is, or None (a plain or nested
        function: its `self` may be any library's object, e.g. a wrapper set on its class)."""
        for index in range(len(self.stack) - 1, -1, -1):
            if isinstance(self.stack[index], ast.FunctionDef):
                parent = self.stack[index - 1] if index else None
                return parent if isinstance(parent, ast.ClassDef) else None
        return None

    def visit_Attribute(self, node):
        name = node.attr
        if _PRIVATE.match(name) and not _dunder(name) and not name.startswith("_spawnpoint"):
            on_self = isinstance(node.value, ast.Name) and node.value.id == "self"
            cls = self.method_of() if on_self else None
            if cls is not None and cls.name in self.library_based:
                if name not in self.library_based[cls.name]:  # inherited from the library
                    self.use(name, self.path, node)
            elif cls is not None:
                pass  # our own class's attribute
            elif name not in self.ours:
                self.use(name, self.path, node)
        self.generic_visit(node)

    def visit_Constant(self, node):
        text = node.value
        if isinstance(text, str):
            if (_PRIVATE.match(text) and not _dunder(text) and not text.startswith("_spawnpoint")
                    and text not in self.ours and text not in self.own_modules):
                self.use(text, self.path, node)
            elif _DOTTED.match(text) and _private_module(text):
                self.use(text, self.path, node)

    def visit_ImportFrom(self, node):
        if node.level == 0 and node.module and _private_module(node.module):
            self.use(node.module, self.path, node)

    def visit_Import(self, node):
        for alias in node.names:
            if _private_module(alias.name):
                self.use(alias.name, self.path, node)


def private_uses(sources):
    """({name: ["file:line", ...]}, {class: [private methods]}): the private names of other
    code the sources use: attributes (`x._name` the sources do not define, `getattr(x,
    "_name")`, `self._name` in a function that is no method of the sources' own classes, or
    that a class built on a library's class inherits) and private modules
    ("torch.utils.data._utils"); and the private methods of each class built on a class the
    sources do not define (overrides, perhaps)."""
    import builtins

    trees = {path: ast.parse(text, path) for path, text in sources.items()}
    own_modules = {os.path.splitext(os.path.basename(p))[0] for p in sources}
    classes = {n.name for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.ClassDef)}
    ours = set(classes)  # names the sources define: module-level, and our classes' members
    library_based = {}  # class built on a library's class -> the names it defines itself
    methods = {}
    for tree in trees.values():
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                ours.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                ours.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [b.id if isinstance(b, ast.Name) else None for b in node.bases]
            if any(b is None or (b not in classes and not hasattr(builtins, b)) for b in bases):
                defined = {n.name for n in ast.walk(node) if isinstance(n, ast.FunctionDef)}
                defined |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
                            and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name)
                            and n.value.id == "self"}
                library_based[node.name] = defined
                methods[node.name] = sorted(n.name for n in node.body
                                            if isinstance(n, ast.FunctionDef)
                                            and _PRIVATE.match(n.name) and not _dunder(n.name))
                continue
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.ClassDef)):
                    ours.add(item.name)
                elif isinstance(item, ast.Assign):
                    ours.update(t.id for t in item.targets if isinstance(t, ast.Name))
                if isinstance(item, ast.FunctionDef):  # what our methods set on self
                    ours.update(n.attr for n in ast.walk(item) if isinstance(n, ast.Attribute)
                                and isinstance(n.ctx, ast.Store)
                                and isinstance(n.value, ast.Name) and n.value.id == "self")
    uses = {}

    def use(name, path, node):
        uses.setdefault(name, []).append("%s:%d" % (os.path.basename(path), node.lineno))

    for path, tree in trees.items():
        _Scan(path, ours, own_modules, library_based, use).visit(tree)
    return uses, methods


def listed():
    """(private attribute names, module names) that _private.NAMES covers."""
    attributes, modules = set(), set()
    for name in _private.NAMES:
        module, _, attrs = name.path.partition(":")
        modules.add(module)
        attributes.update(p.rstrip("()") for p in attrs.split(".") if p)
    return attributes, modules


def unlisted(uses):
    """The uses of private names that _private.NAMES (or DOCUMENTED) does not cover."""
    attributes, modules = listed()
    out = {}
    for name, where in uses.items():
        if "." in name:
            if not any(m == name or m.startswith(name + ".") for m in modules):
                out[name] = where
        elif name not in attributes and name not in DOCUMENTED:
            out[name] = where
    return out


@contextlib.contextmanager
def modules_replaced(replacements):
    """sys.modules with `replacements` ({name: module}) for a while; only those keys are put
    back after (mock.patch.dict would drop every module imported meanwhile)."""
    saved = {name: sys.modules.get(name) for name in replacements}
    sys.modules.update(replacements)
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


@contextlib.contextmanager
def said():
    """Captures stderr; yields a list that holds the 'spawnpoint-shim:' lines afterwards. The
    rank side's 'once' memory is cleared first, so each case starts as a fresh process."""
    _report._reported.clear()
    _private._off.clear()
    err = io.StringIO()
    lines = []
    with mock.patch.object(sys, "stderr", err):
        yield lines
    lines.extend(l for l in err.getvalue().splitlines() if l.startswith("spawnpoint-shim:"))


def off_lines(lines, path):
    """The lines among `lines` that say a feature is off because `path` is missing."""
    return [l for l in lines if " is off: " in l and " has no " in l
            and _private.shown(path) in l]


class Hidden(object):
    """A class attribute that is not there: getattr raises AttributeError (a renamed name)."""

    def __get__(self, obj, owner):
        raise AttributeError("renamed")


def copy_module(module, **changes):
    """A stand-in for `module`: its attributes, with `changes` (a value of None removes one)."""
    proxy = types.ModuleType(module.__name__)
    proxy.__dict__.update({k: v for k, v in vars(module).items() if k != "__name__"})
    for key, value in changes.items():
        if value is None:
            proxy.__dict__.pop(key, None)
        else:
            setattr(proxy, key, value)
    return proxy


class PrivateNamesTest(unittest.TestCase):
    """The list against this interpreter's libraries, and the sources against the list."""

    def test_every_name_holds_in_this_torch_and_python(self):
        from spawnpoint_rank import _private_audit

        lines, failed = _private_audit.audit()
        print("\n".join(lines))
        self.assertFalse([l for l in lines if l.startswith("MISSING")], "\n".join(lines))
        self.assertFalse(failed)
        lightning = [n for n in _private.NAMES if _private_audit._is_lightning(n.path)]
        self.assertTrue(lightning)
        if _private_audit.lightning_packages():
            return  # checked above, in the Lightning that imports here
        # No Lightning here: an explicit division, not a silent skip. Each Lightning name is
        # listed as unchecked, and the frameworks test that checks them in Lightning 2.6 is
        # registered with ctest and demands Lightning.
        unchecked = [l for l in lines if l.startswith("unchecked ")]
        self.assertEqual(len(unchecked), len(lightning), "\n".join(lines))
        frameworks = os.path.join(SOURCE_DIR, "tests", "frameworks")
        with open(os.path.join(frameworks, "CMakeLists.txt")) as f:
            registered = re.search(r"^spawnpoint_frameworks_test\(\s*\w+\s+"
                                   r"private_names_under_frameworks\.py", f.read(), re.M)
        self.assertTrue(registered, "tests/frameworks/CMakeLists.txt does not run "
                                    "private_names_under_frameworks.py")
        with open(os.path.join(frameworks, "private_names_under_frameworks.py")) as f:
            self.assertIn("audit(require_lightning=True)", f.read())
        print("Lightning's %d names are not checked here (%s has no Lightning): "
              "frameworks_private_names checks them in the frameworks environment's "
              "Lightning 2.6" % (len(lightning), sys.executable))

    def test_the_audit_finds_a_renamed_name_and_a_call_torch_no_longer_makes(self):
        from torch.utils.data import dataloader

        from spawnpoint_rank import _private_audit

        original = dataloader.DataLoader.__dict__["_get_iterator"]
        del dataloader.DataLoader._get_iterator
        try:
            lines, failed = _private_audit.audit()
        finally:
            dataloader.DataLoader._get_iterator = original
        self.assertTrue(failed)
        self.assertIn("MISSING torch.utils.data.dataloader.DataLoader._get_iterator",
                      "\n".join(lines))
        name = next(n for n in _private.NAMES if n.path.endswith("._next_data"))
        with mock.patch.object(dataloader._BaseDataLoaderIter, "__next__",
                               lambda self: self._fetch_next()):
            problem = _private_audit.check(name)
        self.assertIn("_BaseDataLoaderIter.__next__ no longer uses _next_data", problem or "")

    def test_the_sources_use_no_private_name_the_list_lacks(self):
        uses, _ = private_uses(rank_side_sources())
        self.assertTrue(uses)  # the scan finds what it should (see the next test)
        self.assertEqual(unlisted(uses), {}, "private names the rank side uses that "
                         "spawnpoint_rank/_private.py NAMES does not list")
        # No entry goes stale: each run-time name's private part is still used somewhere.
        attributes = set(uses) | {m for m in uses if "." in m}
        for name in _private.NAMES:
            if name.feature in _private.AUDIT_ONLY:
                continue
            module, _, attrs = name.path.partition(":")
            parts = [p.rstrip("()") for p in attrs.split(".") if p.startswith("_")]
            self.assertTrue(any(p in attributes for p in parts) or any(
                m == module or module.startswith(m + ".") for m in attributes if "." in m),
                "%s is listed but no source uses it" % name.path)

    def test_the_scan_finds_a_new_private_name(self):
        source = ("import sys\nfrom torch.utils.data._utils import fetch\n"
                  "def f(loader):\n    return loader._sampler_iter, getattr(loader, '_iterator')\n"
                  "class It(sys.modules['x'].Base):\n"
                  "    def _next_data(self):\n        return self._num_yielded\n")
        uses, methods = private_uses({"/x/new.py": source})
        self.assertEqual(sorted(unlisted(uses)), ["_iterator", "_num_yielded", "_sampler_iter"])
        self.assertIn("torch.utils.data._utils", uses)  # listed: its modules are
        self.assertEqual(methods, {"It": ["_next_data"]})

    def test_overrides_of_library_classes_are_listed(self):
        import importlib

        _, methods = private_uses(rank_side_sources())
        self.assertEqual(set(methods), set(LIBRARY_BASES),
                         "a class of the rank side built on a library class: add it to "
                         "LIBRARY_BASES so that its overrides are checked")
        paths = {n.path for n in _private.NAMES}
        for cls, base_path in LIBRARY_BASES.items():
            module, _, qualname = base_path.partition(":")
            base = getattr(importlib.import_module(module), qualname)
            for method in methods[cls]:
                if hasattr(base, method):
                    self.assertIn("%s.%s" % (base_path, method), paths,
                                  "%s.%s overrides torch's: list it" % (cls, method))


class MissingNameTest(unittest.TestCase):
    """Each run-time name but the pool's taken away in turn, on fakes of the libraries."""

    def setUp(self):
        self.refusal_forgotten()

    @staticmethod
    def refusal_forgotten():
        """Each case starts as a fresh process: Lightning's refusal not in place yet."""
        refusing = getattr(_lightning, "_refusing", None)
        if refusing is not None:
            refusing.clear()

    def test_each_name_in_turn(self):
        scenarios = {"spawn_default": self.mp_case, "popen_guard": self.mp_case,
                     "unguarded_script": self.script_case, "iterator_hook": self.iterator_case,
                     "key_error_message": self.key_error_case, "lightning": self.lightning_case,
                     "lightning_devices": self.lightning_case,
                     "lightning_auto": self.lightning_case,
                     "lightning_launcher": self.lightning_launcher_case}
        features = set(_private.FEATURES) - _private.AUDIT_ONLY - {"pool"}
        self.assertEqual(set(scenarios), features, "a feature without a case here")
        for name in _private.NAMES:
            if name.feature in scenarios:
                with self.subTest(name=name.path):
                    self.refusal_forgotten()
                    scenarios[name.feature](name.path)
        # The control: with every name there, nothing is said.
        for feature in ("spawn_default", "unguarded_script", "iterator_hook",
                        "key_error_message", "lightning", "lightning_launcher"):
            with self.subTest(control=feature):
                self.refusal_forgotten()
                scenarios[feature](None)

    def assertSaidOnce(self, lines, path):
        if path is None:
            self.assertEqual([l for l in lines if " is off: " in l], [], lines)
            return
        found = off_lines(lines, path)
        self.assertEqual(len(found), 1, "said once that a feature is off for %s: %s"
                         % (path, lines))
        self.assertRegex(found[0], r"^spawnpoint-shim: .+ is off: (torch|Python|lightning) "
                                   r".+ has no .+; .+")

    # multiprocessing.context -------------------------------------------------------------

    def fake_context_module(self, drop):
        real = multiprocessing.context
        default = real.DefaultContext(multiprocessing.get_context(
            "fork" if hasattr(os, "fork") else "spawn"))

        def popen(process_obj):
            return "started"

        module = types.ModuleType("multiprocessing.context")
        module._default_context = default
        module.SpawnProcess = type("SpawnProcess", (object,), {"_Popen": staticmethod(popen)})
        module.ForkServerProcess = type("ForkServerProcess", (object,),
                                        {"_Popen": staticmethod(popen)})
        if drop == "multiprocessing.context:_default_context":
            module._renamed_default_context = module.__dict__.pop("_default_context")
        elif drop == "multiprocessing.context:DefaultContext()._default_context":
            default._renamed = default.__dict__.pop("_default_context")
        elif drop is not None:
            cls = getattr(module, drop.split(":")[1].split(".")[0])
            cls._popen = cls.__dict__["_Popen"]
            delattr(cls, "_Popen")
        return module, default

    def mp_case(self, drop):
        module, default = self.fake_context_module(drop)
        with said() as lines:
            for _ in range(2):  # a second import (a second copy of the shim) says nothing new
                _mp.patch(module)
        self.assertSaidOnce(lines, drop)
        spawn_default = drop is None or not drop.endswith("_default_context")
        # The underlying default as the (renamed) context holds it: spawn only with the hook.
        underlying = default.__dict__.get("_default_context") or default.__dict__["_renamed"]
        self.assertEqual(underlying.get_start_method(), "spawn" if spawn_default else
                         ("fork" if hasattr(os, "fork") else "spawn"), drop)
        self.assertEqual(getattr(default, "_spawnpoint_patched", False), spawn_default, drop)
        for cls in (module.SpawnProcess, module.ForkServerProcess):
            popen = cls.__dict__.get("_Popen")
            if popen is not None:  # guarded whatever else is missing
                self.assertTrue(getattr(popen.__func__, "_spawnpoint_guard", False), drop)
                with mock.patch.object(_script, "unguarded_call", lambda depth=1: None):
                    self.assertEqual(cls._Popen(None), "started")

    # _script.py: sys._getframe ------------------------------------------------------------

    def script_case(self, drop):
        proxy = copy_module(sys, _getframe=None) if drop else sys
        with said() as lines, modules_replaced({"sys": proxy}), \
                mock.patch.object(_script, "main_script", lambda: os.path.abspath(__file__)):
            for _ in range(2):
                where = _script.unguarded_call()
        self.assertSaidOnce(lines, drop)
        if drop:
            self.assertIsNone(where)  # cannot tell, so nothing is stopped

    # _dataloader.py: DataLoader._get_iterator --------------------------------------------

    def iterator_case(self, drop):
        renamed = drop is not None

        class DataLoader(object):  # torch's, as far as the hook looks at it
            def __init__(self, dataset, batch_size=1, shuffle=False, num_workers=0,
                         multiprocessing_context=None, persistent_workers=False,
                         prefetch_factor=2, timeout=0):
                self.dataset, self.batch_size, self.num_workers = dataset, batch_size, num_workers
                self.multiprocessing_context = multiprocessing_context

            def __iter__(self):
                return self._make_iterator() if renamed else self._get_iterator()

            def _batches(self):
                data = self.dataset
                return iter([data[i:i + self.batch_size]
                             for i in range(0, len(data), self.batch_size)])

        if renamed:
            DataLoader._make_iterator = DataLoader._batches
        else:
            DataLoader._get_iterator = DataLoader._batches
        module = types.ModuleType("torch.utils.data.dataloader")
        module.DataLoader = DataLoader
        environ = {"SPAWNPOINT_SHIM": "1", "SPAWNPOINT_LOADER_WORKERS": "2"}
        with said() as lines, mock.patch.dict(os.environ, environ):
            _dataloader.patch(module)
            loaders = [DataLoader(list(range(6)), batch_size=2) for _ in range(2)]
            batches = list(loaders[0]) if renamed else None
        self.assertSaidOnce(lines, drop)
        # Without the iterator hook the job's workers are not given (nothing could take them
        # back at iter()): the loader runs as the code asked, and iterates.
        self.assertEqual([l.num_workers for l in loaders], [0, 0] if renamed else [2, 2])
        if renamed:
            self.assertEqual(batches, [[0, 1], [2, 3], [4, 5]])
            self.assertNotIn("_get_iterator", DataLoader.__dict__)
        else:
            self.assertTrue(DataLoader._get_iterator._spawnpoint_shim)

    # _pool_iter.py: torch._utils.KeyErrorMessage -----------------------------------------

    def key_error_case(self, drop):
        class KeyErrorMessage(str):
            def __repr__(self):
                return self

        utils = types.ModuleType("torch._utils")
        if drop is None:
            utils.KeyErrorMessage = KeyErrorMessage
        message = "Caught KeyError in DataLoader worker process 0.\nOriginal Traceback"
        raised = []
        with said() as lines, modules_replaced({"torch._utils": utils}):
            for _ in range(2):
                with self.assertRaises(KeyError) as caught:
                    _pool_iter._raise_batch_error({"kind": "dataset", "message": message,
                                                   "excType": "builtins.KeyError"})
                raised.append(caught.exception.args[0])
        self.assertSaidOnce(lines, drop)
        self.assertEqual(raised, [message, message])  # the batch's error, either way
        self.assertIs(type(raised[0]), str if drop else KeyErrorMessage)

    # _lightning.py ------------------------------------------------------------------------

    def lightning_module(self, drop):
        """A Lightning whose accelerator connector (and DDPStrategy) lack `drop`, renamed."""
        last = drop.partition(":")[2].split(".")[-1] if drop else None

        class DDPStrategy(object):
            def __init__(self, start_method="popen"):
                if last == "_start_method":
                    self._launch_method = start_method
                else:
                    self._start_method = start_method

        class Connector(object):
            def __init__(self, strategy, devices=2, num_nodes=1):
                flag = "_strategy" if last == "_strategy_flag" else "_strategy_flag"
                setattr(self, flag, strategy)
                setattr(self, "_devices" if last == "_parallel_devices"
                        else "_parallel_devices", list(range(devices)))
                setattr(self, "_nodes" if last == "_num_nodes_flag" else "_num_nodes_flag",
                        num_nodes)
                if getattr(self, flag) == "auto":
                    choose = (self._pick if last == "_choose_strategy"
                              else self._choose_strategy)
                    setattr(self, flag, choose())
                (self._settle if last == "_check_strategy_and_fallback"
                 else self._check_strategy_and_fallback)()

            def _choose_strategy(self):
                return "ddp"

            def _check_strategy_and_fallback(self):
                pass

        if last in ("_choose_strategy", "_check_strategy_and_fallback"):
            setattr(Connector, {"_choose_strategy": "_pick",
                                "_check_strategy_and_fallback": "_settle"}[last],
                    Connector.__dict__[last])
            delattr(Connector, last)
        module = types.ModuleType("lightning.pytorch.trainer.connectors.accelerator_connector")
        if last == "_AcceleratorConnector":
            module._Connector = Connector
        else:
            module._AcceleratorConnector = Connector
        return module, Connector, DDPStrategy

    def lightning_case(self, drop):
        module, connector, ddp_strategy = self.lightning_module(drop)
        started = []
        mp = types.ModuleType("torch.multiprocessing")
        mp.start_processes = lambda fn, args=(), nprocs=1, join=True, daemon=False, \
            start_method="spawn": started.append((nprocs, start_method)) or "context"
        environ = {"SPAWNPOINT_SHIM": "1", "TORCHELASTIC_RUN_ID": "default/job", "RANK": "0",
                   "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "NNODES": "1"}
        feature = None if drop is None else next(n.feature for n in _private.NAMES
                                                 if n.path == drop)
        with said() as lines, mock.patch.dict(os.environ, environ, clear=True), \
                modules_replaced({"torch.multiprocessing": mp}):
            _lightning.patch(module)
            # The trainer goes on: Trainers are made, as many as it likes.
            auto = connector("auto")
            spawned = connector("ddp_spawn", devices=4 if feature == "lightning_devices" else 2)
            strategy = ddp_strategy("spawn")
            connector(strategy)
            # Lightning's launcher, as lightning 2.6's _MultiProcessingLauncher.launch calls it.
            launcher = {"__name__": "lightning.pytorch.strategies.launchers.multiprocessing"}
            exec("def launch(mp):\n    return mp.start_processes(print, nprocs=2, "
                 "start_method='spawn', join=False)\n", launcher)
            refused = None
            try:
                launcher["launch"](mp)
            except SystemExit as stop:
                refused = stop.code
            mp.start_processes(print, nprocs=3)  # the trainer's own: never refused
        self.assertSaidOnce(lines, drop)
        flag = "_strategy" if drop and drop.endswith("_strategy_flag") else "_strategy_flag"
        if feature == "lightning":
            # Off: what the missing name was for is not mapped, and Lightning's own processes
            # are refused, in one line; the trainer's own start_processes goes through.
            if drop.endswith("._start_method"):
                self.assertEqual(getattr(spawned, flag), "ddp")
                self.assertEqual(strategy._launch_method, "spawn")
            else:
                self.assertEqual(getattr(spawned, flag), "ddp_spawn")
            self.assertEqual(refused, 1)
            fatal = [l for l in lines if l.startswith("spawnpoint-shim: fatal: Lightning is "
                                                      "about to start 2 processes")]
            self.assertEqual(len(fatal), 1, lines)
            self.assertEqual(started, [(3, "spawn")])
            return
        # The strategy is still run on the agent's ranks; only the devices check or the
        # 'auto (...)' of the line is off. Nothing is refused.
        self.assertEqual((getattr(auto, flag), getattr(spawned, flag)), ("ddp", "ddp"))
        self.assertEqual(strategy._start_method, "popen")
        self.assertIsNone(refused)
        self.assertEqual(started, [(2, "spawn"), (3, "spawn")])
        self.assertIn("spawnpoint-shim: Lightning strategy %s: the agent's 2 ranks run it; "
                      "Lightning launches nothing" % (
                          "ddp" if feature == "lightning_auto" else "auto (ddp)"), lines)

    def lightning_launcher_case(self, drop):
        """A DDPStrategy subclass that makes its own launcher (start method spawn), on a
        Lightning whose DDPStrategy lacks `drop` (_configure_launcher, renamed)."""
        module = self.lightning_module(None)[0]
        launcher = "_make_launcher" if drop else "_configure_launcher"

        class DDPStrategy(object):
            def __init__(self, start_method="popen"):
                self._start_method = start_method
                self.launcher = None

        setattr(DDPStrategy, launcher, lambda self: setattr(
            self, "launcher", "subprocess" if self._start_method == "popen" else "mp"))

        class _OwnLauncherStrategy(DDPStrategy):
            def _configure_launcher(self):
                self.launcher = "its own, %s" % self._start_method

        ddp = types.ModuleType("lightning.pytorch.strategies.ddp")
        ddp.DDPStrategy = DDPStrategy
        mp = types.ModuleType("torch.multiprocessing")
        mp.start_processes = lambda *args, **kwargs: None
        environ = {"SPAWNPOINT_SHIM": "1", "TORCHELASTIC_RUN_ID": "default/job", "RANK": "0",
                   "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "NNODES": "1"}
        strategies = [_OwnLauncherStrategy("spawn"), _OwnLauncherStrategy("spawn")]
        with said() as lines, mock.patch.dict(os.environ, environ, clear=True), \
                modules_replaced({"torch.multiprocessing": mp,
                                  "lightning.pytorch.strategies.ddp": ddp}):
            _lightning.patch(module)
            for strategy in strategies:  # two Trainers: said once
                module._AcceleratorConnector(strategy)
                strategy._configure_launcher()  # as the connector's _lazy_init_strategy
        self.assertSaidOnce(lines, drop)
        refused = getattr(mp.start_processes, "_spawnpoint_lightning", False)
        for strategy in strategies:
            if drop:
                # Off: the object keeps its start method and its own launcher; Lightning's
                # processes are refused where they would start.
                self.assertEqual((strategy._start_method, strategy.launcher),
                                 ("spawn", "its own, spawn"))
            else:
                self.assertEqual((strategy._start_method, strategy.launcher),
                                 ("popen", "subprocess"))
        self.assertEqual(refused, bool(drop))
        mapped = [l for l in lines if "Lightning strategy _OwnLauncherStrategy" in l]
        self.assertEqual(len(mapped), 0 if drop else 2, lines)

    def test_a_multiprocessing_child_says_nothing(self):
        # torch's spawned loader workers run the same interpreter and torch: their parent said it.
        path = "sys:_getframe"
        proxy = copy_module(sys, _getframe=None)
        for child in (True, False):
            with said() as lines, modules_replaced({"sys": proxy}), mock.patch(
                    "spawnpoint_rank._distributed.multiprocessing_child", lambda: child):
                self.assertEqual(_private.missing("unguarded_script"), [path])
            self.assertEqual(len(off_lines(lines, path)), 0 if child else 1)


class PoolMissingNameTest(unittest.TestCase):
    """Each name the agent's pool relies on taken away from the real torch in turn: iter()
    says once that the pool is off and the loader runs on torch's own workers."""

    def test_each_name_in_turn(self):
        import torch
        from torch.utils.data import dataloader

        names = [n.path for n in _private.NAMES if n.feature == "pool"]
        self.assertTrue(names)
        for path in names + [None]:
            with self.subTest(name=path):
                self.check(path, torch, dataloader)

    def renamed_torch(self, path, dataloader):
        """{module: stand-in}: torch's modules as the pool sees them with `path` renamed,
        and the changes a loader instance needs ({"loader": attribute})."""
        class DataLoader(dataloader.DataLoader):  # patched by _dataloader, not torch's own
            pass

        proxies = {"torch.utils.data.dataloader": copy_module(dataloader, DataLoader=DataLoader)}
        loader_change = None
        if path is not None:
            module_name, parts, instance = _private.split(path)
            real = sys.modules[module_name]
            proxy = proxies.get(module_name) or copy_module(real)
            proxies[module_name] = proxy
            if instance == "torch.utils.data.dataloader:DataLoader()":
                loader_change = parts[0]
            elif instance is not None:  # the iterator's attribute, renamed by torch's __init__
                attribute, base = parts[0], real._BaseDataLoaderIter

                def __init__(self, loader):
                    base.__init__(self, loader)
                    self.__dict__[attribute + "_renamed"] = self.__dict__.pop(attribute)

                proxy._BaseDataLoaderIter = type("_BaseDataLoaderIter", (base,),
                                                 {"__init__": __init__})
            elif len(parts) == 1:
                delattr(proxy, parts[0])
            else:
                cls = getattr(real, parts[0])
                setattr(proxy, parts[0], type(cls.__name__, (cls,), {parts[1]: Hidden()}))
        return proxies, DataLoader, loader_change

    def check(self, path, torch, dataloader):
        proxies, DataLoader, loader_change = self.renamed_torch(path, dataloader)
        environ = {"SPAWNPOINT_SHIM": "1"}
        iterator_name = path is not None and "_BaseDataLoaderIter()." in path

        def service():
            if iterator_name:  # the iterator is made (and found lacking) before any use of it
                return object()
            raise OSError("no agent here")

        with said() as lines, mock.patch.dict(os.environ, environ), \
                modules_replaced(proxies), \
                mock.patch.object(_pool, "_service_path", "/nonexistent/spawnpoint-loader.sock"), \
                mock.patch.object(_pool, "service", service), \
                mock.patch.object(_script, "unguarded_call", lambda depth=1: None):
            _dataloader.patch(proxies["torch.utils.data.dataloader"])
            state = torch.get_rng_state()
            if loader_change is not None:
                # The loader's own attribute: the pool is asked directly (torch's own iterator
                # of this stand-in would miss it too), twice.
                loader = DataLoader(list(range(8)), batch_size=2, num_workers=2)
                value = getattr(loader, loader_change)
                if loader_change in loader.__dict__:
                    del loader.__dict__[loader_change]
                else:
                    setattr(type(loader), loader_change, Hidden())
                for _ in range(2):
                    self.assertEqual(_pool_iter.pool_iterator(loader), (None, None))
                self.assertTrue(torch.equal(torch.get_rng_state(), state), "nothing drawn")
                self.assertIsNotNone(value)
            else:
                # The trainer's view: two epochs of a loader with workers, on torch's own
                # (forked here: this test process holds no GPU) when the pool is off.
                loader = DataLoader(list(range(8)), batch_size=2, num_workers=2,
                                    multiprocessing_context="fork")
                epochs = [[b.tolist() for b in loader] for _ in range(2)]
                self.assertEqual(epochs, [[[0, 1], [2, 3], [4, 5], [6, 7]]] * 2)
        if path is None:
            # Every name there: the pool went on, past the names, to the service (none here).
            self.assertEqual([l for l in lines if " is off: " in l], [], lines)
            self.assertEqual(len([l for l in lines if "not the agent's pool: the agent's loader "
                                  "service at /nonexistent/" in l]), 1, lines)
            return
        found = off_lines(lines, path)
        self.assertEqual(len(found), 1, lines)
        # (A class that is missing takes its members with it: the line names them all.)
        self.assertRegex(found[0], r"^spawnpoint-shim: the agent's loader pool is off: torch "
                         r"%s has no (\S+ or )*%s( or \S+)*; DataLoaders run on torch's own "
                         r"workers$" % (re.escape(torch.__version__),
                                        re.escape(_private.shown(path))))
        self.assertIn(path, _private.off().get("pool", []))


if __name__ == "__main__":
    unittest.main()
