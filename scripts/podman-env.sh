# Sourced (POSIX sh) by scripts/container-base.sh and tests/container.sh: podman as this
# machine allows it.  Two things of machines like CI's make podman's defaults fail, and
# each gets its setting in a containers.conf of our own (CONTAINERS_CONF), nothing global:
#   cgroups v1 with a v2 "unified" hierarchy beside it (hybrid), which crun refuses: runc
#   no CAP_SYS_RESOURCE: podman asks for limits above this process's, which cannot be
#   raised; the container gets this process's open-files limit instead
# Elsewhere it changes nothing.  Builds use the host's network (apt-get in a RUN step).
podman_env() {
	conf=$1 # where to write the containers.conf, if one is needed
	capeff=$(awk '/^CapEff/ { print $2 }' /proc/self/status)
	runtime=
	if grep -q ' /sys/fs/cgroup/unified cgroup2 ' /proc/mounts && command -v runc >/dev/null; then
		runtime=runc
	fi
	limits=
	if [ $(((0x$capeff >> 24) & 1)) -eq 0 ]; then
		nofile=$(ulimit -Hn)
		[ "$nofile" = unlimited ] && nofile=1048576
		limits="\"nofile=$nofile:$nofile\", \"nproc=4096:4096\""
	fi
	[ -z "$runtime$limits" ] && return 0
	{
		echo '[containers]'
		[ -n "$limits" ] && echo "default_ulimits = [$limits]"
		echo '[engine]'
		echo 'cgroup_manager = "cgroupfs"'
		[ -n "$runtime" ] && echo "runtime = \"$runtime\""
	} >"$conf"
	CONTAINERS_CONF=$conf
	export CONTAINERS_CONF
}
