#!/usr/bin/env bash
# rabbit.sh runs a 3-node RabbitMQ cluster of its own on loopback for the
# RabbitMQ backend's cluster tests: nodes rc1@localhost, rc2@localhost and
# rc3@localhost on AMQP ports BASE, BASE+1, BASE+2 and distribution ports
# BASE+10.. (rabbitmqctl uses BASE+20..BASE+39), each with its data, logs,
# configuration and pid in a directory of its own under a temporary
# directory, no plugins (management off), one Erlang cookie for the three
# (HOME is that directory). The nodes register with the machine's epmd
# beside the shared node (rabbit@localhost on 5672), which this script never
# touches: a base port that would collide with 5672 or 25672 is refused.
#
#   scripts/cluster/rabbit.sh start [BASE]   start the three nodes (default BASE 15681), join rc2
#                                            and rc3 to rc1, and print the export line of
#                                            ASYNCPLATFORM_RABBIT_CLUSTER_URL
#   scripts/cluster/rabbit.sh env  [BASE]    print that export line again
#   scripts/cluster/rabbit.sh kill PORT      SIGKILL the node with AMQP port PORT (its data stays)
#   scripts/cluster/rabbit.sh restart PORT   start that node again (it rejoins with its data)
#   scripts/cluster/rabbit.sh wait [BASE]    wait until every node answers AMQP and sees 3 running nodes
#   scripts/cluster/rabbit.sh status [BASE]  each node's port, pid and whether it answers
#   scripts/cluster/rabbit.sh stop [BASE]    SIGKILL every node of the cluster and remove its directory
#   scripts/cluster/rabbit.sh ctl PORT ARGS  run rabbitmqctl ARGS against the node with AMQP port PORT
#
# BASE may also be given as ASYNCPLATFORM_RABBIT_CLUSTER_BASE. The server is
# /usr/lib/rabbitmq/bin/rabbitmq-server (the machine's 3.10), or
# ASYNCPLATFORM_RABBITMQ_SERVER; rabbitmqctl is the one beside it.
#
# Typical use:
#   eval "$(scripts/cluster/rabbit.sh start)"
#   ASYNCPLATFORM_CLUSTER=rabbit go test -count=1 -v -run TestCluster -timeout 30m ./backend/rabbit/
#   scripts/cluster/rabbit.sh stop
set -euo pipefail

NODES=3
BIN=${ASYNCPLATFORM_RABBITMQ_SERVER:-/usr/lib/rabbitmq/bin/rabbitmq-server}
CTL=$(dirname "$BIN")/rabbitmqctl

die() { echo "rabbit.sh: $*" >&2; exit 1; }

base_of() {
	local b=${1:-${ASYNCPLATFORM_RABBIT_CLUSTER_BASE:-15681}}
	[[ $b =~ ^[0-9]+$ ]] || die "base port $b is not a number"
	((b >= 1024 && b + 40 <= 65535)) || die "base port $b is out of range (1024..65495)"
	if ((b <= 5672 && 5672 < b + 40)) || ((b <= 25672 && 25672 < b + 40)) || ((b <= 4369 && 4369 < b + 40)); then
		die "base port $b would touch the shared RabbitMQ node (5672, 25672) or epmd (4369); pick another"
	fi
	echo "$b"
}

state_dir() { echo "${TMPDIR:-/tmp}/asyncplatform-rabbit-cluster-$1"; }

# node_dir PORT finds the directory of the node with AMQP port PORT.
node_dir() {
	local port=$1 d
	for d in "${TMPDIR:-/tmp}"/asyncplatform-rabbit-cluster-*/"$port"; do
		[[ -d $d ]] && { echo "$d"; return 0; }
	done
	die "no cluster node on port $port (start one first)"
}

pid_of() {
	local f=$1/pid
	[[ -f $f ]] && kill -0 "$(cat "$f")" 2>/dev/null && cat "$f"
}

# answers PORT: the node takes a TCP connection and answers the AMQP
# protocol header with its connection.start.
answers() {
	timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1 && printf 'AMQP\x00\x00\x09\x01' >&3 && head -c 1 <&3" 2>/dev/null | od -An -tx1 | grep -q 01
}

# node_env DIR: the environment of the node (and of rabbitmqctl for it).
node_env() {
	local dir=$1
	# shellcheck disable=SC1091
	source "$dir/node.env"
	echo "HOME=$(dirname "$dir")" \
		"RUNNING_UNDER_SYSTEMD=true" \
		"RABBITMQ_NODENAME=$NODENAME" \
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1" \
		"RABBITMQ_NODE_PORT=$PORT" \
		"RABBITMQ_DIST_PORT=$DIST" \
		"RABBITMQ_CTL_DIST_PORT_MIN=$CTLMIN" \
		"RABBITMQ_CTL_DIST_PORT_MAX=$CTLMAX" \
		"RABBITMQ_CONFIG_FILE=$dir/rabbitmq.conf" \
		"RABBITMQ_CONF_ENV_FILE=$dir/rabbitmq-env.conf" \
		"RABBITMQ_ENABLED_PLUGINS_FILE=$dir/enabled_plugins" \
		"RABBITMQ_MNESIA_BASE=$dir/mnesia" \
		"RABBITMQ_LOG_BASE=$dir/log" \
		"RABBITMQ_PID_FILE=$dir/node.pid" \
		"ERL_EPMD_ADDRESS=127.0.0.1"
}

ctl() {
	local dir=$1
	shift
	# shellcheck disable=SC2046
	env -i PATH="$PATH" $(node_env "$dir") "$CTL" -n "$(source "$dir/node.env"; echo "$NODENAME")" "$@"
}

