#!/usr/bin/env bash
# The operator's question on the ITP traces (traces/itp): the same on-demand demand
# (cluster08) with and without a preemptible backlog, side by side.
# Usage: scripts/operator-question.sh [NODES]   (prints a Markdown table;
# EBB=PATH replays with that ebb binary instead of building the release one)
set -euo pipefail
cd "$(dirname "$0")/.."
traces=${EBB_TRACES:-traces/itp}
nodes=${1:-16}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
ebb=${EBB:-}
if [ -z "$ebb" ]; then
  cargo build --release -q -p ebb
  ebb=target/release/ebb
fi
# Window: up to cluster08's last submission, so every run is measured alike.
until=$(tail -n +2 "$traces/cluster08.csv" | cut -d, -f2 | sort -n | tail -1)
common=(--nodes "$nodes" --drain-checkpoint 30 --checkpoint-interval 1800 --until "$until")
run() { local name=$1; shift; "$ebb" sim "$@" "${common[@]}" --json "$out/$name.json" >/dev/null; }
run none --trace "on-demand=$traces/cluster08.csv"
run c09 --trace "on-demand=$traces/cluster08.csv" --trace "preemptible=$traces/cluster09.csv"
run c09-02-05 --trace "on-demand=$traces/cluster08.csv" --trace "preemptible=$traces/cluster09.csv" \
    --trace "preemptible=$traces/cluster02.csv" --trace "preemptible=$traces/cluster05.csv"
python3 - "$out" <<'PY'
import json, sys
rows = [("none", "no backlog"), ("c09", "+ cluster09 preemptible"), ("c09-02-05", "+ cluster09, 02, 05 preemptible")]
print("| backlog | GPU utilisation (on-demand + preemptible) | idle GPU-h | on-demand revenue | preemptible revenue | on-demand wait p50 / p99 / max | preemptions | lost GPU-h | drain GPU-h |")
print("|---|---|---|---|---|---|---|---|---|")
for key, label in rows:
    s = json.load(open(f"{sys.argv[1]}/{key}.json"))
    w = s["window"]; u = w["utilization_by_tier"]; q = s["on_demand_wait_s"]
    print(f"| {label} | {w['gpu_utilization']*100:.1f}% ({u['on_demand']*100:.1f}% + {u['preemptible']*100:.1f}%) "
          f"| {w['idle_gpu_hours']:,.0f} | ${w['revenue_usd']['on_demand']:,.0f} | ${w['revenue_usd']['preemptible']:,.0f} "
          f"| {q['p50']:.0f} s / {q['p99']:.0f} s / {q['max']:.0f} s | {s['preemptions']} | {s['lost_gpu_hours']:.1f} | {s['drain_gpu_hours']:.1f} |")
PY
