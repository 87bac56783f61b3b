#!/bin/bash
# vm-run.sh — run a command inside a throw-away QEMU guest that has a soft-RoCE
# (rdma_rxe) device, rxe0, so RDMA code can be tested on hosts without RDMA.
#
# Usage: contrib/softroce/vm-run.sh [--timeout SECS] [--cache DIR] [--verbose]
#            [--smp N] [--mem MB] [--role a|b --net-listen PORT|--net-connect PORT]
#            -- COMMAND [ARGS...]
#
# The guest runs Debian's own kernel (downloaded once with apt-get download)
# under QEMU software emulation (TCG). It mounts the host's root file system
# read-only over 9p and runs COMMAND chrooted into it, in the caller's current
# directory, so host binaries and build trees are used as they are. Writable
# space in the guest: /tmp, /run and /dev/shm (tmpfs, discarded at power-off).
# In the guest, dummy0 has 10.77.0.1/24 and rxe0 is bound to it.
#
# One guest of a pair (see vm-pair.sh): --role a|b gives the guest a virtio
# NIC, eth0, on a QEMU socket link to the other guest (one side listens on
# 127.0.0.1:PORT, the other connects) with 10.78.0.1/24 (a) or 10.78.0.2/24
# (b), and rxe0 is bound to eth0. COMMAND gets FM_ROLE, FM_ADDR and
# FM_PEER_ADDR in its environment.
#
# COMMAND's stdout and stderr are streamed to ours; we exit with its status.
# Exit 77 ("skipped") with "SKIPPED: reason" on stderr if the VM cannot be
# started (no QEMU, no kernel, ...). A run that exceeds --timeout (default
# 600 s) is killed and fails with 124.
#
# The kernel and the initramfs are cached under --cache (default
# ${XDG_CACHE_HOME:-$HOME/.cache}/flowmover-softroce); later runs boot in seconds.

set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
GUEST_INIT="$HERE/guest-init.sh"

TIMEOUT=600
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/flowmover-softroce"
VERBOSE=0
SMP=2
MEM=2048            # MB
ROLE=               # a or b: one guest of a pair
NET_MODE=           # listen or connect (with ROLE)
NET_PORT=
TAIL_PIDS=()        # the tail processes streaming the guest's output
QEMU_PID=
PAIR_NET=10.78.0    # the pair's /24; guest a is .1, guest b is .2

# Modules the guest loads (their dependencies are added automatically).
# crc32_generic is required: without it rdma_rxe fails to initialise.
GUEST_MODULES=(crc32_generic virtio_pci 9p 9pnet_virtio dummy veth virtio_net
               rdma_rxe ib_uverbs rdma_ucm)

log()  { echo "vm-run: $*" >&2; }
die()  { echo "vm-run: error: $*" >&2; exit 1; }
skip() { echo "SKIPPED: soft-RoCE VM: $*" >&2; exit 77; }

usage() {
    echo "usage: $0 [--timeout SECS] [--cache DIR] [--verbose] [--smp N] [--mem MB]" \
         "[--role a|b --net-listen PORT|--net-connect PORT] -- COMMAND [ARGS...]" >&2
    exit 2
}

parse_args() {
    while [ $# -gt 0 ]; do
        case "$1" in
            --timeout) TIMEOUT=${2:?--timeout needs a value}; shift 2 ;;
            --cache)   CACHE=${2:?--cache needs a value}; shift 2 ;;
            -v|--verbose) VERBOSE=1; shift ;;
            --smp)     SMP=${2:?--smp needs a value}; shift 2 ;;
            --mem)     MEM=${2:?--mem needs a value}; shift 2 ;;
            --role)    ROLE=${2:?--role needs a value}; shift 2 ;;
            --net-listen)  NET_MODE=listen; NET_PORT=${2:?--net-listen needs a port}; shift 2 ;;
            --net-connect) NET_MODE=connect; NET_PORT=${2:?--net-connect needs a port}; shift 2 ;;
            -h|--help) usage ;;
            --) shift; break ;;
            *) usage ;;
        esac
    done
    [ $# -gt 0 ] || usage
    [[ "$TIMEOUT" =~ ^[0-9]+$ ]] || die "--timeout must be a number of seconds"
    [[ "$SMP$MEM" =~ ^[0-9]+$ ]] || die "--smp and --mem must be numbers"
    case "$ROLE:$NET_MODE" in
        :) ;;
        [ab]:listen|[ab]:connect) [[ "$NET_PORT" =~ ^[0-9]+$ ]] || die "bad port $NET_PORT" ;;
        *) die "--role a|b and one of --net-listen/--net-connect go together" ;;
    esac
    COMMAND=("$@")
}

