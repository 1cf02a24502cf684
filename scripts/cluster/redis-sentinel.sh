#!/usr/bin/env bash
# redis-sentinel.sh runs a Redis master, one replica and three Sentinels of
# its own on loopback for the Redis backend's Sentinel test: the master on
# BASE, the replica on BASE+1, the Sentinels on BASE+2..BASE+4, each in a
# directory of its own under a temporary directory, each started from a
# config file there (Sentinel rewrites its own; a data node's role changes
# are written back to its file, so a restarted node comes back as what
# Sentinel last made it). Data nodes keep an append-only file. It never
# touches the machine's shared Redis on 6379: such a base is refused.
#
#   scripts/cluster/redis-sentinel.sh start [BASE]   start the five (default BASE 7170), wait until
#                                                    every Sentinel knows the master, its replica
#                                                    and the two other Sentinels, and print the export
#                                                    line of ASYNCPLATFORM_REDIS_SENTINEL_URL
#   scripts/cluster/redis-sentinel.sh env    [BASE]  print that export line again
#   scripts/cluster/redis-sentinel.sh master [BASE]  the port of the master the Sentinels name now
#   scripts/cluster/redis-sentinel.sh kill PORT      SIGKILL the node on PORT (its files stay)
#   scripts/cluster/redis-sentinel.sh restart PORT   start the node on PORT again from its config file
#   scripts/cluster/redis-sentinel.sh wait   [BASE]  wait until every Sentinel names one master that
#                                                    answers as a master with one replica in sync
#   scripts/cluster/redis-sentinel.sh status [BASE]  each node's port, pid and role
#   scripts/cluster/redis-sentinel.sh stop   [BASE]  SIGKILL the five and remove their directory
#
# BASE may also be given as ASYNCPLATFORM_REDIS_SENTINEL_BASE. The master's
# name is "mymaster". How long a silent master stays the master is
# ASYNCPLATFORM_REDIS_SENTINEL_DOWN_AFTER milliseconds (Sentinel's
# down-after-milliseconds), 3000 by default (Sentinel's own default is
# 30000); a failover takes that, plus an election and a promotion.
#
# Typical use:  eval "$(scripts/cluster/redis-sentinel.sh start)" && go test ... && scripts/cluster/redis-sentinel.sh stop
set -euo pipefail

NODES=5
MASTER=mymaster
DOWN_AFTER=${ASYNCPLATFORM_REDIS_SENTINEL_DOWN_AFTER:-3000}

die() { echo "redis-sentinel.sh: $*" >&2; exit 1; }

base_of() {
	local b=${1:-${ASYNCPLATFORM_REDIS_SENTINEL_BASE:-7170}}
	[[ $b =~ ^[0-9]+$ ]] || die "base port $b is not a number"
	((b >= 1024 && b + NODES - 1 <= 65535)) || die "base port $b is out of range (1024..65531)"
	((b > 6379 || b + NODES - 1 < 6379)) || die "base port $b would take the shared Redis's 6379; pick another"
	echo "$b"
}

STATE_PREFIX=asyncplatform-redis-sentinel
# shellcheck source=redis-nodes.sh
source "$(dirname "$0")/redis-nodes.sh"

# write_conf PORT DIR KIND [MASTERPORT] writes the node's config file:
# KIND is master, replica or sentinel.
write_conf() {
	local port=$1 dir=$2 kind=$3 mport=${4:-}
	{
		echo "port $port"
		echo "bind 127.0.0.1"
		echo "daemonize yes"
		echo "pidfile $dir/redis.pid"
		echo "logfile $dir/redis.log"
		echo "dir $dir"
		if [[ $kind == sentinel ]]; then
			echo "sentinel monitor $MASTER 127.0.0.1 $mport 2"
			echo "sentinel down-after-milliseconds $MASTER $DOWN_AFTER"
			# Sentinel's default (3 min) is also how long it waits before it
			# tries a failover again after one that did not complete.
			echo "sentinel failover-timeout $MASTER 10000"
			echo "sentinel parallel-syncs $MASTER 1"
		else
			echo "appendonly yes"
			echo "appendfsync everysec"
			echo 'save ""'
			echo "maxmemory-policy noeviction"
			# A replica's full sync starts at once, not 5 s later.
			echo "repl-diskless-sync-delay 0"
			if [[ $kind == replica ]]; then echo "replicaof 127.0.0.1 $mport"; fi
		fi
	} >"$dir/node.conf"
}

