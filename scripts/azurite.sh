#!/usr/bin/env bash
# azurite.sh installs and runs Azurite, Microsoft's Azure Storage emulator,
# for the Azure backend's tests. Nothing is downloaded but the pinned npm
# package (and its npm dependencies) from the npm registry.
#
#   scripts/azurite.sh install          install the pinned version into .tools/azurite (fast when present)
#   scripts/azurite.sh start [PORT]     start the queue service on 127.0.0.1:PORT (a free port when omitted)
#                                       and the blob service beside it on a free port (the Azure backend keeps
#                                       its dead letters in Blob Storage), in memory, telemetry off; prints the
#                                       export line for ASYNCPLATFORM_AZURE_CONNECTION_STRING (with QueueEndpoint
#                                       and BlobEndpoint) and writes it to .tools/azurite/env
#   scripts/azurite.sh stop             stop the instance that start started
#   scripts/azurite.sh env              print the export line of the running instance
#
# Typical use:  scripts/azurite.sh install && eval "$(scripts/azurite.sh start)"
set -euo pipefail

AZURITE_VERSION=3.37.0
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=$ROOT/.tools/azurite
BIN=$DIR/node_modules/.bin/azurite
PIDFILE=$DIR/azurite.pid
ENVFILE=$DIR/env
LOG=$DIR/azurite.log
# The well-known Azurite development account; it is public and only works
# against the emulator.
ACCOUNT=devstoreaccount1
KEY='Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=='

die() { echo "azurite.sh: $*" >&2; exit 1; }

installed_version() {
	node -e 'process.stdout.write(require(process.argv[1]).version)' \
		"$DIR/node_modules/azurite/package.json" 2>/dev/null || true
}

install() {
	if [[ -x $BIN && $(installed_version) == "$AZURITE_VERSION" ]]; then
		return 0
	fi
	command -v npm >/dev/null || die "npm is not installed (apt-get install nodejs npm)"
	mkdir -p "$DIR"
	echo "azurite.sh: installing azurite@$AZURITE_VERSION into $DIR" >&2
	npm install --prefix "$DIR" --no-audit --no-fund --loglevel=error \
		"azurite@$AZURITE_VERSION" >&2 || die "npm install azurite@$AZURITE_VERSION failed"
	[[ -x $BIN ]] || die "$BIN missing after install"
}

free_port() {
	node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{process.stdout.write(String(s.address().port));s.close()})'
}

running() { [[ -f $PIDFILE ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

start() {
	[[ -x $BIN ]] || die "Azurite is not installed: run scripts/azurite.sh install"
	if running; then
		if grep -q BlobEndpoint= "$ENVFILE" 2>/dev/null; then
			cat "$ENVFILE"
			return 0
		fi
		# Started by an older version of this script, without the blob service.
		stop
	fi
	local port=${1:-$(free_port)}
	local blobport
	blobport=$(free_port)
	while [[ $blobport == "$port" ]]; do blobport=$(free_port); done
	: >"$LOG"
	# One process serves the queue and blob services (and the table service,
	# unused, on a port of the system's choosing). setsid: the emulator
	# outlives this script but not a kill of its pid.
	AZURITE_ACCOUNTS="$ACCOUNT:$KEY" setsid "$BIN" \
		--queueHost 127.0.0.1 --queuePort "$port" \
		--blobHost 127.0.0.1 --blobPort "$blobport" \
		--tableHost 127.0.0.1 --tablePort 0 \
		--inMemoryPersistence --disableTelemetry --skipApiVersionCheck --loose --silent \
		>>"$LOG" 2>&1 </dev/null &
	local pid=$!
	echo "$pid" >"$PIDFILE"
	# Booting three services takes a few seconds, more on a loaded machine.
	for _ in $(seq 1 600); do
		if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && (exec 3<>"/dev/tcp/127.0.0.1/$blobport") 2>/dev/null; then
			local cs="DefaultEndpointsProtocol=http;AccountName=$ACCOUNT;AccountKey=$KEY;QueueEndpoint=http://127.0.0.1:$port/$ACCOUNT;BlobEndpoint=http://127.0.0.1:$blobport/$ACCOUNT;"
			echo "export ASYNCPLATFORM_AZURE_CONNECTION_STRING='$cs'" >"$ENVFILE"
			cat "$ENVFILE"
			return 0
		fi
		kill -0 "$pid" 2>/dev/null || { cat "$LOG" >&2; rm -f "$PIDFILE"; die "Azurite exited at start-up"; }
		sleep 0.1
	done
	kill "$pid" 2>/dev/null || true
	rm -f "$PIDFILE"
	die "Azurite did not listen on 127.0.0.1:$port and :$blobport within 60s (log: $LOG)"
}

stop() {
	if running; then
		local pid
		pid=$(cat "$PIDFILE")
		kill "$pid"
		for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
	fi
	rm -f "$PIDFILE" "$ENVFILE"
}

case ${1:-} in
install) install ;;
start) start "${2:-}" ;;
stop) stop ;;
env) running && cat "$ENVFILE" || die "Azurite is not running" ;;
*) die "usage: $0 install | start [PORT] | stop | env" ;;
esac