# Everything we need on the host; anything missing means "cannot start".
check_host_tools() {
    local tool
    for tool in qemu-system-x86_64 busybox cpio gzip depmod modprobe dpkg \
                apt-get apt-cache flock timeout sha256sum xz; do
        command -v "$tool" >/dev/null 2>&1 ||
            skip "'$tool' not found (run contrib/softroce/setup-deps.sh)"
    done
    # The guest runs the host's `rdma` tool in the chroot to create rxe0.
    command -v rdma >/dev/null 2>&1 || skip "'rdma' (iproute2) not found"
    # The busybox in the initramfs runs without any library: it must be static.
    BUSYBOX=$(command -v busybox)
    if ldd "$BUSYBOX" >/dev/null 2>&1; then
        BUSYBOX=/bin/busybox   # busybox-static installs here
        if [ ! -x "$BUSYBOX" ] || ldd "$BUSYBOX" >/dev/null 2>&1; then
            skip "busybox is not statically linked (install busybox-static)"
        fi
    fi
}

# Kernel: the package linux-image-amd64 depends on, e.g. linux-image-6.1.0-56-amd64,
# extracted to $CACHE/kernel/<version>. Sets KVER and KDIR.
resolve_kernel() {
    local pkg d
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
          sed -n 's/^ *Depends: \(linux-image-[0-9].*\)$/\1/p' | head -n1) || true
    if [ -n "$pkg" ]; then
        KVER=${pkg#linux-image-}
        if [ ! -d "$CACHE/kernel/$KVER" ]; then
            fetch_kernel "$pkg" || log "could not download $pkg"
        fi
    fi
    if [ -z "$pkg" ] || [ ! -d "$CACHE/kernel/$KVER" ]; then
        # Offline or no apt lists: fall back to any kernel already cached.
        KVER=
        for d in "$CACHE"/kernel/*; do
            case "$d" in *.tmp) ;; *) [ -d "$d" ] && KVER=${d##*/} ;; esac
        done
        [ -n "$KVER" ] ||
            skip "no kernel: cannot download the package linux-image-amd64 depends on (apt-get update?)"
        log "using cached kernel $KVER"
    fi
    KDIR="$CACHE/kernel/$KVER"
}

