#!/bin/bash
# check_package.sh - the Debian package, for real (issue 10): build the
# .deb (cpack -G DEB, prefix /usr), check its Depends and files, install
# it with dpkg -i, start the installed moverd (systemctl start where
# systemd is PID 1, else the unit's ExecStart line by hand), create a flow
# with the installed moverctl and move records through it with the
# installed flowdemo, compile a program against the installed libflowshm
# (pkg-config), stop moverd, and remove the package (dpkg --purge).
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
cleanup() {
    set +e
    if [ $systemd = 1 ]; then
        systemctl stop moverd.service
    elif [ -n "$pid" ]; then
        kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    fi
    dpkg --purge flowmover >/dev/null 2>&1
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
for lib in libc6 liburing2 libprotobuf-c1 libibverbs1 librdmacm1 libsodium23 libsystemd0; do
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
dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles | grep -qx /etc/flowmover/moverd.conf ||
    { echo "moverd.conf is not a conffile" >&2; exit 1; }

step "dpkg -i"
dpkg -i "$deb"
echo "flow = pkgtest ring-size=1M" >> /etc/flowmover/moverd.conf

if [ $systemd = 1 ]; then
    # postinst may have started it already, before the flow line above
    step "systemctl restart moverd"
    systemctl restart moverd.service
    systemctl is-active moverd.service
else
    step "no systemd (PID 1 is $(ps -p 1 -o comm=)): the unit's ExecStart by hand"
    exec_start=$(sed -n 's/^ExecStart=//p' /usr/lib/systemd/system/moverd.service)
    echo "    $exec_start"
    $exec_start &
    pid=$!
fi
for _ in $(seq 100); do
    /usr/bin/moverctl status >/dev/null 2>&1 && break
    sleep 0.1
done
/usr/bin/moverctl status

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
ldd "$tmp/t" | grep -qE 'libflowshm.so.0 => /(usr/)?lib/' ||
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
dpkg --purge flowmover
[ ! -e /usr/sbin/moverd ] && [ ! -e /etc/flowmover/moverd.conf ] ||
    { echo "files left after dpkg --purge" >&2; exit 1; }
step "ok"
