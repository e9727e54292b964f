#!/usr/bin/env bash
# Machine set-up the build benefits from. Only ccache (optional): everything else the
# build needs comes from PyPI through pip (scikit-build-core, cmake, ninja, cffi, numpy, gguf).
set -uo pipefail
if ! command -v ccache >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "ci/setup.sh: installing ccache (Debian package)"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ccache) >/dev/null 2>&1 \
            || echo "ci/setup.sh: could not install ccache; building without it"
    else
        echo "ci/setup.sh: ccache not found; building without it"
    fi
fi
exit 0
