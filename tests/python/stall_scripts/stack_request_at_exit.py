"""A Python rank that meets the agent's stack request as it exits (tests/agent/stall_trainer_test.cc).

The shim registers faulthandler for the request signal (SPAWNPOINT_STACK_SIGNAL); at
interpreter exit faulthandler unregisters it and puts back what was there before. This script
does the same by hand, then sends itself the signal, as a request from the stall monitor would
arrive at a rank shutting down. The rank must live on and exit 0: the signal is ignored before
and after the handler (the agent starts Python ranks with it ignored), not its default action,
which ends the process. Prints "alive after the stack signal" last.
"""
import faulthandler
import os
import signal
import sys

signum = signal.SIGRTMIN + 6  # agent/run/stall_monitor.cc's StackSignal()
# What interpreter exit does; False: the shim registered nothing, and the test proves nothing.
if not faulthandler.unregister(signum):
    sys.exit("the shim did not register faulthandler for signal %d" % signum)
os.kill(os.getpid(), signum)
print("alive after the stack signal", flush=True)
