# A script that starts a spawn Pool at its top level with a function it defines: under spawn
# each Pool worker imports the script and starts a Pool of its own while bootstrapping, which
# fails, and the Pool respawns workers forever. The shim ends it with one line instead.
import multiprocessing


def square(x):
    return x * x


with multiprocessing.get_context("spawn").Pool(2) as pool:
    print(pool.map(square, range(4)))
