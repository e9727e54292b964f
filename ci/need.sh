#!/usr/bin/env bash
# Sourced by the scripts README names (wheel-linux.sh, wheel-windows.sh): `need CMD PACKAGE...` returns when CMD is
# on PATH; else, as root with apt-get (and LONGHAUL_NO_APT unset), installs the Debian package(s) and checks again;
# else stops the script before it starts anything, saying what to install.
need() {
    local cmd=$1 who=${NEED_WHO:-$(basename "$0")}
    shift
    command -v "$cmd" >/dev/null 2>&1 && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && [ -z "${LONGHAUL_NO_APT:-}" ]; then
        echo "$who: $cmd not found: installing $* (Debian package)" >&2
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@") >/dev/null 2>&1 || true
        command -v "$cmd" >/dev/null 2>&1 && return 0
        echo "$who: installing $* did not give $cmd (offline?)" >&2
    fi
    echo "$who: $cmd not found: install it first (as root: apt-get install $*)" >&2
    exit 2
}
