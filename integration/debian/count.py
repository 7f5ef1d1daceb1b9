"""The seeds' counter: a number that lives only in this process's memory."""

import os
import sys
import time

n = 0
while True:
    n += 1
    # Renamed into place, so that a reader never sees a half-written number.
    with open("/workspace/count.txt.tmp", "w") as f:
        f.write(f"{n}\n")
    os.replace("/workspace/count.txt.tmp", "/workspace/count.txt")
    time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0.2)
