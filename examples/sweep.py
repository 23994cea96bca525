#!/usr/bin/env python3
"""A hyperparameter sweep trial: one task per combination of
`--sweep lr=... --sweep batch=...`, its parameters in EBB_PARAM_LR and
EBB_PARAM_BATCH. Each trial checkpoints on notice and resumes, so a
preempted trial loses only itself, and nothing of its work.

    ebb submit --sweep lr=0.3,0.1,0.03 --sweep batch=16,64 -- \\
        python3 examples/sweep.py --out sweep-results

Each trial writes OUT/trial-<index>.json with its parameters and accuracy.
"""

import argparse
import json
import os
import time

import ebb_sdk

# The drain signal's handler first, before the slow imports: a notice that
# comes while they load is then seen, not fatal.
ebb_sdk.watcher()

import numpy as np  # noqa: E402
import digits  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--step-seconds", type=float, default=0.005)
    args = ap.parse_args()
    params = ebb_sdk.params()
    lr = float(os.environ.get("EBB_PARAM_LR", "0.1"))
    batch = int(os.environ.get("EBB_PARAM_BATCH", "32"))
    index = ebb_sdk.task_index() or 0

    data, y = digits.load()
    x = data / 16.0
    ckpt = ebb_sdk.CheckpointManager(keep=1)
    resumed = ckpt.load_latest(lambda f: dict(np.load(f)))
    if resumed:
        step, state = resumed[0], resumed[1]
        w = state["w"].copy()
        rng = np.random.default_rng()
        rng.bit_generator.state = json.loads(str(state["rng"]))
    else:
        step, w, rng = 0, np.zeros((64, 10)), np.random.default_rng(index)
    print(f"trial {index} {params}: from step {step}", flush=True)
    while step < args.steps:
        idx = rng.integers(0, len(y), size=batch)
        z = x[idx] @ w
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        p[np.arange(batch), y[idx]] -= 1
        w -= lr * x[idx].T @ p / batch
        step += 1
        time.sleep(args.step_seconds)
        if ebb_sdk.drain_requested():
            state = {"w": w, "rng": json.dumps(rng.bit_generator.state)}
            ckpt.save(step, lambda f: np.savez(f, **state))
            ebb_sdk.exit_now()
    accuracy = float(((x @ w).argmax(axis=1) == y).mean())
    os.makedirs(args.out, exist_ok=True)
    result = {"index": index, "params": params, "accuracy": accuracy, "attempt": ebb_sdk.attempt()}
    final = os.path.join(args.out, f"trial-{index}.json")
    with open(final + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(final + ".tmp", final)
    ebb_sdk.complete()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
