#!/usr/bin/env bash
# Deadlines on cluster08: half its jobs preemptible with a deadline at
# submission + SLACK x duration, hourly checkpoints, 60 s save on notice;
# the jobs with deadlines run all on-demand, all preemptible, or
# preemptible with the server's promotion rule.
# Usage: scripts/deadlines.sh   (prints a Markdown table; EBB=PATH replays
# with that ebb binary instead of building the release one)
set -euo pipefail
cd "$(dirname "$0")/.."
traces=${EBB_TRACES:-traces/itp}
ebb=${EBB:-}
if [ -z "$ebb" ]; then
  cargo build --release -q -p ebb
  ebb=target/release/ebb
fi
summarise=$(cat <<'PY'
import json, sys
s = json.load(sys.stdin)
d = s["deadlines"]
q = s["on_demand_wait_s"]
print(f"| {sys.argv[1]} | {sys.argv[2]} | {d['policy']} | {d['jobs']} | {d['met']} ({100 * d['met'] / d['jobs']:.1f}%) "
      f"| {d['promoted']} | ${d['cost_usd']:,.0f} ({100 * d['cost_usd'] / d['on_demand_cost_usd']:.0f}%) "
      f"| {s['preemptions']} | {q['p50']:.0f} s / {q['p99']:.0f} s |")
PY
)
echo "| nodes | slack | deadline jobs run as | jobs | deadlines met | promoted | their cost (of the on-demand price) | preemptions | on-demand wait p50 / p99 (promoted included) |"
echo "|---|---|---|---|---|---|---|---|---|"
for nodes in 12 16; do
  for slack in 1.5 3; do
    for policy in on-demand preemptible promote; do
      "$ebb" sim --trace "$traces/cluster08.csv" --nodes "$nodes" --preemptible-fraction 0.5 \
        --checkpoint-interval 1h --drain-checkpoint 60 --deadline-slack "$slack" --deadline-policy "$policy" \
        --json - | python3 -c "$summarise" "$nodes" "$slack"
    done
  done
done
