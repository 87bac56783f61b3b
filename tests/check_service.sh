#!/bin/bash
# check_service.sh - contrib/moverd.service passes `systemd-analyze verify`
# with no warning (its ExecStart pointed at the moverd just built: verify
# wants the binary to exist), and contrib/moverd.conf is a config moverd
# accepts.  The unit's hardening holds: moverd as user and group
# flowmover without capabilities, a state directory, no ProtectProc=
# invisible (moverd reads its clients' /proc/PID/stat), the address
# families and system calls moverd uses allowed, and `systemd-analyze
# security` exposure 2.5 at most (systemd 250+).  Exit 77 (skipped)
# without systemd-analyze.
# usage: check_service.sh MOVERD SOURCE_DIR
set -uo pipefail
moverd=$1 src=$2
"$moverd" --config "$src/contrib/moverd.conf" --help >/dev/null ||
    { echo "check_service: moverd refuses contrib/moverd.conf" >&2; exit 1; }
if ! command -v systemd-analyze >/dev/null; then
    echo "check_service: SKIPPED: systemd-analyze is absent (install systemd)"
    exit 77
fi
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
sed "s|^ExecStart=/usr/sbin/moverd|ExecStart=$moverd|" \
    "$src/contrib/moverd.service" > "$tmp/moverd.service"
grep -q "^ExecStart=$moverd " "$tmp/moverd.service" ||
    { echo "check_service: no ExecStart=/usr/sbin/moverd line" >&2; exit 1; }
out=$(systemd-analyze verify --man=no "$tmp/moverd.service" 2>&1)
rc=$?
if [ $rc != 0 ] || [ -n "$out" ]; then
    echo "check_service: systemd-analyze verify (exit $rc):" >&2
    echo "$out" >&2
    exit 1
fi

fail=0
bad() { echo "check_service: $*" >&2; fail=1; }
unit=$src/contrib/moverd.service
# the last assignment of KEY (systemd: a later line wins, or adds)
val() { sed -n "s/^$1=//p" "$unit" | tail -n 1; }
[ "$(val User)" = flowmover ] || bad "User= is '$(val User)', not flowmover"
[ "$(val Group)" = flowmover ] || bad "Group= is '$(val Group)', not flowmover"
grep -qx 'CapabilityBoundingSet=' "$unit" && [ -z "$(val CapabilityBoundingSet)" ] ||
    bad "CapabilityBoundingSet= is not empty: moverd needs no capability"
[ -z "$(val AmbientCapabilities)" ] || bad "AmbientCapabilities= grants some"
[ "$(val StateDirectory)" = flowmover ] || bad "no StateDirectory=flowmover"
[ "$(val StateDirectoryMode)" = 0700 ] || bad "StateDirectoryMode= is not 0700"
[ "$(val UMask)" = 0077 ] || bad "UMask= is not 0077"
grep -q '^ProtectProc=invisible' "$unit" &&
    bad "ProtectProc=invisible hides the clients' /proc/PID/stat moverd reads"
for af in AF_UNIX AF_INET AF_INET6 AF_NETLINK; do
    grep -q "^RestrictAddressFamilies=.*\b$af\b" "$unit" ||
        bad "RestrictAddressFamilies= lacks $af"
done

# What moverd calls (strace -f of two moverd over TCP: flows local and
# between them, a reload, /metrics, a stop), and what its code and RDMA's
# libraries call besides (setrlimit, --cpus, the futex_waitv doorbell,
# ioctl on /dev/infiniband): each must pass SystemCallFilter=.
needed="accept4 arch_prctl bind brk chmod clone3 close connect dup
 eventfd2 execve exit exit_group fallocate fchmod fchmodat fcntl flock
 fstatfs ftruncate futex futex_waitv getdents64 getegid geteuid getgid
 getpeername getpid getrandom getrusage getsockname getsockopt gettid
 getuid io_uring_enter io_uring_register io_uring_setup ioctl listen lseek
 madvise membarrier memfd_create mkdirat mmap mprotect munmap newfstatat
 openat poll pread64 prlimit64 pwrite64 read readlink recvfrom recvmsg
 renameat rseq rt_sigaction rt_sigprocmask sched_getaffinity
 sched_setaffinity sched_yield sendmsg sendto set_robust_list
 set_tid_address setrlimit setsockopt shutdown signalfd4 socket statfs
 timerfd_create umask uname unlink unlinkat write"
declare -A expanded
expand() { # a syscall or @set: its syscalls, one a line
    local s
    case $1 in
    @*) if [ -z "${expanded[$1]+x}" ]; then
            expanded[$1]=$(systemd-analyze syscall-filter --no-pager "$1" |
                sed -n '2,$p' | sed 's/^ *//; /^#/d; /^$/d' |
                while read -r s; do expand "$s"; done)
        fi
        printf '%s\n' "${expanded[$1]}" ;;
    *) echo "$1" ;;
    esac
}
allowed='' denied=''
while read -r line; do
    case $line in
    '~'*) for s in ${line#\~}; do denied+=$'\n'$(expand "$s"); done ;;
    *) for s in $line; do allowed+=$'\n'$(expand "$s"); done ;;
    esac
done < <(sed -n 's/^SystemCallFilter=//p' "$unit")
if [ -z "$allowed" ]; then
    bad "no SystemCallFilter= allow list (@system-service)"
else
    for s in $needed; do
        if ! grep -qx "$s" <<<"$allowed" || grep -qx "$s" <<<"$denied"; then
            bad "SystemCallFilter= does not allow $s, which moverd calls"
        fi
    done
fi

sa_help=$(systemd-analyze security --help 2>/dev/null)   # (no grep -q in a pipe)
if grep -q -- --offline <<<"$sa_help"; then
    exposure=$(cd "$tmp" && systemd-analyze security --offline=yes \
        --no-pager ./moverd.service 2>&1 |
        sed -n 's/.*Overall exposure level for moverd.service: \([0-9.]*\).*/\1/p')
    if [ -z "$exposure" ]; then
        bad "systemd-analyze security gave no exposure level"
    elif ! awk -v e="$exposure" 'BEGIN { exit !(e <= 2.5) }'; then
        bad "systemd-analyze security: exposure $exposure, more than 2.5"
    else
        echo "check_service: systemd-analyze security: exposure $exposure"
    fi
fi
[ $fail = 0 ] || exit 1
echo "check_service: moverd.service verified clean and hardened; moverd.conf accepted"