# start_node PORT: start the node whose directory holds its configuration,
# and wait until it answers AMQP.
start_node() {
	local port=$1 dir
	dir=$(node_dir "$port")
	[[ -n $(pid_of "$dir" || true) ]] && return 0
	# The script execs the Erlang VM (RUNNING_UNDER_SYSTEMD), so $! is the node.
	# shellcheck disable=SC2046
	env -i PATH="$PATH" $(node_env "$dir") setsid "$BIN" >>"$dir/server.log" 2>&1 </dev/null &
	echo $! >"$dir/pid"
	local i
	for i in $(seq 240); do
		answers "$port" && return 0
		[[ -n $(pid_of "$dir" || true) ]] || die "node on port $port exited while booting; see $dir/server.log and $dir/log"
		sleep 0.5
	done
	die "node on port $port did not answer within 120 s; see $dir/server.log"
}

env_line() {
	local b=$1 hosts=() p
	for ((p = b; p < b + NODES; p++)); do hosts+=("127.0.0.1:$p"); done
	local IFS=,
	echo "export ASYNCPLATFORM_RABBIT_CLUSTER_URL=amqp://guest:guest@${hosts[*]}/"
}

running_nodes() {
	ctl "$1" eval 'length(rabbit_nodes:all_running()).' 2>/dev/null | tr -d '[:space:]'
}

wait_cluster() {
	local b=$1 dir p i n
	dir=$(state_dir "$b")
	for ((p = b; p < b + NODES; p++)); do
		[[ -n $(pid_of "$dir/$p" || true) ]] || continue
		for i in $(seq 240); do
			answers "$p" && break
			sleep 0.5
		done
		for i in $(seq 240); do
			n=$(running_nodes "$dir/$p" || true)
			[[ $n == "$NODES" ]] && break
			sleep 0.5
		done
		[[ $n == "$NODES" ]] || die "node on port $p sees $n running nodes, want $NODES"
	done
}

cmd=${1:-}
shift || true
case $cmd in
start)
	b=$(base_of "${1:-}")
	[[ -x $BIN ]] || die "no rabbitmq-server at $BIN (set ASYNCPLATFORM_RABBITMQ_SERVER)"
	dir=$(state_dir "$b")
	if [[ -d $dir ]]; then
		for ((p = b; p < b + NODES; p++)); do
			[[ -n $(pid_of "$dir/$p" || true) ]] && die "a cluster on base $b is running; stop it first"
		done
		rm -rf "$dir"
	fi
	for ((p = b; p < b + NODES; p++)); do
		(answers "$p" || timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$p" 2>/dev/null) && die "port $p is taken"
	done
	mkdir -p "$dir"
	head -c 20 /dev/urandom | od -An -tx1 | tr -d ' \n' | tr 'a-f' 'A-F' >"$dir/.erlang.cookie"
	chmod 400 "$dir/.erlang.cookie"
	for ((i = 1; i <= NODES; i++)); do
		p=$((b + i - 1))
		nd="$dir/$p"
		mkdir -p "$nd/log" "$nd/mnesia"
		cat >"$nd/node.env" <<-EOF
			NODENAME=rc$i@localhost
			PORT=$p
			DIST=$((b + 10 + i - 1))
			CTLMIN=$((b + 20 + 5 * (i - 1)))
			CTLMAX=$((b + 24 + 5 * (i - 1)))
		EOF
		printf 'listeners.tcp.default = 127.0.0.1:%d\nloopback_users = none\n' "$p" >"$nd/rabbitmq.conf"
		echo '[].' >"$nd/enabled_plugins"
		: >"$nd/rabbitmq-env.conf" # not the machine's /etc/rabbitmq/rabbitmq-env.conf
	done
	for ((p = b; p < b + NODES; p++)); do start_node "$p" >&2; done
	for ((p = b + 1; p < b + NODES; p++)); do
		ctl "$dir/$p" stop_app >/dev/null
		ctl "$dir/$p" join_cluster rc1@localhost >/dev/null
		ctl "$dir/$p" start_app >/dev/null
	done
	wait_cluster "$b"
	env_line "$b"
	;;
env) env_line "$(base_of "${1:-}")" ;;
kill)
	[[ -n ${1:-} ]] || die "kill PORT"
	d=$(node_dir "$1")
	pid=$(pid_of "$d" || true)
	[[ -n $pid ]] || die "node on port $1 is not running"
	kill -9 "$pid"
	while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
	rm -f "$d/pid"
	;;
restart)
	[[ -n ${1:-} ]] || die "restart PORT"
	start_node "$1"
	;;
wait) wait_cluster "$(base_of "${1:-}")" ;;
ctl)
	[[ -n ${1:-} ]] || die "ctl PORT ARGS..."
	d=$(node_dir "$1")
	shift
	ctl "$d" "$@"
	;;
status)
	b=$(base_of "${1:-}")
	dir=$(state_dir "$b")
	for ((p = b; p < b + NODES; p++)); do
		pid=$(pid_of "$dir/$p" || true)
		a=no
		answers "$p" && a=yes
		echo "$p pid=${pid:--} answers=$a"
	done
	;;
stop)
	b=$(base_of "${1:-}")
	dir=$(state_dir "$b")
	[[ -d $dir ]] || exit 0
	for ((p = b; p < b + NODES; p++)); do
		pid=$(pid_of "$dir/$p" || true)
		[[ -n $pid ]] && kill -9 "$pid" 2>/dev/null || true
	done
	sleep 0.5
	rm -rf "$dir"
	;;
*)
	sed -n '2,30p' "$0" >&2
	exit 2
	;;
esac
