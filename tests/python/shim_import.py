"""The shim's source for tests: where it is, and its modules imported without leaving
agent/python on sys.path (the tests of the start-up itself need it off)."""

import importlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("SPAWNPOINT_SOURCE_DIR") or os.path.dirname(os.path.dirname(HERE))
SHIM_DIR = os.path.join(SOURCE_DIR, "agent", "python")


def shim_module(name):
    """The module `name` of agent/python (e.g. "spawnpoint_rank.worker"), imported."""
    sys.path.insert(0, SHIM_DIR)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(SHIM_DIR)
