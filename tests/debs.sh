#!/bin/bash
# The Debian packages, as an operator meets them (TAP): make deb builds them, apt
# installs them on this machine (their dependencies are the test's own), the demo runs
# from the installed files only (/usr/bin/gmsfs through mount -t fuse.gmsfs, gmsfsctl,
# the example built with pkg-config, python3's import gmsfs), then they are purged.
cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
n=0
failed=0
t() { # t NAME CMD...: one TAP line; the command's output as comments when it fails
	local name=$1 out rc
	shift
	n=$((n + 1))
	out=$("$@" 2>&1)
	rc=$?
	if [ $rc -eq 0 ]; then
		echo "ok $n - $name"
	else
		echo "not ok $n - $name (exit $rc)"
		printf '%s\n' "$out" | tail -30 | sed 's/^/#   /'
		failed=$((failed + 1))
	fi
}
pkgs="gmsfs libgmsfs0 libgmsfs-dev python3-gmsfs"
for p in $pkgs; do
	if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
		echo "Bail out! $p is installed already: this test installs and purges it"
		exit 1
	fi
done
tmp=$(mktemp -d /tmp/gmsfs-debs.XXXXXX)
cleanup() {
	grep -q " $tmp/m fuse.gmsfs " /proc/mounts && umount "$tmp/m"
	DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq $pkgs >/dev/null 2>&1
	rm -rf "$tmp"
}
trap cleanup EXIT

built() {
	make -s deb B="$tmp/b" >"$tmp/deb.log" 2>&1 || { cat "$tmp/deb.log"; return 1; }
	for p in $pkgs; do ls "$tmp"/b/deb/${p}_*.deb >/dev/null || return 1; done
	! grep '^E:' "$tmp/deb.log" # lintian errors (warnings are looked at in the note)
}
t "make deb: gmsfs, libgmsfs0, libgmsfs-dev, python3-gmsfs; no lintian error" built

installed() {
	local debs=()
	for p in $pkgs; do debs+=("$tmp"/b/deb/${p}_*.deb); done
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${debs[@]}" || return 1
	for f in /usr/bin/gmsfs /usr/bin/gmsfsctl /usr/sbin/mount.fuse.gmsfs /usr/lib/systemd/system/gmsfs@.service \
		/usr/include/gmsfs/gmsfs.h /usr/share/man/man8/gmsfs.8.gz; do
		[ -e "$f" ] || { echo "missing $f"; return 1; }
	done
}
t "apt install ./*.deb on this machine" installed

demo() {
	set -e
	mkdir "$tmp/m"
	cd "$tmp"
	mount -t fuse.gmsfs none "$tmp/m" -o "max_bytes=64M,socket=$tmp/s.sock" # /usr/sbin/mount.fuse.gmsfs
	grep -q " $tmp/m fuse.gmsfs " /proc/mounts
	mkdir m/model
	cc -o weights "$root/examples/weights.c" $(pkg-config --cflags --libs gmsfs)
	./weights write m/model
	./weights read m/model | grep 'imported 8 allocations'
	gmsfsctl list | grep -E "model +COMMITTED"
	env -u PYTHONPATH -u GMSFS_LIBRARY /usr/bin/python3 -c '
import gmsfs, sys
with gmsfs.connect(sys.argv[1], "ro") as c:
    assert len(c.import_all()) == 8 and gmsfs.__file__.startswith("/usr/lib/python3/dist-packages/"), gmsfs.__file__
print("python3-gmsfs imports the store")' m/model
	umount "$tmp/m"
	for _ in $(seq 100); do [ -e "$tmp/s.sock" ] || return 0; sleep 0.05; done
	echo "the daemon did not end"
	return 1
}
t "the demo from the installed files: mount -t fuse.gmsfs, the example built with pkg-config, gmsfsctl, python3" demo
echo "1..$n"
[ $failed -eq 0 ]