start_node() {
	local port=$1 dir=$2
	if grep -q '^sentinel monitor' "$dir/node.conf"; then
		redis-server "$dir/node.conf" --sentinel
	else
		redis-server "$dir/node.conf"
	fi
	local i
	for i in $(seq 100); do
		redis-cli -p "$port" ping >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	die "node $port did not answer within 10s (see $dir/redis.log)"
}

url_of() {
	local b=$1
	echo "export ASYNCPLATFORM_REDIS_SENTINEL_URL='redis+sentinel://127.0.0.1:$((b + 2)),127.0.0.1:$((b + 3)),127.0.0.1:$((b + 4))/$MASTER'"
}

# info PORT SECTION FIELD prints one field of a node's INFO.
info() {
	redis-cli -p "$1" info "$2" 2>/dev/null | tr -d '\r' | sed -n "s/^$3://p"
}

# master_port BASE prints the master's port as every running Sentinel names
# it, or fails when they disagree or none answers.
master_port() {
	local b=$1 p got="" m
	for ((p = b + 2; p < b + NODES; p++)); do
		[[ -n $(pid_of "$(state_dir "$b")/$p") ]] || continue
		m=$(redis-cli -p "$p" sentinel get-master-addr-by-name "$MASTER" 2>/dev/null | tr -d '\r' | sed -n 2p)
		[[ -n $m ]] || return 1
		[[ -z $got || $got == "$m" ]] || return 1
		got=$m
	done
	[[ -n $got ]] && echo "$got"
}

wait_ok() {
	local b=$1 i m p ok
	for i in $(seq 600); do
		ok=0
		if m=$(master_port "$b") && [[ $(info "$m" replication role) == master ]] &&
			[[ $(info "$m" replication connected_slaves) == 1 ]]; then
			ok=1
			for ((p = b; p < b + 2; p++)); do
				[[ $p == "$m" ]] && continue
				[[ $(info "$p" replication master_link_status) == up &&
					$(info "$p" replication master_port) == "$m" ]] || ok=0
			done
			for ((p = b + 2; p < b + NODES; p++)); do
				[[ $(info "$p" sentinel master0 | grep -o 'sentinels=[0-9]*') == sentinels=3 ]] || ok=0
			done
		fi
		((ok)) && return 0
		sleep 0.1
	done
	die "the set on $b.. did not settle within 60s (see $(state_dir "$b")/*/redis.log)"
}

cmd_start() {
	local b dir p
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
		case $((p - b)) in
		0) write_conf "$p" "$dir/$p" master ;;
		1) write_conf "$p" "$dir/$p" replica "$b" ;;
		*) write_conf "$p" "$dir/$p" sentinel "$b" ;;
		esac
		start_node "$p" "$dir/$p"
	done
	wait_ok "$b"
	url_of "$b"
}

cmd_status() {
	local b dir p pid
	b=$(base_of "${1:-}")
	dir=$(state_dir "$b")
	[[ -d $dir ]] || die "no set on $b"
	for ((p = b; p < b + NODES; p++)); do
		pid=$(pid_of "$dir/$p" || true)
		if [[ -z $pid ]]; then
			echo "$p down"
		elif ((p >= b + 2)); then
			echo "$p pid $pid sentinel, master at $(redis-cli -p "$p" sentinel get-master-addr-by-name "$MASTER" 2>/dev/null | tr -d '\r' | paste -sd: -)"
		else
			echo "$p pid $pid $(info "$p" replication role)"
		fi
	done
}

case ${1:-} in
start) cmd_start "${2:-}" ;;
env) url_of "$(base_of "${2:-}")" ;;
master) master_port "$(base_of "${2:-}")" || die "the Sentinels do not agree on a master" ;;
kill) cmd_kill "${2:-}" ;;
restart) cmd_restart "${2:-}" ;;
wait) wait_ok "$(base_of "${2:-}")" ;;
status) cmd_status "${2:-}" ;;
stop) cmd_stop "${2:-}" ;;
*) die "usage: $0 start|env|master|wait|status|stop [BASE] | kill|restart PORT" ;;
esac
