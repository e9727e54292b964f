#!/usr/bin/env bash
# Issue 57: bench-medium decode before (37ac7cb, /work/venv-before) and after (main, /work/venv), alternating
set -uo pipefail
out=/work/bench57
mkdir -p $out
for round in 3 4; do
    for side in before after; do
        v=/work/venv; [ $side = before ] && v=/work/venv-before
        s=$(date +%s)
        $v/bin/longhaul-cpp bench --model medium --routing uniform --scenarios allcached,sweep --budgets 1/8,1/4 \
            -p 64 -n 32 -r 2 --no-cold -o $out/$side-$round > $out/$side-$round.log 2>&1
        echo "$side $round rc=$? $(( $(date +%s) - s )) s"
    done
done
