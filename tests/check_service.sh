#!/bin/bash
# check_service.sh - contrib/moverd.service passes `systemd-analyze verify`
# with no warning (its ExecStart pointed at the moverd just built: verify
# wants the binary to exist), and contrib/moverd.conf is a config moverd
# accepts.  Exit 77 (skipped) without systemd-analyze.
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
echo "check_service: moverd.service verified clean; moverd.conf accepted"
