"""The rank's side of the notebook extension (notebook.py): Lightning's own process function on
an agent rank. A module of its own so that a rank imports it without installing the extension."""

import os


def main(launcher, trainer, function, args, kwargs, global_states):
    """On each rank: Lightning's own _wrapping_function as process LOCAL_RANK; rank 0's
    _WorkerOutput (what it puts on the queue) is the return value."""
    strategy = launcher._strategy
    environment = getattr(strategy, "cluster_environment", None)
    if type(environment).__name__ == "LightningEnvironment":
        # The kernel's copy may have cached a port it found free there; the agent's
        # MASTER_ADDR/MASTER_PORT are the rendezvous.
        strategy.cluster_environment = type(environment)()
    kept = []

    class _Queue:
        put = kept.append

    launcher._wrapping_function(int(os.environ["LOCAL_RANK"]), trainer, function, args, kwargs,
                                _Queue(), global_states)
    return kept[0] if kept else None
