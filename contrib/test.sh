#!/bin/bash
# test.sh - build flowmover and run every test, the way CI does.
#   1. install dependencies (Debian 12)
#   2. release build: all tests, including the soft-RoCE VM tests
#   3. AddressSanitizer + UndefinedBehaviorSanitizer build: all host tests,
#      and moverd over RDMA in the soft-RoCE guest (two of the VM tests)
#   4. ThreadSanitizer build: the lock-free ring tests
#   5. clang libFuzzer build: bounded fuzzing of every parser
#   6. Release (-O3) build: compiles with no warning (gcc's truncation and
#      fall-through checks see more there than at -O2); no tests
# Usage: contrib/test.sh [--quick]   (--quick: step 2 only, no VM tests)
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
jobs=$(nproc)
quick=0
[ "${1:-}" = --quick ] && quick=1

step() { printf '\n=== %s ===\n' "$*"; }

build() { # build DIR [cmake args...]
    local dir=$1; shift
    cmake -S "$top" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
    cmake --build "$dir" -j "$jobs"
}

step "dependencies"
contrib/install-deps.sh

# CI runs on a throwaway machine, as root: there the Debian package test
# may dpkg -i, start and remove the package (tests/check_package.sh)
[ "${CI:-}" = true ] && export FM_PACKAGE_TEST=1

step "release build and tests"
build build
if [ $quick = 1 ]; then
    (cd build && ctest --output-on-failure -LE vm)
    exit 0
fi
(cd build && ctest --output-on-failure)

step "AddressSanitizer + UndefinedBehaviorSanitizer"
build build-asan -DFM_SANITIZE=address,undefined
# The python label runs here too: its ctest entry preloads libasan into
# /usr/bin/python3 for the ASan-built module (python/tests/CMakeLists.txt).
# scale (10 000 flows) runs in the release build only.
(cd build-asan && FM_STRESS_RECORDS=100000 \
    ctest --output-on-failure -LE 'vm|package|scale')
# moverd's RDMA code under the sanitizers: the two-daemon cases, the
# registrations off the loop and one flow's trouble (their scripts read
# the daemons' logs for reports).  The others add guest time, not code paths.
(cd build-asan && ctest --output-on-failure -R '^rdma_(remote|reg_offloop|flow_alone)_vm$')

step "ThreadSanitizer (lock-free ring)"
CC=clang build build-tsan -DFM_SANITIZE=thread
(cd build-tsan && ctest --output-on-failure -L tsan)

step "libFuzzer (bounded)"
CC=clang build build-fuzz -DFM_FUZZ=ON -DFM_SANITIZE=address,undefined
(cd build-fuzz && ctest --output-on-failure -L fuzz)

step "Release (-O3) build, no tests"
build build-O3 -DCMAKE_BUILD_TYPE=Release
