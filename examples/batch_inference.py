#!/usr/bin/env python3
"""Batch inference over shards, as an array job. A prepare step writes the
input shards and the model (a nearest-centroid classifier of the digits
data set that scikit-learn ships) to DATA; task i then classifies shard i
and writes its predictions with write-then-rename. A shard drained
mid-way exits without output and is rerun alone; a finished shard is never
rerun (its output and the completion marker are written before it exits).

    python3 examples/batch_inference.py prepare --shards 100 --data infer
    ebb submit --array 0-99 -- python3 examples/batch_inference.py run --data infer
    python3 examples/batch_inference.py check --data infer

Every start and finish is appended to DATA/ledger, for checking that no
shard ran to completion twice.
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


def shard_path(data, i):
    return os.path.join(data, "inputs", f"shard-{i:05d}.npy")


def output_path(data, i):
    return os.path.join(data, "outputs", f"shard-{i:05d}.csv")


def predict(centroids, rows):
    return ((rows[:, None, :] - centroids[None, :, :]) ** 2).sum(axis=2).argmin(axis=1)


def render(first_row, preds):
    return "".join(f"{first_row + n},{p}\n" for n, p in enumerate(preds))


def log(data, line):
    # One write per line to an O_APPEND file: lines never interleave.
    fd = os.open(os.path.join(data, "ledger"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def prepare(args):
    data, y = digits.load()
    x = data / 16.0
    os.makedirs(os.path.join(args.data, "inputs"), exist_ok=True)
    os.makedirs(os.path.join(args.data, "outputs"), exist_ok=True)
    np.save(os.path.join(args.data, "model.npy"), np.stack([x[y == c].mean(axis=0) for c in range(10)]))
    first = 0
    for i, rows in enumerate(np.array_split(x, args.shards)):
        np.save(shard_path(args.data, i), rows)
        with open(shard_path(args.data, i) + ".first", "w") as f:
            f.write(str(first))
        first += len(rows)
    with open(os.path.join(args.data, "shards"), "w") as f:
        f.write(str(args.shards))
    print(f"{args.shards} shards of {len(x)} rows in {args.data}")


def run(args):
    i = ebb_sdk.task_index() if args.index is None else args.index
    log(args.data, f"start {i} attempt {ebb_sdk.attempt()}")
    centroids = np.load(os.path.join(args.data, "model.npy"))
    rows = np.load(shard_path(args.data, i))
    first = int(open(shard_path(args.data, i) + ".first").read())
    preds = []
    for chunk in np.array_split(rows, 6):
        if ebb_sdk.drain_requested():
            log(args.data, f"drained {i}")
            sys.exit(0)  # no marker, no output: this shard is requeued
        preds.extend(predict(centroids, chunk).tolist())
        time.sleep(args.chunk_seconds)
    final = output_path(args.data, i)
    tmp = final + ".tmp"
    with open(tmp, "w") as f:
        f.write(render(first, preds))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    ebb_sdk.complete()
    log(args.data, f"done {i}")


def check(args):
    centroids = np.load(os.path.join(args.data, "model.npy"))
    shards = int(open(os.path.join(args.data, "shards")).read())
    bad = []
    for i in range(shards):
        first = int(open(shard_path(args.data, i) + ".first").read())
        want = render(first, predict(centroids, np.load(shard_path(args.data, i))))
        path = output_path(args.data, i)
        if not os.path.exists(path) or open(path).read() != want:
            bad.append(i)
    if bad:
        print(f"wrong or missing shards: {bad}")
        sys.exit(1)
    print(f"all {shards} shards correct")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["prepare", "run", "check"])
    ap.add_argument("--data", required=True, help="inputs, model, outputs and the ledger")
    ap.add_argument("--shards", type=int, default=100, help="prepare: how many shards")
    ap.add_argument("--index", type=int, default=None, help="run: shard to run (default: EBB_TASK_INDEX)")
    ap.add_argument("--chunk-seconds", type=float, default=0.05, help="run: pause per chunk, standing in for GPU time")
    args = ap.parse_args()
    {"prepare": prepare, "run": run, "check": check}[args.command](args)


if __name__ == "__main__":
    main()
