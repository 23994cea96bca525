#!/usr/bin/env python3
"""A preprocessing pipeline over input chunks, as an array job: task i
reads chunk i of the digits images, standardises them and writes a .npy
with write-then-rename. Outputs are idempotent: a rerun (after a
preemption) rewrites the same bytes, and a chunk whose output exists is
skipped.

    ebb submit --array 0-15 -- python3 examples/preprocess.py --chunks 16 --out features
"""

import argparse
import os
import sys
import time

import ebb_sdk

# The drain signal's handler first, before the slow imports: a notice that
# comes while they load is then seen, not fatal.
ebb_sdk.watcher()

import numpy as np  # noqa: E402
import digits  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--row-seconds", type=float, default=0.002)
    args = ap.parse_args()
    i = ebb_sdk.task_index() or 0
    watcher = ebb_sdk.watcher()
    os.makedirs(args.out, exist_ok=True)
    final = os.path.join(args.out, f"chunk-{i:05d}.npy")
    if os.path.exists(final):
        print(f"chunk {i}: already done")
        ebb_sdk.complete()
        return
    x, _ = digits.load()
    rows = np.array_split(np.arange(len(x)), args.chunks)[i]
    mean, std = x.mean(axis=0), x.std(axis=0) + 1e-6
    out = np.empty((len(rows), x.shape[1]))
    for n, r in enumerate(rows):
        if watcher.drain_requested():
            sys.exit(0)  # nothing written: the chunk is requeued and redone
        out[n] = (x[r] - mean) / std
        time.sleep(args.row_seconds)
    tmp = final + ".tmp"
    with open(tmp, "wb") as f:
        np.save(f, out)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    ebb_sdk.complete()
    print(f"chunk {i}: {len(rows)} rows")


if __name__ == "__main__":
    main()
