"""Data-parallel training that Ebb may shrink and grow, under torchrun.

    ebb submit --gpus 8:24 -- torchrun examples/elastic_ddp.py --steps 2000 --out weights.pt

Ebb gives torchrun its elastic rendezvous (`--nnodes MIN:MAX`, c10d, on
the job's first node) through `PET_*` variables, so the bare command joins
it on every node. When Ebb takes a node, its ranks get the drain notice and
the ranks that stay get a change of nodes; when it gives one back, the
ranks it ran on get a change of nodes as the new node starts. Either way
the ranks agree (an all-reduce of what each was told), rank 0 saves once
for all, and every rank exits with 75: torchrun re-forms the group on the
nodes there are and starts the ranks again, which resume from that save.

Each step trains on the same global batch whatever the number of ranks
(each rank its equal share of it; DDP averages the ranks' gradients), so
the run follows an uninterrupted one step for step; the ranks' gradients
are summed in a different order on another number of ranks, so the
weights agree to rounding, not to the bit.

`--hold PATH`: while PATH exists, the ranks take no step (they still
save and re-form when told to): a test's way to keep the run from ending
before a change it waits for.
"""

import argparse
import io
import os
import sys
import time

import torch
import torch.distributed as dist

import ebb_sdk

GLOBAL_BATCH = 12  # divides evenly among 1, 2, 3, 4 or 6 ranks
SAMPLES, FEATURES = 600, 16
# A rank's exit after the save made at a change of nodes: not 0, which
# torchrun would take for the job's end, so that it re-forms the group.
REFORM = 75


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=g, dtype=torch.float64)
    w = torch.randn(FEATURES, 1, generator=g, dtype=torch.float64)
    y = x @ w + 0.1 * torch.randn(SAMPLES, 1, generator=g, dtype=torch.float64)
    return x, y


def model_and_optimizer():
    torch.manual_seed(1)
    model = torch.nn.Linear(FEATURES, 1, dtype=torch.float64)
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def share(step, rank, world):
    """This rank's samples of step `step`'s global batch."""
    start = step * GLOBAL_BATCH
    each = GLOBAL_BATCH // world
    idx = torch.arange(start + rank * each, start + (rank + 1) * each) % SAMPLES
    return idx


def train_step(model, opt, x, y, idx):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
    loss.backward()
    opt.step()


def weights(model):
    module = getattr(model, "module", model)
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def reference(args):
    """The same training in one process, never interrupted."""
    x, y = data()
    model, opt = model_and_optimizer()
    for step in range(args.steps):
        train_step(model, opt, x, y, share(step, 0, 1))
    torch.save(weights(model), args.out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--out", required=True)
    ap.add_argument("--step-seconds", type=float, default=0.0)
    ap.add_argument("--hold")
    ap.add_argument("--reference", action="store_true")
    args = ap.parse_args()
    if args.reference:
        return reference(args)

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if GLOBAL_BATCH % world:
        sys.exit(f"{world} ranks cannot share a global batch of {GLOBAL_BATCH} evenly")
    x, y = data()
    model, opt = model_and_optimizer()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    # Every rank holds the same state: rank 0 saves whole steps, every
    # rank reads them (rank 0 alone reports the resume).
    ckpt = ebb_sdk.CheckpointManager(rank=0, world_size=1, report=rank == 0)
    step = 0
    found = ckpt.load_latest(lambda f: torch.load(f, weights_only=False))
    if found:
        step, state = found
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
    log = open(os.path.join(ckpt.directory, "steps.log"), "a", encoding="utf-8") if rank == 0 else None
    say = lambda line: log and (log.write(line + "\n"), log.flush())
    say(f"began at {step} on {world} ranks")

    def save():
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buf)
        ckpt.save(step, buf.getvalue())

    while step < args.steps:
        # What each rank was told, agreed by all: save (the interval, a
        # drain, a change of nodes), re-form (a drain or a change), hold.
        told = torch.tensor(
            [
                ckpt.should_save(),
                ckpt.drain_requested() or ckpt.nodes_changed(),
                rank == 0 and bool(args.hold) and os.path.exists(args.hold),
            ],
            dtype=torch.float64,
        )
        dist.all_reduce(told, op=dist.ReduceOp.MAX)
        must_save, reform, hold = (bool(v) for v in told)
        if must_save or reform:
            if rank == 0:
                save()
            dist.barrier()
        if reform:
            say(f"saved {step} on {world} ranks to re-form")
            ebb_sdk.exit_now(REFORM)
        if hold:
            time.sleep(0.05)
            continue
        train_step(ddp, opt, x, y, share(step, rank, world))
        step += 1
        say(f"step {step} on {world} ranks")
        time.sleep(args.step_seconds)
    if rank == 0:
        torch.save(weights(model), args.out)
        say(f"done at {step} on {world} ranks")
    dist.barrier()
    ebb_sdk.complete()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
