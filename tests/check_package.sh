#!/bin/bash
# check_package.sh - the Debian package, for real (issue 10): build the
# .deb (cpack -G DEB, prefix /usr), check its Depends and files, install
# it with dpkg -i (the flowmover user and group created, the unit enabled;
# installed again after a disable: it stays disabled), start the installed
# moverd (systemctl start where systemd is PID 1, else the unit's
# ExecStart line by hand as the unit would: its User=, Group=, UMask=, no
# capability, its runtime and state directories made as systemd makes
# them), check that it runs as flowmover without capabilities with a
# flowmover key and its rings in /var/lib/flowmover, that its socket lets
# root and group flowmover in and no one else, create a flow with the
# installed moverctl and move records through it with the installed
# flowdemo, compile a program against the installed libflowshm
# (pkg-config), stop moverd, and remove the package (dpkg --purge: the
# unit's symlinks, /run/flowmover and /var/lib/flowmover gone; the user
# stays, as Debian packages leave them, and is removed by this script if
# it made it).
#
# It installs into this machine's /usr and /etc, so it runs only with
# FM_PACKAGE_TEST=1 (contrib/test.sh sets it in CI, CI=true: a throwaway
# machine) and as root; otherwise it is skipped (exit 77).
# usage: check_package.sh SOURCE_DIR
set -euo pipefail
src=$1
if [ "${FM_PACKAGE_TEST:-}" != 1 ]; then
    echo "check_package: SKIPPED: installs a package on this machine; set FM_PACKAGE_TEST=1 (CI does)"
    exit 77
fi
[ "$(id -u)" = 0 ] || { echo "check_package: SKIPPED: needs root" ; exit 77; }
if dpkg-query -W -f='${Status}' flowmover 2>/dev/null | grep -q installed; then
    echo "check_package: flowmover is installed already; not touching it" >&2
    exit 1
fi
if [ -e /run/flowmover/moverd.sock ]; then
    echo "check_package: a moverd runs on /run/flowmover/moverd.sock" >&2
    exit 1
fi