# Download and unpack one kernel package, and generate its modules.dep
# (Debian ships the modules without it).
fetch_kernel() {
    local pkg=$1 ver=${1#linux-image-} tmp="$CACHE/kernel/${1#linux-image-}.tmp"
    log "downloading and unpacking $pkg (once; cached in $CACHE)"
    rm -rf "$tmp" && mkdir -p "$tmp/deb"
    # apt-get download writes into the current directory.
    (cd "$tmp/deb" && apt-get download -q "$pkg" >&2) || return 1
    dpkg -x "$tmp"/deb/*.deb "$tmp/root" || return 1
    rm -rf "$tmp/deb"
    # Bookworm puts modules in /lib/modules; newer releases in /usr/lib/modules.
    if [ -d "$tmp/root/usr/lib/modules/$ver" ] && [ ! -d "$tmp/root/lib/modules/$ver" ]; then
        mkdir -p "$tmp/root/lib/modules"
        ln -s "../../usr/lib/modules/$ver" "$tmp/root/lib/modules/$ver"
    fi
    depmod -b "$tmp/root" "$ver" || return 1
    mv "$tmp" "$CACHE/kernel/$ver"
    # Each unpacked kernel takes ~400 MB: keep only this one.
    find "$CACHE/kernel" -mindepth 1 -maxdepth 1 ! -name "$ver" -exec rm -rf {} +
}

# The .ko files to insmod, in order, without duplicates.
module_load_order() {
    local m
    for m in "${GUEST_MODULES[@]}"; do
        modprobe -d "$KDIR/root" -S "$KVER" --show-depends "$m" ||
            die "kernel $KVER has no module $m"
    done | awk '$1 == "insmod" && !seen[$2]++ { print $2 }'
}

# Initramfs: static busybox, the modules, modules.order and guest-init.sh as
# /init. Cached under a name that hashes its inputs, so editing guest-init.sh
# or the module list rebuilds it. Sets INITRD.
build_initramfs() {
    local key order tmp ko
    order=$(module_load_order)
    key=$( { echo "$KVER"; echo "$order"; cat "$GUEST_INIT" "$BUSYBOX"; } |
           sha256sum | cut -c1-16)
    INITRD="$CACHE/initramfs-$KVER-$key.cpio.gz"
    [ -f "$INITRD" ] && return 0

    log "building initramfs $INITRD"
    tmp=$(mktemp -d "$CACHE/initramfs.XXXXXX")
    mkdir -p "$tmp/bin" "$tmp/lib/modules"
    cp "$BUSYBOX" "$tmp/bin/busybox"
    cp "$GUEST_INIT" "$tmp/init" && chmod 755 "$tmp/init"
    : >"$tmp/modules.order"
    while read -r ko; do
        case "$ko" in   # busybox insmod wants plain .ko files
            *.ko.xz)  xz -dc "$ko" >"$tmp/lib/modules/$(basename "$ko" .xz)" ;;
            *.ko.zst) zstd -qdc "$ko" >"$tmp/lib/modules/$(basename "$ko" .zst)" ;;
            *.ko.gz)  gzip -dc "$ko" >"$tmp/lib/modules/$(basename "$ko" .gz)" ;;
            *)        cp "$ko" "$tmp/lib/modules/" ;;
        esac
        basename "${ko%.xz}" | sed 's/\.zst$//; s/\.gz$//' >>"$tmp/modules.order"
    done <<<"$order"
    (cd "$tmp" && find . | cpio -o -H newc --quiet | gzip -1) >"$INITRD.tmp"
    mv "$INITRD.tmp" "$INITRD"
    rm -rf "$tmp"
    # Drop images built from older inputs.
    find "$CACHE" -maxdepth 1 -name 'initramfs-*.cpio.gz' ! -path "$INITRD" -delete
}

# Kernel and initramfs, built once; the lock keeps concurrent runs from
# building the same cache at the same time.
prepare_cache() {
    mkdir -p "$CACHE/kernel" || skip "cannot create cache dir $CACHE"
    exec 9>"$CACHE/.lock"
    flock 9
    resolve_kernel
    build_initramfs
    VMLINUZ="$KDIR/root/boot/vmlinuz-$KVER"
    [ -f "$VMLINUZ" ] || skip "no $VMLINUZ in the kernel package"
    extract_vmlinux
    flock -u 9
}

# Booting the compressed vmlinuz costs ~3.5 s of firmware and decompression
# under TCG. The uncompressed ELF vmlinux inside it boots directly (PVH entry,
# Debian kernels have CONFIG_PVH=y) in under a second. Unpack it once: it is
# the xz stream in the bzImage. If that fails we boot vmlinuz instead.
extract_vmlinux() {
    local off
    KERNEL="$VMLINUZ"
    if [ ! -f "$KDIR/vmlinux" ] && [ ! -f "$KDIR/vmlinux.failed" ]; then
        off=$(grep -abo $'\xfd7zXZ\x00' "$VMLINUZ" | head -n1 | cut -d: -f1) || true
        if [ -n "$off" ] &&
           xz -dcq --single-stream <(tail -c +$((off + 1)) "$VMLINUZ") >"$KDIR/vmlinux.tmp" &&
           [ "$(head -c4 "$KDIR/vmlinux.tmp" | od -An -tx1 | tr -d ' ')" = 7f454c46 ]; then
            mv "$KDIR/vmlinux.tmp" "$KDIR/vmlinux"
        else
            log "cannot unpack vmlinux from $VMLINUZ; booting it compressed (slower)"
            rm -f "$KDIR/vmlinux.tmp"; : >"$KDIR/vmlinux.failed"
        fi
    fi
    [ -f "$KDIR/vmlinux" ] && KERNEL="$KDIR/vmlinux"
    return 0
}

# The results share (host side): cmd.sh for the guest, output and status back.
# The command runs through the host's bash, which restores the caller's
# directory; `printf %q` keeps every argument intact.
prepare_results_dir() {
    RESULTS=$(mktemp -d "${TMPDIR:-/tmp}/flowmover-vm.XXXXXX")
    trap cleanup EXIT
    # A signal must end the script through the EXIT trap, which stops QEMU.
    trap 'exit 143' TERM
    trap 'exit 130' INT
    # A work tree under /tmp, /run or /dev/shm would be hidden by the guest's
    # own tmpfs there: share its top directory separately, at the same path.
    SHARE_ARGS=()
    SHARE_APPEND=
    local top
    top=$(git -C "$PWD" rev-parse --show-toplevel 2>/dev/null || echo "$PWD")
    case "$top/" in
        /tmp/*|/run/*|/dev/shm/*)
            if [[ "$top" =~ ^[A-Za-z0-9/._-]+$ ]]; then
                SHARE_ARGS=(-virtfs "local,path=$top,mount_tag=work,security_model=none,readonly=on")
                SHARE_APPEND=" fm.work=$top"
            else
                log "warning: $top is hidden by the guest's own tmpfs; the command will start in /"
            fi ;;
        /proc/*|/sys/*)
            log "warning: $PWD is hidden in the guest; the command will start in /" ;;
    esac
    {
        echo "cd -- $(printf '%q' "$PWD") 2>/dev/null || cd /"
        [ -z "$ROLE" ] || echo "export FM_ROLE=$ROLE FM_ADDR=$(pair_addr "$ROLE")" \
                               "FM_PEER_ADDR=$(pair_addr "$(peer_role)")"
        printf 'exec'; printf ' %q' "${COMMAND[@]}"; echo
    } >"$RESULTS/cmd.sh"
    : >"$RESULTS/stdout"
    : >"$RESULTS/stderr"
}

# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
    local p
    # Killed (vm-pair.sh stops one guest when the other fails): take QEMU
    # down too (timeout passes the signal on to it).
    [ -z "$QEMU_PID" ] || kill "$QEMU_PID" 2>/dev/null || true
    for p in "${TAIL_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    if [ "$VERBOSE" = 1 ]; then log "results kept in $RESULTS"; else rm -rf "$RESULTS"; fi
}

# One guest of a pair: guest a is 1, guest b is 2 (address, MAC).
role_num()  { if [ "$1" = a ]; then echo 1; else echo 2; fi; }
pair_addr() { echo "$PAIR_NET.$(role_num "$1")"; }
peer_role() { if [ "$ROLE" = a ]; then echo b; else echo a; fi; }

# A guest of a pair gets a virtio NIC (eth0) on a QEMU socket link, a TCP
# connection between the two QEMUs that carries the Ethernet frames, and the
# guest is told (kernel command line) to put its address and rxe0 on eth0.
# Sets NET_ARGS and NET_APPEND (both empty for a single guest).
pair_net_args() {
    NET_ARGS=()
    NET_APPEND=
    [ -n "$ROLE" ] || return 0
    NET_ARGS=(-netdev "socket,id=n0,$NET_MODE=127.0.0.1:$NET_PORT"
              -device "virtio-net-pci,netdev=n0,mac=52:54:00:78:00:0$(role_num "$ROLE")")
    NET_APPEND=" fm.role=$ROLE fm.netdev=eth0 fm.addr=$(pair_addr "$ROLE")/24"
}

# QEMU's connect= fails at once if nobody listens yet, and the listening
# guest's vm-run.sh may still be building the cache. Wait for its QEMU to
# listen, reading /proc/net/tcp (state 0A = LISTEN): a probe connection
# would be taken for the link itself. If it never listens, the pair cannot
# start: skip.
wait_for_listener() {
    local hex _
    [ "$NET_MODE" = connect ] || return 0
    hex=$(printf '0100007F:%04X' "$NET_PORT")
    for _ in $(seq 600); do
        awk -v a="$hex" '$2 == a && $4 == "0A" { f = 1 } END { exit !f }' /proc/net/tcp &&
            return 0
        sleep 0.2
    done
    skip "nothing listens on 127.0.0.1:$NET_PORT (the other guest of the pair did not start)"
}

# Boot the guest under TCG (nested KVM hangs on these hosts) with the host
# root read-only and the results dir writable, both over virtio-9p. The
# serial console goes to a log file; stdin/tty are left alone.
run_qemu() {
    local qemu_status=0
    timeout --kill-after=10 "$TIMEOUT" \
        qemu-system-x86_64 \
            -accel tcg -cpu max -m "$MEM" -smp "$SMP" \
            -nodefaults -display none -no-reboot \
            -serial "file:$RESULTS/console.log" -monitor none \
            -kernel "$KERNEL" -initrd "$INITRD" \
            -append "console=ttyS0 quiet panic=-1$SHARE_APPEND$NET_APPEND" \
            -virtfs "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap" \
            -virtfs "local,path=$RESULTS,mount_tag=results,security_model=none" \
            "${SHARE_ARGS[@]}" "${NET_ARGS[@]}" \
            </dev/null >"$RESULTS/qemu.log" 2>&1 &
    QEMU_PID=$!
    stream_output
    wait "$QEMU_PID" || qemu_status=$?
    QEMU_END=$EPOCHREALTIME
    QEMU_PID=
    wait "${TAIL_PIDS[@]}" 2>/dev/null || true
    TAIL_PIDS=()
    return "$qemu_status"
}

# Follow the command's output files while the guest runs. tail --pid reads
# to the end once QEMU (and so the guest) has gone, so nothing is lost.
stream_output() {
    tail -n +1 -f -s 0.2 --pid="$QEMU_PID" "$RESULTS/stdout" &
    TAIL_PIDS=($!)
    tail -n +1 -f -s 0.2 --pid="$QEMU_PID" "$RESULTS/stderr" >&2 &
    TAIL_PIDS+=($!)
}

show_console() {
    log "---- guest console (last 40 lines) ----"
    tail -n 40 "$RESULTS/console.log" 2>/dev/null | tr -d '\r' >&2 || true
    log "---- qemu ----"
    cat "$RESULTS/qemu.log" >&2 || true
}

main() {
    local start elapsed ready qemu_status=0 status
    parse_args "$@"
    check_host_tools
    prepare_cache
    prepare_results_dir
    pair_net_args
    wait_for_listener

    start=$EPOCHREALTIME
    run_qemu || qemu_status=$?
    elapsed=$(awk -v a="$start" -v b="$QEMU_END" 'BEGIN { printf "%.1f", b - a }')
    [ "$VERBOSE" = 1 ] && show_console

    if [ "$qemu_status" = 124 ] || [ "$qemu_status" = 137 ]; then
        show_console
        log "FAILED: timed out after $TIMEOUT s; QEMU killed"
        exit 124
    fi
    if [ ! -f "$RESULTS/booted" ]; then
        # QEMU never got a guest as far as the shares: if QEMU itself failed
        # and the guest printed nothing, it could not start at all.
        show_console
        if [ "$qemu_status" != 0 ] && [ ! -s "$RESULTS/console.log" ]; then
            skip "qemu-system-x86_64 failed to start (status $qemu_status)"
        fi
        die "the guest did not come up (QEMU status $qemu_status)"
    fi
    if [ -f "$RESULTS/setup-failed" ]; then
        show_console
        die "guest setup failed: $(cat "$RESULTS/setup-failed")"
    fi
    if [ ! -f "$RESULTS/status" ]; then
        show_console
        die "the guest stopped before the command finished (QEMU status $qemu_status)"
    fi
    status=$(cat "$RESULTS/status")
    ready=$(awk -v a="$start" -v b="$(stat -c %.3Y "$RESULTS/ready")" 'BEGIN { printf "%.1f", b - a }')
    log "guest ready (rxe0 up) $ready s after QEMU start; QEMU ran $elapsed s; command exit status $status"
    exit "$status"
}

main "$@"
