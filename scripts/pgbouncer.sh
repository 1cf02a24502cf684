#!/usr/bin/env bash
# pgbouncer.sh installs Debian's pgbouncer package and runs PgBouncers in
# transaction pool mode in front of the machine's PostgreSQL, for the
# PostgreSQL backend's pooling test (backend/postgres, TestPgBouncer).
#
#   scripts/pgbouncer.sh install        install pgbouncer with apt-get (nothing when it is on PATH
#                                       or in /usr/sbin); needs root, or sudo
#   scripts/pgbouncer.sh start PORT     start one on 127.0.0.1:PORT, pool_mode = transaction, every
#                                       database to 127.0.0.1:5432 (PGBOUNCER_SERVER=host:port to change),
#                                       auth trust; prints its URL; its files go to
#                                       ${PGBOUNCER_DIR:-.tools/pgbouncer}/PORT
#   scripts/pgbouncer.sh stop PORT      stop the one that start PORT started
#
# Without pgbouncer, the pooling test skips (fails with
# ASYNCPLATFORM_REQUIRE_SERVERS=1, as in CI). Clients behind it need pgx's
# default_query_exec_mode=simple_protocol: PgBouncer 1.18 in transaction
# mode keeps no prepared statement from one transaction to the next.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BASE=${PGBOUNCER_DIR:-$ROOT/.tools/pgbouncer}
SERVER=${PGBOUNCER_SERVER:-127.0.0.1:5432}

die() { echo "pgbouncer.sh: $*" >&2; exit 1; }

bin() {
	if command -v pgbouncer >/dev/null 2>&1; then
		command -v pgbouncer
	elif [[ -x /usr/sbin/pgbouncer ]]; then
		echo /usr/sbin/pgbouncer
	else
		return 1
	fi
}

install() {
	if bin >/dev/null; then
		return 0
	fi
	command -v apt-get >/dev/null 2>&1 || die "pgbouncer is not installed and there is no apt-get: install PgBouncer and put it on PATH"
	local sudo=()
	if [[ $(id -u) != 0 ]]; then
		command -v sudo >/dev/null 2>&1 || die "pgbouncer is not installed and installing it needs root"
		sudo=(sudo)
	fi
	echo "pgbouncer.sh: installing Debian's pgbouncer package" >&2
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
	# The package's service is not wanted: policy-rc.d (where present)
	# keeps it from starting; each test starts its own on a port of its own.
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >&2
	bin >/dev/null || die "apt-get installed pgbouncer but it is not on PATH nor in /usr/sbin"
}

start() {
	local port=$1 exe
	[[ $port =~ ^[0-9]+$ ]] || die "usage: scripts/pgbouncer.sh start PORT"
	exe=$(bin) || die "pgbouncer is not installed: run scripts/pgbouncer.sh install"
	local dir=$BASE/$port
	mkdir -p "$dir"
	if [[ -f $dir/pid ]] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
		echo "postgres://postgres@127.0.0.1:$port/test?sslmode=disable"
		return 0
	fi
	cat >"$dir/pgbouncer.ini" <<EOF
[databases]
* = host=${SERVER%:*} port=${SERVER##*:}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
ignore_startup_parameters = extra_float_digits
EOF
	echo '"postgres" ""' >"$dir/userlist.txt"
	local user=()
	if [[ $(id -u) == 0 ]]; then
		# PgBouncer refuses to run as root; it reads its files first.
		id postgres >/dev/null 2>&1 && user=(-u postgres) || user=(-u nobody)
	fi
	: >"$dir/log"
	setsid "$exe" "${user[@]}" "$dir/pgbouncer.ini" >>"$dir/log" 2>&1 </dev/null &
	local pid=$!
	echo "$pid" >"$dir/pid"
	for _ in $(seq 1 300); do
		if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			echo "postgres://postgres@127.0.0.1:$port/test?sslmode=disable"
			return 0
		fi
		kill -0 "$pid" 2>/dev/null || { cat "$dir/log" >&2; rm -f "$dir/pid"; die "pgbouncer exited at start-up"; }
		sleep 0.1
	done
	kill "$pid" 2>/dev/null || true
	rm -f "$dir/pid"
	die "pgbouncer did not listen on 127.0.0.1:$port within 30s (log: $dir/log)"
}

stop() {
	local port=$1 dir=$BASE/$1
	[[ $port =~ ^[0-9]+$ ]] || die "usage: scripts/pgbouncer.sh stop PORT"
	if [[ -f $dir/pid ]] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
		local pid
		pid=$(cat "$dir/pid")
		kill "$pid"
		for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
	fi
	rm -f "$dir/pid"
}

case ${1:-} in
install) install ;;
start) start "${2:-}" ;;
stop) stop "${2:-}" ;;
*) die "usage: scripts/pgbouncer.sh install | start PORT | stop PORT" ;;
esac
