#!/bin/bash
# The Debian packages, as an operator meets them (TAP): make deb builds them, apt
# installs them on this machine (their dependencies are the test's own), the demo runs
# from the installed files only (/usr/bin/gmsfs through mount -t fuse.gmsfs, gmsfsctl,
# the example built with pkg-config, python3's import gmsfs), then they are purged.
cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
. tests/helpers/tap.sh
pkgs="gmsfs libgmsfs0 libgmsfs-dev python3-gmsfs"
tmp=$(mktemp -d /tmp/gmsfs-debs.XXXXXX)
# Where gmsfs is installed already, what is there is saved (dpkg-repack) and put back at
# the end, so that this test runs on an operator's machine too.
saved=
for p in $pkgs; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" && saved="$saved $p"
done
if [ -n "$saved" ]; then
	command -v dpkg-repack >/dev/null || { echo "Bail out! gmsfs is installed here ($saved): dpkg-repack is needed to put it back afterwards (apt-get install dpkg-repack)"; exit 1; }
	mkdir "$tmp/saved"
	(cd "$tmp/saved" && dpkg-repack $saved >/dev/null 2>&1) || { echo "Bail out! dpkg-repack$saved failed"; exit 1; }
	echo "# installed here already:$saved; saved, and put back at the end"
fi
cleanup() {
	grep -q " $tmp/m fuse.gmsfs " /proc/mounts && umount "$tmp/m"
	DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq $pkgs >/dev/null 2>&1
	if [ -n "$saved" ]; then
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$tmp"/saved/*.deb >/dev/null 2>&1 ||
			echo "# could not put back$saved: the saved packages are in $tmp/saved" >&2
		[ -n "$(ls "$tmp"/saved/*.deb 2>/dev/null)" ] && dpkg-query -W $saved >/dev/null 2>&1 && rm -rf "$tmp"
	else
		rm -rf "$tmp"
	fi
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
		/usr/sbin/gmsfs-node /usr/sbin/gmsfs-keeper /usr/sbin/gmsfs-csi /usr/share/man/man8/gmsfs-keeper.8.gz \
		/usr/include/gmsfs/gmsfs.h /usr/share/man/man8/gmsfs.8.gz; do
		[ -e "$f" ] || { echo "missing $f"; return 1; }
	done
}
t "apt install ./*.deb on this machine" installed

metadata() {
	set -e
	local d
	d=$(dpkg-deb -f "$tmp"/b/deb/gmsfs_*.deb Depends)
	echo "gmsfs: $d"
	grep -q 'python3-gmsfs' <<<"$d" && grep -q 'fuse3' <<<"$d" && grep -q 'libgmsfs0' <<<"$d"
	d=$(dpkg-deb -f "$tmp"/b/deb/libgmsfs-dev_*.deb Depends)
	grep -q 'libgmsfs0 (= ' <<<"$d"
	# gmsfs.pc needs nothing else installed: pkg-config works with what libgmsfs-dev brings.
	[ -z "$(pkg-config --print-requires-private gmsfs)" ] && [ -z "$(pkg-config --print-requires gmsfs)" ]
	pkg-config --cflags --libs gmsfs
	dpkg-deb -e "$tmp"/b/deb/gmsfs_*.deb "$tmp/ctl"
	grep -q 'deb-systemd-helper.*enable.*gmsfs.target' "$tmp/ctl/postinst" || grep -q "gmsfs.target" "$tmp/ctl/postinst"
	grep -q 'gmsfs-mount-all.service' "$tmp/ctl/postinst"
	grep -q 'systemctl --system daemon-reload' "$tmp/ctl/postinst" # new units known at once
	dpkg-deb -e "$tmp"/b/deb/python3-gmsfs_*.deb "$tmp/ctl-py"
	grep -q '__pycache__' "$tmp/ctl-py/prerm"
	grep -q 'deb-systemd-invoke stop gmsfs.target' "$tmp/ctl/prerm"
	# Enabled at install (no systemd needed: the links are what enable means).
	[ -L /etc/systemd/system/multi-user.target.wants/gmsfs.target ]
	[ -L /etc/systemd/system/gmsfs.target.wants/gmsfs-mount-all.service ]
	[ -x /usr/sbin/gmsfs-node ]
	ls /usr/lib/*/libgmsfs-load.so.1
	# Built with the cuda backend (cuda.h is here), and said so.
	grep -q 'building the cuda and host backends' "$tmp/deb.log" "$tmp"/b/deb/build.log
	# Hardening: _FORTIFY_SOURCE reaches the compiler (CPPFLAGS).
	! grep -q 'hardening-no-fortify-functions' "$tmp/deb.log"
}
t "package metadata: dependencies, gmsfs.pc alone, units enabled and stopped by the maintainer scripts, cuda built, fortified" metadata

nocuda() {
	# A builder without cuda.h fails loudly rather than making host-only packages quietly.
	cd "$tmp"/b/deb/gmsfs-*/ || return 1
	local out
	out=$(make -f debian/rules override_dh_auto_build CUDA_INC=/nonexistent 2>&1) && { echo "$out"; return 1; }
	grep -q 'cuda.h not found' <<<"$out" && grep -q 'DEB_BUILD_PROFILES=nocuda' <<<"$out"
}
t "a build without cuda.h fails and says how to build host-only packages" nocuda

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
	for _ in $(seq 600); do [ -e "$tmp/s.sock" ] || return 0; sleep 0.05; done
	echo "the daemon did not end"
	return 1
}
t "the demo from the installed files: mount -t fuse.gmsfs, the example built with pkg-config, gmsfsctl, python3" demo

purged() {
	DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq $pkgs >/dev/null 2>&1 || return 1
	[ ! -e /etc/systemd/system/multi-user.target.wants/gmsfs.target ] && [ ! -e /usr/bin/gmsfs ] &&
		[ ! -e /usr/lib/python3/dist-packages/gmsfs ] # its __pycache__ too (root imported it above)
}
t "purge removes the files, the Python package's caches and the units' links" purged
echo "1..$n"
[ $failed -eq 0 ]
