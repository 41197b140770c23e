#!/bin/sh
# make sim-mutants: the simulator must catch planted bugs. Each tests/sim/mutants/*.patch breaks
# one promise in the real code; it is applied to a copy of the tree under build/mutants/NAME
# (the sources, the Makefile, and the main build's objects with their times, so only the patched
# file is compiled again), the simulator is built there and run with a fixed budget: seeds
# SIM_MUTANT_SEEDS (default "1 2 3"), SIM_MUTANT_CALLS calls each (default 40000), until one run
# reports a violation. A mutant is caught when one does; a crash or a clean run is not.
# The last line reads "mutants: C/T caught"; the exit status is 0 only when C = T.
set -eu
cd "$(dirname "$0")/.."

seeds=${SIM_MUTANT_SEEDS:-"1 2 3"}
budget=${SIM_MUTANT_CALLS:-40000}
make --no-print-directory build/sim >/dev/null

total=0
caught=0
for patch in tests/sim/mutants/*.patch; do
    name=$(basename "$patch" .patch)
    dir=build/mutants/$name
    total=$((total + 1))
    rm -rf "$dir"
    mkdir -p "$dir/tests" "$dir/build"
    cp -a src include sql scripts Makefile "$dir/"
    cp -a tests/sim "$dir/tests/"
    cp -a build/obj build/gen "$dir/build/"
    if ! patch -s -p1 -d "$dir" <"$patch" >"$dir/patch.log" 2>&1; then
        echo "mutant $name: the patch does not apply (see $dir/patch.log)"
        continue
    fi
    if ! make -C "$dir" --no-print-directory build/sim >"$dir/build.log" 2>&1; then
        echo "mutant $name: does not build (see $dir/build.log)"
        continue
    fi
    verdict="NOT caught"
    for seed in $seeds; do
        log="$dir/sim-$seed.log"
        status=0
        "$dir/build/sim" --seed "$seed" --calls "$budget" >"$log" 2>&1 || status=$?
        if grep -q "VIOLATION" "$log"; then
            what=$(grep -m1 "VIOLATION" "$log" | sed 's/^sim: //' | cut -c1-160)
            verdict="caught: $what"
            caught=$((caught + 1))
            break
        fi
        if [ "$status" -ne 0 ]; then
            verdict="NOT caught: the simulator ended with status $status at seed $seed (see $log)"
            break
        fi
    done
    echo "mutant $name: $verdict"
done
echo "mutants: $caught/$total caught"
[ "$caught" -eq "$total" ]
