"""Ray tasks on an Ebb job's Ray cluster (`python -m ebb_sdk.ray_cluster`):
waves of tasks, each a square computed in a fraction of a second, until
`--release` exists; Ray retries a task whose node left with it. Every
result is checked at the end; the exit code says whether all were right.

    ebb submit --gpus 4:8 --signal WINCH -- python -m ebb_sdk.ray_cluster -- \\
        python examples/ray_tasks.py --log ray.log --release done
"""

import argparse
import os
import sys
import time

import ray


@ray.remote(num_cpus=1, max_retries=20)
def square(i: int, seconds: float):
    time.sleep(seconds)
    return i * i, ray.get_runtime_context().get_node_id()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", required=True)
    parser.add_argument("--release", required=True, help="finish after the wave in which this file appears")
    parser.add_argument("--wave", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=0.2)
    args = parser.parse_args()
    ray.init(logging_level="ERROR", log_to_driver=False)
    results, nodes, i = {}, set(), 0
    with open(args.log, "a", buffering=1) as log:
        while True:
            released = os.path.exists(args.release)
            wave = {square.remote(k, args.seconds): k for k in range(i, i + args.wave)}
            i += args.wave
            for ref, k in wave.items():
                value, node = ray.get(ref)
                results[k] = value
                nodes.add(node)
            alive = sum(1 for n in ray.nodes() if n.get("Alive"))
            log.write(f"done {len(results)} on {alive} nodes, tasks on {len(nodes)} so far, at {time.time():.1f}\n")
            if released:
                break
        # Why nodes left, as Ray recorded it (a drained node says so).
        from ray.core.generated.common_pb2 import NodeDeathInfo

        for node in ray.nodes():
            if not node.get("Alive"):
                reason = NodeDeathInfo.Reason.Name(node.get("DeathReason", 0))
                log.write(f"a node left: {reason}: {node.get('DeathReasonMessage', '')}\n")
        wrong = [k for k, v in results.items() if v != k * k]
        log.write(f"{len(results)} squares, {len(wrong)} wrong, on {len(nodes)} nodes in all\n")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
