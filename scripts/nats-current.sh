#!/usr/bin/env bash
# nats-current.sh builds a current nats-server from the Go module proxy (the
# version go.mod requires, github.com/nats-io/nats-server/v2), never a
# downloaded binary, into .tools/nats-server-<version>/nats-server, and
# prints the export line that puts it first on the PATH. The NATS tests
# that start a nats-server of their own (the fault suite's BrokerRestart,
# BrokerKill and RandomFaults, scripts/cluster/nats.sh) take the
# nats-server on the PATH; the machine's is 2.9.10 (/usr/sbin/nats-server).
#
#   scripts/nats-current.sh build   build it (once; later calls reuse it) and print the export line
#   scripts/nats-current.sh path    print the binary's path (built if missing)
#
# Typical use:
#   eval "$(scripts/nats-current.sh build)"
#   ASYNCPLATFORM_NATS_URL=nats://127.0.0.1:<port> go test ./backend/nats/   # against a server of that binary
set -euo pipefail

cd "$(dirname "$0")/.."
version=$(go list -m -f '{{.Version}}' github.com/nats-io/nats-server/v2)
dir=$PWD/.tools/nats-server-$version
bin=$dir/nats-server

build() {
	if [[ ! -x $bin ]]; then
		mkdir -p "$dir"
		go build -o "$bin.tmp" github.com/nats-io/nats-server/v2 >&2
		mv "$bin.tmp" "$bin"
	fi
}

case ${1:-build} in
build)
	build
	echo "export PATH=$dir:\$PATH"
	;;
path)
	build
	echo "$bin"
	;;
*)
	echo "usage: $0 build|path" >&2
	exit 2
	;;
esac
