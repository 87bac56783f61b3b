#!/bin/bash
# install-deps.sh - everything flowmover needs to build and test on Debian 12.
# Both README commands run it first; it is idempotent.
set -euo pipefail

PACKAGES=(
    build-essential cmake pkg-config      # toolchain
    libibverbs-dev librdmacm-dev          # rdma-core: verbs and rdma_cm
    liburing-dev                          # io_uring event loop and TCP transport
    libprotobuf-c-dev protobuf-c-compiler # control protocol
    libsodium-dev                         # peer keys: HMAC, random nonces,
                                          # constant-time compare (auth.c)
    libsystemd-dev                        # sd_notify: Type=notify, watchdog
                                          # (moverd/notify.c)
    systemd                               # systemd-analyze verify of the unit
    groff-base man-db                     # man pages checked (tests/check_man.sh)
    dpkg-dev                              # cpack -G DEB: dpkg-shlibdeps
    clang libclang-rt-14-dev              # libFuzzer targets, sanitizer runtimes
    iproute2 procps util-linux            # ip netns/veth, pkill, setpriv
    iperf3                                # TCP reference in benchmarks
    sockperf                              # TCP ping-pong floor of flowbench's
                                          # latency runs (issue 12)
    python3                               # demo: picks a free port
    libmicrohttpd-dev                     # moverd --metrics (metrics_http.c)
    prometheus curl                       # test_metrics: a real Prometheus
                                          # scrapes --metrics; promtool
                                          # checks contrib/prometheus rules
    tmux                                  # test_metrics: moverctl top in a
                                          # real 80x24 terminal
    python3-dev python3-pytest            # the flowshm Python module, its
    python3-numpy                         # tests, contrib/pipeline
)

SUDO=
[ "$(id -u)" = 0 ] || SUDO=sudo

missing=()
for pkg in "${PACKAGES[@]}"; do
    [ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)" = \
      "install ok installed" ] || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: installing ${missing[*]}"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q \
        --no-install-recommends "${missing[@]}"
fi
# The soft-RoCE test bed (QEMU, perftest, rdma tools) has its own list.
"$(dirname "$0")/softroce/setup-deps.sh"
