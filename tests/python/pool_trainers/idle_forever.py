"""Preloaded by the loader workers of test_pool_agent.py's starvation test
(loader.preloadModules): at idle CPU priority it never finishes importing (it sleeps for
ten minutes), as a start-up starved by other processes would not; at normal priority
(SPAWNPOINT_LOADER_PRIORITY=normal, set when a worker starts over) it is done at once."""
import os
import time

if os.environ.get("SPAWNPOINT_LOADER_PRIORITY") != "normal":
    time.sleep(600)
