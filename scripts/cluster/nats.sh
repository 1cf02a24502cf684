#!/usr/bin/env bash
# nats.sh runs a 3-node NATS cluster with JetStream of its own on loopback
# for the NATS backend's cluster tests: nodes n1, n2, n3 on client ports
# BASE, BASE+1, BASE+2, route ports BASE+10.. and monitoring ports
# BASE+20.., each node's store and log
# in a directory of its own under a temporary directory. It never touches
# the machine's shared nats-server on 4222 (nor its monitoring port 8222):
# a base port that would is refused.
#
#   scripts/cluster/nats.sh start [BASE]   start the three nodes (default BASE 14310), wait until
#                                          JetStream has a meta leader, and print the export line of
#                                          ASYNCPLATFORM_NATS_CLUSTER_URL
#   scripts/cluster/nats.sh env  [BASE]    print that export line again
#   scripts/cluster/nats.sh kill PORT      SIGKILL the node with client port PORT (its store stays)
#   scripts/cluster/nats.sh restart PORT   start that node again (it rejoins with its store)
#   scripts/cluster/nats.sh wait [BASE]    wait until every running node answers and JetStream has a meta leader
#   scripts/cluster/nats.sh status [BASE]  each node's port, pid and whether it answers
#   scripts/cluster/nats.sh stop [BASE]    SIGKILL every node of the cluster and remove its directory
#
# BASE may also be given as ASYNCPLATFORM_NATS_CLUSTER_BASE. The server is
# /usr/sbin/nats-server (the machine's 2.9.10), or ASYNCPLATFORM_NATS_SERVER
# (e.g. "$(scripts/nats-current.sh path)" for the current release), chosen
# at start: restart starts a node with the binary its cluster started with.
#
# Typical use:
#   eval "$(scripts/cluster/nats.sh start)"
#   ASYNCPLATFORM_CLUSTER=nats go test -count=1 -v -run TestCluster -timeout 20m ./backend/nats/
#   scripts/cluster/nats.sh stop
set -euo pipefail

NODES=3
BIN=${ASYNCPLATFORM_NATS_SERVER:-/usr/sbin/nats-server}

die() { echo "nats.sh: $*" >&2; exit 1; }

base_of() {
	local b=${1:-${ASYNCPLATFORM_NATS_CLUSTER_BASE:-14310}}
	[[ $b =~ ^[0-9]+$ ]] || die "base port $b is not a number"
	((b >= 1024 && b + 20 <= 65535)) || die "base port $b is out of range (1024..65515)"
	local p
	for ((p = b; p < b + NODES; p++)); do
		if ((p == 4222 || p == 6222 || p == 8222 || p + 10 == 4222 || p + 10 == 6222 || p + 10 == 8222 || p + 20 == 4222 || p + 20 == 6222 || p + 20 == 8222)); then
			die "base port $b would touch the shared nats-server (4222, 6222, 8222); pick another"
		fi
	done
	echo "$b"
}

state_dir() { echo "${TMPDIR:-/tmp}/asyncplatform-nats-cluster-$1"; }

# node_dir PORT finds the directory of the node with client port PORT.
node_dir() {
	local port=$1 d
	for d in "${TMPDIR:-/tmp}"/asyncplatform-nats-cluster-*/"$port"; do
		[[ -d $d ]] && { echo "$d"; return 0; }
	done
	die "no cluster node on port $port (start one first)"
}

pid_of() {
	local f=$1/pid
	[[ -f $f ]] && kill -0 "$(cat "$f")" 2>/dev/null && cat "$f"
}

# answers PORT: the node takes a TCP connection and sends its INFO line.
answers() {
	timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1 && head -c 4 <&3" 2>/dev/null | grep -q INFO
}

