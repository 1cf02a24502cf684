#!/usr/bin/env bash
# chromium.sh installs Debian's chromium package, which the dashboard's
# browser tests (package dashboard) drive headless through chromedp. It does
# nothing when chromium is already on PATH.
#
#   scripts/chromium.sh install
#
# It needs root (apt-get). Without root, and without chromium, it says so and
# leaves the browser tests to skip (or to fail, with
# ASYNCPLATFORM_REQUIRE_SERVERS=1, as in CI).
set -euo pipefail

die() { echo "chromium.sh: $*" >&2; exit 1; }

install() {
	if command -v chromium >/dev/null 2>&1; then
		return 0
	fi
	command -v apt-get >/dev/null 2>&1 || die "chromium is not installed and there is no apt-get: install Chromium and put it on PATH as chromium"
	local sudo=()
	if [[ $(id -u) != 0 ]]; then
		command -v sudo >/dev/null 2>&1 || die "chromium is not installed and installing it needs root"
		sudo=(sudo)
	fi
	echo "chromium.sh: installing Debian's chromium package" >&2
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >&2
	command -v chromium >/dev/null 2>&1 || die "apt-get installed chromium but it is not on PATH"
}

case "${1:-}" in
install) install ;;
*) die "usage: scripts/chromium.sh install" ;;
esac