tmp=$(mktemp -d /tmp/fm-package.XXXXXX)
pid=
systemd=0
[ -d /run/systemd/system ] && [ "$(ps -p 1 -o comm=)" = systemd ] && systemd=1
had_user=0
getent passwd flowmover >/dev/null && had_user=1
had_group=0
getent group flowmover >/dev/null && had_group=1
unit=/usr/lib/systemd/system/moverd.service
wants=/etc/systemd/system/multi-user.target.wants/moverd.service
cleanup() {
    set +e
    if [ $systemd = 1 ]; then
        systemctl stop moverd.service
    elif [ -n "$pid" ]; then
        kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    fi
    rm -f /etc/flowmover/peer.key
    dpkg --purge flowmover >/dev/null 2>&1
    [ $had_user = 1 ] || userdel flowmover 2>/dev/null
    [ $had_group = 1 ] || groupdel flowmover 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
step() { printf 'check_package: %s\n' "$*"; }

step "build and cpack -G DEB (prefix /usr)"
cmake -S "$src" -B "$tmp/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_INSTALL_PREFIX=/usr -DBUILD_TESTING=OFF >/dev/null
cmake --build "$tmp/build" -j "$(nproc)" >/dev/null
(cd "$tmp/build" && cpack -G DEB >/dev/null)
deb=$(ls "$tmp"/build/flowmover_*.deb)
dpkg-deb -I "$deb" | sed 's/^/    /'

step "Depends (dpkg-shlibdeps) and files"
deps=$(dpkg-deb -f "$deb" Depends)
for lib in adduser libc6 liburing2 libprotobuf-c1 libibverbs1 librdmacm1 libsodium23 libsystemd0; do
    grep -q "$lib" <<<"$deps" || { echo "Depends lacks $lib: $deps" >&2; exit 1; }
done
files=$(dpkg-deb -c "$deb" | awk '{print $6}')
for f in ./usr/sbin/moverd ./usr/bin/moverctl ./usr/bin/flowdemo \
         ./usr/include/flowshm.h ./usr/lib/systemd/system/moverd.service \
         ./etc/flowmover/moverd.conf ./usr/share/man/man8/moverd.8 \
         ./usr/share/man/man8/moverctl.8 ./usr/share/man/man5/moverd.conf.5 \
         ./usr/share/man/man3/flowshm.3; do
    grep -qx -- "$f" <<<"$files" || { echo "the package lacks $f" >&2; exit 1; }
done
for f in 'libflowshm\.so\.0' 'libflowshm\.a' 'pkgconfig/flowshm\.pc'; do
    grep -q -- "$f" <<<"$files" || { echo "the package lacks $f" >&2; exit 1; }
done
# (captured, then grepped: grep -q leaving early would fail the pipe)
conffiles=$(dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles)
grep -qx /etc/flowmover/moverd.conf <<<"$conffiles" ||
    { echo "moverd.conf is not a conffile" >&2; exit 1; }

step "dpkg -i: the flowmover user and group, the unit enabled"
dpkg -i "$deb"
IFS=: read -r _ _ uid gid _ home shell < <(getent passwd flowmover) ||
    { echo "postinst made no user flowmover" >&2; exit 1; }
fm_gid=$(getent group flowmover | cut -d: -f3)
echo "    flowmover: uid $uid gid $gid home $home shell $shell"
[ "$gid" = "$fm_gid" ] && [ "$home" = /nonexistent ] && [ "$uid" -lt 1000 ] ||
    { echo "flowmover is not a system user of group flowmover" >&2; exit 1; }
[ -L "$wants" ] ||
    { echo "a first install did not enable moverd.service ($wants)" >&2; exit 1; }

step "dpkg -i again, after a disable: the unit stays disabled, the user is kept"
systemctl disable moverd.service   # offline too: it edits the symlinks
dpkg -i "$deb"
[ ! -e "$wants" ] ||
    { echo "the upgrade enabled moverd.service again" >&2; exit 1; }
[ "$(id -u flowmover)" = "$uid" ] || { echo "the user changed" >&2; exit 1; }
systemctl enable moverd.service

step "config: a flow, a peer key of flowmover's, rings in /var/lib/flowmover"
/usr/bin/moverctl keygen /etc/flowmover/peer.key
chown flowmover:flowmover /etc/flowmover/peer.key
cat >> /etc/flowmover/moverd.conf <<'CONF'
peer-key = /etc/flowmover/peer.key
state-dir = /var/lib/flowmover
flow = pkgtest ring-size=1M
# the config's flows are the operator's, moverd's own user's: no per-uid
# quota holds them (before, the third was refused as uid flowmover's)
max-flows-per-uid = 2
flow = pkgq1 ring-size=64K
flow = pkgq2 ring-size=64K
CONF

if [ $systemd = 1 ]; then
    # postinst may have started it already, before the config above
    step "systemctl restart moverd"
    systemctl restart moverd.service
    systemctl is-active moverd.service
    pid_check=$(systemctl show -p MainPID --value moverd.service)
else
    step "no systemd (PID 1 is $(ps -p 1 -o comm=)): the unit's ExecStart by hand, as the unit runs it"
    unit_val() { sed -n "s/^$1=//p" "$unit" | tail -n 1; }
    exec_start=$(unit_val ExecStart)
    user=$(unit_val User) group=$(unit_val Group) mask=$(unit_val UMask)
    echo "    User=$user Group=$group UMask=$mask: $exec_start"
    # RuntimeDirectory= and StateDirectory= as systemd makes them
    install -d -o "$user" -g "$group" -m "$(unit_val RuntimeDirectoryMode)" \
        "/run/$(unit_val RuntimeDirectory)"
    install -d -o "$user" -g "$group" -m "$(unit_val StateDirectoryMode)" \
        "/var/lib/$(unit_val StateDirectory)"
    (
        ulimit -l unlimited 2>/dev/null ||
            echo "    (RLIMIT_MEMLOCK cannot be raised here: left as it is)"
        umask "$mask"
        # shellcheck disable=SC2086  # the unit's words, as systemd splits them
        exec setpriv --reuid="$user" --regid="$group" --init-groups \
            --inh-caps=-all --bounding-set=-all --no-new-privs $exec_start
    ) &
    pid=$!
    pid_check=$pid
fi
for _ in $(seq 100); do
    /usr/bin/moverctl status >/dev/null 2>&1 && break
    sleep 0.1
done
/usr/bin/moverctl status

step "moverd runs as flowmover, without capabilities"
read -r ruid euid _ < <(awk '/^Uid:/ {print $2, $3}' "/proc/$pid_check/status")
capeff=$(awk '/^CapEff:/ {print $2}' "/proc/$pid_check/status")
capprm=$(awk '/^CapPrm:/ {print $2}' "/proc/$pid_check/status")
echo "    pid $pid_check: uid $ruid euid $euid CapEff $capeff CapPrm $capprm"
[ "$ruid" = "$uid" ] && [ "$euid" = "$uid" ] ||
    { echo "moverd does not run as flowmover" >&2; exit 1; }
[ "$((16#$capeff))" = 0 ] && [ "$((16#$capprm))" = 0 ] ||
    { echo "moverd has capabilities" >&2; exit 1; }
ls -l /run/flowmover /var/lib/flowmover | sed 's/^/    /'
for f in /run/flowmover/moverd.sock:660 /run/flowmover/moverd.sock.counters:640 \
         /var/lib/flowmover/pkgtest.ring:600; do
    got=$(stat -c '%U:%G %a' "${f%:*}")
    [ "$got" = "flowmover:flowmover ${f##*:}" ] ||
        { echo "${f%:*}: $got, not flowmover:flowmover ${f##*:}" >&2; exit 1; }
done

step "declared flows past --max-flows-per-uid: the operator's, no quota"
for f in pkgq1 pkgq2; do
    /usr/bin/moverctl flow show "$f" >/dev/null ||
        { echo "declared flow $f was not created" >&2; exit 1; }
done

step "the socket: group flowmover may connect, others may not"
nobody_uid=64998      # no such user: only the group decides
setpriv --reuid=$nobody_uid --regid=$nobody_uid --groups="$fm_gid" \
    /usr/bin/moverctl status >/dev/null ||
    { echo "a member of group flowmover cannot reach moverd" >&2; exit 1; }
if out=$(setpriv --reuid=$nobody_uid --regid=$nobody_uid --clear-groups \
         /usr/bin/moverctl status 2>&1); then
    echo "a user outside group flowmover reached moverd" >&2; exit 1
fi
echo "    outside the group: $out"

step "the installed moverctl and flowdemo"
/usr/bin/moverctl flow show pkgtest     # declared in the installed config
/usr/bin/flowdemo consume pkgtest --count 100000 > "$tmp/consume.out" &
cons=$!
/usr/bin/flowdemo produce pkgtest --count 100000
wait $cons
cat "$tmp/consume.out"

step "a program built against the installed libflowshm (pkg-config)"
cat > "$tmp/t.c" <<'C'
#include <flowshm.h>
#include <stdio.h>
int main(void)
{
	flowshm_t *f;
	int rc = flowshm_attach("pkgtest", FLOWSHM_PRODUCER, NULL, &f);

	if (rc) {
		printf("attach: %s\n", flowshm_attach_error());
		return 1;
	}
	rc = flowshm_send(f, "x", 1, 0);
	flowshm_detach(f);
	printf("sent one record through libflowshm %s: %s\n", FLOWSHM_VERSION,
	       flowshm_strerror(rc));
	return rc != 0;
}
C
cc -o "$tmp/t" "$tmp/t.c" $(pkg-config --cflags --libs flowshm)
libs=$(ldd "$tmp/t")
grep -qE 'libflowshm.so.0 => /(usr/)?lib/' <<<"$libs" ||
    { echo "the program does not use the installed libflowshm.so" >&2; exit 1; }
"$tmp/t"
man -w moverd moverctl flowshm moverd.conf | sed 's/^/    /'

step "stop and remove"
if [ $systemd = 1 ]; then
    systemctl stop moverd.service
else
    kill "$pid"
    wait "$pid"
    pid=
fi
rm /etc/flowmover/peer.key
dpkg --purge flowmover
[ ! -e /usr/sbin/moverd ] && [ ! -e /etc/flowmover/moverd.conf ] ||
    { echo "files left after dpkg --purge" >&2; exit 1; }
for f in "$wants" /run/flowmover /var/lib/flowmover \
         /var/lib/systemd/deb-systemd-helper-enabled/moverd.service.dsh-also; do
    [ ! -e "$f" ] || { echo "$f left after dpkg --purge" >&2; exit 1; }
done
step "ok"