# start_node PORT: start the node whose directory holds its config.
start_node() {
	local port=$1 dir
	dir=$(node_dir "$port")
	[[ -n $(pid_of "$dir" || true) ]] && return 0
	local bin=$BIN
	[[ -f $dir/../bin ]] && bin=$(cat "$dir/../bin") # the cluster's own, chosen at start
	setsid "$bin" -c "$dir/nats.conf" >>"$dir/nats.log" 2>&1 </dev/null &
	echo $! >"$dir/pid"
	local i
	for i in $(seq 100); do
		answers "$port" && return 0
		sleep 0.1
	done
	die "node $port did not answer within 10s (see $dir/nats.log)"
}

url_of() {
	local b=$1 i hosts=()
	for ((i = 0; i < NODES; i++)); do
		hosts+=("127.0.0.1:$((b + i))")
	done
	local IFS=,
	echo "nats://${hosts[*]}"
}

# meta_leader PORT: whether the node's monitoring endpoint (port+20) names
# a JetStream meta leader.
meta_leader() {
	curl -fsS "http://127.0.0.1:$(($1 + 20))/jsz" 2>/dev/null | grep -q '"leader": *"n[0-9]'
}

wait_ready() {
	local b=$1 i port dir up
	for i in $(seq 300); do
		up=0
		for ((port = b; port < b + NODES; port++)); do
			dir=$(state_dir "$b")/$port
			if [[ -n $(pid_of "$dir" || true) ]] && answers "$port"; then
				up=$port
			fi
		done
		if ((up != 0)) && meta_leader "$up"; then
			return 0
		fi
		sleep 0.2
	done
	die "no JetStream meta leader within 60s"
}

cmd=${1:-}
shift || true
case $cmd in
start)
	b=$(base_of "${1:-}")
	[[ -x $BIN ]] || die "no nats-server at $BIN"
	sd=$(state_dir "$b")
	[[ -d $sd ]] && die "a cluster on base $b exists ($sd): stop it first"
	mkdir -p "$sd"
	echo "$BIN" >"$sd/bin"
	routes=""
	for ((i = 0; i < NODES; i++)); do
		routes+="${routes:+, }nats-route://127.0.0.1:$((b + 10 + i))"
	done
	for ((i = 0; i < NODES; i++)); do
		port=$((b + i))
		dir=$sd/$port
		mkdir -p "$dir/store"
		cat >"$dir/nats.conf" <<EOF
server_name: n$((i + 1))
listen: 127.0.0.1:$port
http: 127.0.0.1:$((port + 20))
jetstream { store_dir: "$dir/store" }
cluster {
  name: asyncplatform-test
  listen: 127.0.0.1:$((b + 10 + i))
  routes: [ $routes ]
}
EOF
	done
	for ((port = b; port < b + NODES; port++)); do
		start_node "$port"
	done
	wait_ready "$b"
	echo "export ASYNCPLATFORM_NATS_CLUSTER_URL=$(url_of "$b")"
	;;
env)
	b=$(base_of "${1:-}")
	echo "export ASYNCPLATFORM_NATS_CLUSTER_URL=$(url_of "$b")"
	;;
kill)
	port=${1:?usage: nats.sh kill PORT}
	dir=$(node_dir "$port")
	pid=$(pid_of "$dir" || true)
	[[ -n $pid ]] || die "node $port is not running"
	kill -KILL "$pid"
	while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
	;;
restart)
	port=${1:?usage: nats.sh restart PORT}
	start_node "$port"
	;;
wait)
	wait_ready "$(base_of "${1:-}")"
	;;
status)
	b=$(base_of "${1:-}")
	for ((port = b; port < b + NODES; port++)); do
		dir=$(state_dir "$b")/$port
		pid=$(pid_of "$dir" || true)
		if answers "$port"; then up=answers; else up=down; fi
		echo "$port pid=${pid:--} $up"
	done
	;;
stop)
	b=$(base_of "${1:-}")
	sd=$(state_dir "$b")
	for ((port = b; port < b + NODES; port++)); do
		pid=$(pid_of "$sd/$port" || true)
		[[ -n $pid ]] && kill -KILL "$pid" 2>/dev/null || true
	done
	rm -rf "$sd"
	;;
*)
	sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
	exit 2
	;;
esac
