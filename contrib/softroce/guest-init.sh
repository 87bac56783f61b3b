#!/bin/busybox sh
# shellcheck shell=dash
# /init of the soft-RoCE test-bed guest (packed into the initramfs by vm-run.sh).
#
# Runs as PID 1 under busybox. It loads the kernel modules, mounts the host's
# root file system (read-only, 9p tag "host") and the writable results share
# (9p tag "results"), creates a soft-RoCE device rxe0 on dummy0, then runs
# /run/flowmover/cmd.sh chrooted into the host root and powers off.
#
# Kernel command line (set by vm-run.sh): fm.netdev=IF and fm.addr=ADDR/LEN
# put rxe0 on that interface and address instead (eth0 of a two-guest pair);
# fm.work=DIR mounts the caller's work tree (9p tag "work") at DIR.
#
# Protocol with vm-run.sh, all files in the results share:
#   cmd.sh        written by the host: the command to run (bash script)
#   booted        written here once the shares are mounted (guest uptime)
#   ready         written here once rxe0 is up, just before the command runs
#   setup-failed  written here if the guest could not be prepared (reason)
#   stdout/stderr the command's output (appended; the host streams them)
#   status        the command's exit status, written last

export PATH=/bin
HOST=/host            # where the host root is mounted in the guest
RES=/results          # where the results share is mounted in the guest
RES_IN_CHROOT=/run/flowmover
RXE_NETDEV=dummy0      # default; fm.netdev= overrides
RXE_ADDR=10.77.0.1/24  # default; fm.addr= overrides

/bin/busybox mkdir -p /bin /proc /sys /dev "$HOST" "$RES"
/bin/busybox --install -s /bin

log() { echo "guest-init: $*"; }

# The value of NAME=VALUE on the kernel command line ("" if absent).
kernel_arg() {
    tr ' ' '\n' </proc/cmdline | sed -n "s/^$1=//p"
}

# Stop the guest. -f: there is nothing to shut down cleanly; the results
# share is 9p without caching, so everything written has reached the host.
halt() {
    sync
    poweroff -f
    sleep 10   # poweroff -f does not return; just in case
}

# Record why the guest could not run the command, then stop.
setup_failed() {
    log "SETUP FAILED: $*"
    [ -d "$RES" ] && echo "$*" >"$RES/setup-failed"
    halt
}

mount_pseudo_fs() {
    mount -t proc proc /proc
    mount -t sysfs sysfs /sys
    mount -t devtmpfs devtmpfs /dev
}

# /modules.order lists the .ko files in dependency order (built on the host
# with modprobe --show-depends).
load_modules() {
    local ko
    while read -r ko; do
        insmod "/lib/modules/$ko" || setup_failed "insmod $ko failed"
    done </modules.order
}

mount_shares() {
    mount -t 9p -o trans=virtio,version=9p2000.L,ro host "$HOST" ||
        setup_failed "cannot mount the host root (9p tag host)"
    # Without the results share nothing can be reported; just stop.
    mount -t 9p -o trans=virtio,version=9p2000.L,rw results "$RES" ||
        { log "cannot mount the results share"; halt; }
    cut -d' ' -f1 /proc/uptime >"$RES/booted"
}

# The host root is read-only: give the chroot its own pseudo file systems and
# writable tmpfs scratch space on /tmp, /run and /dev/shm, and make the
# results share visible inside it at $RES_IN_CHROOT.
prepare_chroot() {
    mount -t proc proc "$HOST/proc"
    mount -t sysfs sysfs "$HOST/sys"
    mount -t devtmpfs devtmpfs "$HOST/dev"
    mkdir -p "$HOST/dev/pts" "$HOST/dev/shm"
    mount -t devpts devpts "$HOST/dev/pts"
    mount -t tmpfs -o mode=1777 tmpfs "$HOST/dev/shm"
    mount -t tmpfs -o mode=1777 tmpfs "$HOST/tmp"
    mount -t tmpfs -o mode=755 tmpfs "$HOST/run"
    mkdir -p "$HOST$RES_IN_CHROOT"
    mount --bind "$RES" "$HOST$RES_IN_CHROOT"
    # the caller's work tree, when it lives under one of those tmpfs
    local work
    work=$(kernel_arg fm.work)
    if [ -n "$work" ]; then
        mkdir -p "$HOST$work"
        mount -t 9p -o trans=virtio,version=9p2000.L,ro work "$HOST$work" ||
            setup_failed "cannot mount the work tree $work (9p tag work)"
    fi
}

# dummy0 (created by the dummy module) carries the address; rxe0 rides on it.
# rxe delivers to its own address, so a server and a client in this guest
# can talk RDMA to each other. In a two-guest pair the virtio NIC (eth0)
# carries it instead, and rxe0 reaches the other guest over QEMU's link.
# `rdma` is not in busybox: use the host's.
setup_rdma() {
    local netdev addr
    netdev=$(kernel_arg fm.netdev); netdev=${netdev:-$RXE_NETDEV}
    addr=$(kernel_arg fm.addr); addr=${addr:-$RXE_ADDR}
    ip link set lo up
    ip link set "$netdev" up || setup_failed "no $netdev"
    ip addr add "$addr" dev "$netdev"
    chroot "$HOST" rdma link add rxe0 type rxe netdev "$netdev" ||
        setup_failed "rdma link add rxe0 failed (is rdma from iproute2 installed on the host?)"
    cut -d' ' -f1 /proc/uptime >"$RES/ready"
}

# Run the command in the host root. Clean environment, unlimited locked memory
# (RDMA memory registration pins pages).
run_command() {
    local status
    ulimit -l unlimited
    env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        HOME=/tmp TMPDIR=/tmp TERM=dumb LANG=C.UTF-8 \
        chroot "$HOST" /bin/bash "$RES_IN_CHROOT/cmd.sh" \
        </dev/null >>"$RES/stdout" 2>>"$RES/stderr"
    status=$?
    echo "$status" >"$RES/status"
}

mount_pseudo_fs
load_modules
mount_shares
prepare_chroot
setup_rdma
run_command
halt
