"""What the scripts/gen-*.py generators share: write the files they make, or, with --check,
say which checked-in ones differ. Standard library only."""

import os
import sys


def update(root, wanted, check, script):
    """wanted: {path relative to root: text}. Writes each file whose text differs (saying so);
    with check, writes nothing and names the stale ones on stderr. Returns the exit status:
    1 when check found a stale file, else 0."""
    stale = []
    for name, text in wanted.items():
        path = os.path.join(root, name)
        current = open(path).read() if os.path.exists(path) else None
        if current == text:
            continue
        if check:
            stale.append(name)
        else:
            with open(path, "w") as f:
                f.write(text)
            print("wrote %s" % name)
    if stale:
        print("out of date: %s; run %s" % (", ".join(stale), script), file=sys.stderr)
        return 1
    return 0
