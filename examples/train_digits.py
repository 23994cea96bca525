#!/usr/bin/env python3
"""Training that survives preemption: a small numpy MLP on the digits data
set that scikit-learn ships (no download).

Everything that decides the result is in the checkpoint -- the weights, the
step and the state of the random generator that draws the minibatches -- so
a run preempted any number of times ends with weights bit-identical to a
run never preempted.

  --mode notice    save when the drain notice comes, then exit (lost work ~ 0)
  --mode periodic  save every --every seconds; on notice exit without saving
                   (lost work < one interval per preemption)

    ebb submit --gpus 1 -- python3 examples/train_digits.py --out weights.npy
"""

import argparse
import io
import json
import os
import time

import ebb_sdk

# The drain signal's handler first, before the slow imports: a notice that
# comes while they load is then seen, not fatal.
ebb_sdk.watcher()

import numpy as np  # noqa: E402
import digits  # noqa: E402


def init(seed):
    rng = np.random.default_rng(seed)
    params = {
        "w1": rng.normal(0, 0.1, (64, 32)),
        "b1": np.zeros(32),
        "w2": rng.normal(0, 0.1, (32, 10)),
        "b2": np.zeros(10),
    }
    return params, rng


def sgd_step(p, x, y, lr):
    h = np.maximum(0, x @ p["w1"] + p["b1"])
    z = h @ p["w2"] + p["b2"]
    z -= z.max(axis=1, keepdims=True)
    probs = np.exp(z)
    probs /= probs.sum(axis=1, keepdims=True)
    probs[np.arange(len(y)), y] -= 1
    dz = probs / len(y)
    dh = (dz @ p["w2"].T) * (h > 0)
    p["w2"] -= lr * (h.T @ dz)
    p["b2"] -= lr * dz.sum(axis=0)
    p["w1"] -= lr * (x.T @ dh)
    p["b1"] -= lr * dh.sum(axis=0)


def accuracy(p, x, y):
    h = np.maximum(0, x @ p["w1"] + p["b1"])
    return float(((h @ p["w2"] + p["b2"]).argmax(axis=1) == y).mean())


def save_state(f, step, params, rng):
    np.savez(f, step=step, rng=json.dumps(rng.bit_generator.state), **params)


def load_state(f):
    data = np.load(f)
    params = {k: data[k].copy() for k in ("w1", "b1", "w2", "b2")}
    rng = np.random.default_rng()
    rng.bit_generator.state = json.loads(str(data["rng"]))
    return int(data["step"]), params, rng


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step-seconds", type=float, default=0.002, help="pause per step, standing in for GPU time")
    ap.add_argument("--mode", choices=["notice", "periodic"], default="notice")
    ap.add_argument("--every", type=float, default=None, help="periodic interval, seconds (default: Ebb's)")
    ap.add_argument("--out", required=True, help="where the final weights go (.npy)")
    args = ap.parse_args()

    data, y = digits.load()
    x = data / 16.0
    interval = args.every if args.mode == "periodic" else None
    ckpt = ebb_sdk.CheckpointManager(keep=2, interval=interval)
    resumed = ckpt.load_latest(load_state)
    if resumed is None:
        step = 0
        params, rng = init(args.seed)
    else:
        step, params, rng = resumed[1]
    print(f"attempt {ebb_sdk.attempt()}: training from step {step}", flush=True)

    while step < args.steps:
        idx = rng.integers(0, len(y), size=args.batch)
        sgd_step(params, x[idx], y[idx], args.lr)
        step += 1
        time.sleep(args.step_seconds)
        drained = ebb_sdk.drain_requested()
        if args.mode == "notice" and drained:
            ckpt.save(step, lambda f: save_state(f, step, params, rng))
            notice = ebb_sdk.notice()
            if notice is not None and notice.cancelled:
                print(f"cancel notice: saved step {step}, exiting (cancelled: no attempt follows)", flush=True)
            else:
                print(f"drain notice: saved step {step}, exiting to be requeued", flush=True)
            ebb_sdk.exit_now()  # no completion marker: requeued, not "succeeded"
        if args.mode == "periodic":
            if drained:
                print(f"drain notice at step {step}: exiting without a save", flush=True)
                ebb_sdk.exit_now()
            if ckpt.should_save():
                ckpt.save(step, lambda f: save_state(f, step, params, rng))
        if step % 500 == 0:
            print(f"step {step}: accuracy {accuracy(params, x, y):.3f}", flush=True)

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    weights = io.BytesIO()
    np.save(weights, np.concatenate([params[k].ravel() for k in ("w1", "b1", "w2", "b2")]))
    tmp = args.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(weights.getvalue())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, args.out)
    print(f"done: {step} steps, accuracy {accuracy(params, x, y):.3f}", flush=True)
    ebb_sdk.complete()


if __name__ == "__main__":
    main()
