# redis-nodes.sh holds what scripts/cluster/redis.sh and redis-sentinel.sh
# share: each node of theirs lives in STATE_PREFIX-BASE/PORT under the
# temporary directory, with its pid in redis.pid there. A script sources it
# after setting STATE_PREFIX and NODES and defining die, base_of and
# start_node PORT DIR.

state_dir() { echo "${TMPDIR:-/tmp}/$STATE_PREFIX-$1"; }

# node_dir PORT finds the directory of the node on PORT, in any set.
node_dir() {
	local port=$1 d
	for d in "${TMPDIR:-/tmp}/$STATE_PREFIX"-*/"$port"; do
		[[ -d $d ]] && { echo "$d"; return 0; }
	done
	die "no node on port $port (start one first)"
}

# pid_of DIR prints the pid of the node in DIR, when it runs.
pid_of() {
	local f=$1/redis.pid
	[[ -f $f ]] && kill -0 "$(cat "$f")" 2>/dev/null && cat "$f"
}

cmd_kill() {
	local port=${1:?kill needs a port} dir pid
	dir=$(node_dir "$port")
	pid=$(pid_of "$dir") || die "node $port is not running"
	kill -KILL "$pid"
	while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
	rm -f "$dir/redis.pid"
}

cmd_restart() {
	local port=${1:?restart needs a port} dir
	dir=$(node_dir "$port")
	[[ -z $(pid_of "$dir") ]] || die "node $port is running"
	start_node "$port" "$dir"
}

cmd_stop() {
	local b dir p pid
	b=$(base_of "${1:-}")
	dir=$(state_dir "$b")
	[[ -d $dir ]] || return 0
	for ((p = b; p < b + NODES; p++)); do
		pid=$(pid_of "$dir/$p" || true)
		[[ -n $pid ]] && kill -KILL "$pid" && while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
	done
	rm -rf "$dir"
}
