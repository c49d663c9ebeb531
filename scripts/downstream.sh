#!/usr/bin/env bash
# Builds and runs aio/examples/downstream, a crate outside the workspace that depends on `aio`
# with the features `epoll` and `linux-aio` only: the engine it names runs, and one whose
# feature it left out is refused with the feature to turn on (exit 2).
set -euo pipefail
cd "$(dirname "$0")/../aio/examples/downstream"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/../../../target}"
cargo build --locked --quiet
bin="$CARGO_TARGET_DIR/debug/aio-downstream-example"
ENGINE=linux-aio FDMON=epoll "$bin"
set +e
out=$(ENGINE=pool "$bin" 2>&1)
rc=$?
set -e
if [ "$rc" -ne 2 ] || ! grep -q "turn on the \`pool\` feature" <<<"$out"; then
    echo "downstream: a left-out engine should exit 2 naming its feature; got $rc: $out" >&2
    exit 1
fi
echo "downstream: ok (linux-aio ran; pool refused: $out)"
