"""One rank of a gang job, run by test_gang.py as its own process: resumes
from the latest complete checkpoint, meets the other ranks (as
`torch.distributed`'s start does), saves one part per step, then waits for
the drain or finishes. Prints what it did as JSON lines.

Uses only what the SDK offered before it knew about gangs, and reads its
rank straight from the environment, so the same script runs against any
version of the SDK."""

import argparse
import json
import os
import sys
import time

import ebb_sdk


def say(**event):
    print(json.dumps(event), flush=True)


def payload(rank, step):
    return f"rank {rank} step {step}\n".encode()


def wait_for(path, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            say(event="error", error=f"timed out waiting for {path}")
            sys.exit(4)
        time.sleep(0.01)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sync", required=True, help="where ranks meet, outside the checkpoint directory")
    p.add_argument("--last", type=int, required=True, help="the last step to save in full")
    p.add_argument("--wait-before-last", help="save --last only once this file exists")
    p.add_argument("--stall", type=int, help="then start saving this step and never finish")
    p.add_argument("--finish", action="store_true", help="after --last, the work is done")
    args = p.parse_args()
    rank, world, attempt = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), os.environ["EBB_ATTEMPT"]

    watcher = ebb_sdk.watcher()
    ckpt = ebb_sdk.CheckpointManager(keep=2)
    step = 0
    resumed = ckpt.load_latest(lambda f: f.read())
    if resumed is not None:
        step, data = resumed
        if data != payload(rank, step):
            say(event="error", error=f"rank {rank} resumed step {step} from {data!r}")
            sys.exit(3)
    say(event="resumed", rank=rank, step=step)

    open(os.path.join(args.sync, f"resumed-{attempt}-{rank}"), "w").close()
    for other in range(world):
        wait_for(os.path.join(args.sync, f"resumed-{attempt}-{other}"))

    while step < args.last:
        step += 1
        if step == args.last and args.wait_before_last:
            wait_for(args.wait_before_last)
        ckpt.save(step, payload(rank, step))
        say(event="saved", step=step)

    if args.stall is not None:

        def stalled(f):
            f.write(payload(rank, args.stall)[:4])
            f.flush()
            open(os.path.join(args.sync, f"stalled-{attempt}-{rank}"), "w").close()
            say(event="stalled", step=args.stall)
            time.sleep(600)

        ckpt.save(args.stall, stalled)

    if args.finish:
        ebb_sdk.complete()
        say(event="finished")
        return 0
    watcher.wait()
    say(event="drained")
    ebb_sdk.exit_now(0)


if __name__ == "__main__":
    sys.exit(main())
