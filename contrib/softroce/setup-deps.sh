#!/bin/bash
# setup-deps.sh — install what the soft-RoCE test bed (vm-run.sh) needs on a
# Debian 12 host. Idempotent: only missing packages are installed.
#
# Usage: contrib/softroce/setup-deps.sh      (as root, or with sudo available)
#
# The guest kernel itself is not installed here: vm-run.sh downloads it with
# `apt-get download` into its cache on first use.

set -euo pipefail

PACKAGES=(
    qemu-system-x86    # the emulator (guests run under TCG)
    busybox-static     # /init and tools of the guest's initramfs
    kmod               # depmod/modprobe to work out module load order
    cpio               # packs the initramfs
    xz-utils           # unpacks vmlinux from the kernel image
    iproute2           # `rdma link add` (run from the host root in the guest)
    rdma-core          # RDMA userspace
    ibverbs-providers  # librxe, the verbs provider for rxe0
    ibverbs-utils      # ibv_devinfo
    perftest           # ib_write_bw / ib_write_lat reference figures
)

SUDO=
[ "$(id -u)" = 0 ] || SUDO=sudo

# Installed = dpkg status "install ok installed".
missing=()
for pkg in "${PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    [ "$status" = "install ok installed" ] || missing+=("$pkg")
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "setup-deps.sh: all soft-RoCE test-bed packages are installed"
    exit 0
fi

echo "setup-deps.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
