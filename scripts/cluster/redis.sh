#!/usr/bin/env bash
# redis.sh runs a Redis Cluster 7.0 of its own on loopback for the Redis
# backend's cluster tests: 3 masters and 3 replicas (one each), on ports of
# its own, each node in a directory of its own under a temporary directory,
# with an append-only file. It never touches the machine's shared Redis on
# 6379 (nor its cluster bus port, 16379): such a base port is refused.
#
#   scripts/cluster/redis.sh start [BASE]   start nodes on BASE..BASE+5 (default 7100; bus ports +10000),
#                                           create the cluster, wait until every node says cluster_state:ok,
#                                           and print the export line of ASYNCPLATFORM_REDIS_CLUSTER_URL
#   scripts/cluster/redis.sh env  [BASE]    print that export line again
#   scripts/cluster/redis.sh kill PORT      SIGKILL the node on PORT (its files stay)
#   scripts/cluster/redis.sh restart PORT   start the node on PORT again (it rejoins with its nodes.conf)
#   scripts/cluster/redis.sh wait [BASE]    wait until every running node says cluster_state:ok
#   scripts/cluster/redis.sh status [BASE]  each node's port, pid and role
#   scripts/cluster/redis.sh stop [BASE]    SIGKILL every node of the cluster and remove its directory
#
# BASE may also be given as ASYNCPLATFORM_REDIS_CLUSTER_BASE. The cluster's
# node timeout (how long a silent master stays a master) is
# ASYNCPLATFORM_REDIS_CLUSTER_NODE_TIMEOUT milliseconds, 3000 by default
# (Redis's own default is 15000): a failover takes about that long, plus an
# election of a second or two.
#
# Typical use:  eval "$(scripts/cluster/redis.sh start)" && go test ... && scripts/cluster/redis.sh stop
set -euo pipefail

NODES=6
NODE_TIMEOUT=${ASYNCPLATFORM_REDIS_CLUSTER_NODE_TIMEOUT:-3000}

die() { echo "redis.sh: $*" >&2; exit 1; }

base_of() {
	local b=${1:-${ASYNCPLATFORM_REDIS_CLUSTER_BASE:-7100}}
	[[ $b =~ ^[0-9]+$ ]] || die "base port $b is not a number"
	((b >= 1024 && b + NODES - 1 <= 55535)) || die "base port $b is out of range (1024..55530)"
	# No node port nor bus port (port+10000) may be the shared server's 6379
	# or its bus port 16379.
	local p
	for ((p = b; p < b + NODES; p++)); do
		if ((p == 6379 || p == 16379 || p + 10000 == 6379 || p + 10000 == 16379)); then
			die "base port $b would touch the shared Redis on 6379; pick another"
		fi
	done
	echo "$b"
}

STATE_PREFIX=asyncplatform-redis-cluster
# shellcheck source=redis-nodes.sh
source "$(dirname "$0")/redis-nodes.sh"

start_node() {
	local port=$1 dir=$2
	redis-server --port "$port" --bind 127.0.0.1 --protected-mode yes \
		--daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" --dir "$dir" \
		--cluster-enabled yes --cluster-config-file "$dir/nodes.conf" \
		--cluster-node-timeout "$NODE_TIMEOUT" \
		--appendonly yes --appendfsync everysec --save "" \
		--maxmemory-policy noeviction
	local i
	for i in $(seq 100); do
		redis-cli -p "$port" ping >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	die "node $port did not answer within 10s (see $dir/redis.log)"
}

url_of() {
	local b=$1 i hosts=()
	for ((i = 0; i < NODES; i++)); do hosts+=("127.0.0.1:$((b + i))"); done
	local IFS=,
	echo "export ASYNCPLATFORM_REDIS_CLUSTER_URL='redis+cluster://${hosts[*]}/'"
}

wait_ok() {
	local b=$1 i p ok
	for i in $(seq 300); do
		ok=1
		for ((p = b; p < b + NODES; p++)); do
			[[ -n $(pid_of "$(state_dir "$b")/$p") ]] || continue
			redis-cli -p "$p" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || { ok=0; break; }
		done
		((ok)) && return 0
		sleep 0.1
	done
	die "the cluster on $b.. did not reach cluster_state:ok within 30s"
}

cmd_start() {
	local b dir p addrs=()
	b=$(base_of "${1:-}")
	dir=$(state_dir "$b")
	command -v redis-server >/dev/null || die "redis-server is not installed"
	command -v redis-cli >/dev/null || die "redis-cli is not installed"
	if [[ -d $dir ]]; then
		for ((p = b; p < b + NODES; p++)); do
			[[ -n $(pid_of "$dir/$p") ]] || die "$dir exists but node $p is not running: run stop $b first"
		done
		wait_ok "$b"
		url_of "$b"
		return 0
	fi
	for ((p = b; p < b + NODES; p++)); do
		redis-cli -p "$p" ping >/dev/null 2>&1 && die "port $p is taken by another Redis"
	done
	mkdir -p "$dir"
	for ((p = b; p < b + NODES; p++)); do
		mkdir -p "$dir/$p"
		start_node "$p" "$dir/$p"
		addrs+=("127.0.0.1:$p")
	done
	redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1 ||
		die "cluster create failed (see $dir/create.log)"
	wait_ok "$b"
	url_of "$b"
}

cmd_status() {
	local b dir p pid
	b=$(base_of "${1:-}")
	dir=$(state_dir "$b")
	[[ -d $dir ]] || die "no cluster on $b"
	for ((p = b; p < b + NODES; p++)); do
		pid=$(pid_of "$dir/$p" || true)
		if [[ -n $pid ]]; then
			echo "$p pid $pid $(redis-cli -p "$p" role 2>/dev/null | head -1)"
		else
			echo "$p down"
		fi
	done
}

case ${1:-} in
start) cmd_start "${2:-}" ;;
env) url_of "$(base_of "${2:-}")" ;;
kill) cmd_kill "${2:-}" ;;
restart) cmd_restart "${2:-}" ;;
wait) wait_ok "$(base_of "${2:-}")" ;;
status) cmd_status "${2:-}" ;;
stop) cmd_stop "${2:-}" ;;
*) die "usage: $0 start|env|wait|status|stop [BASE] | kill|restart PORT" ;;
esac
