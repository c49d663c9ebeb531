#!/usr/bin/env bash
# The README's test command on hosts that take kernel features away, as hardened hosts and
# container runtimes do. Each configuration must pass: a test whose feature the kernel refuses
# says `skipped: <reason>` (so AIO_REQUIRE_ALL_BACKENDS is unset here), and nothing else fails.
#
#   scripts/restricted.sh                 both configurations below
#   scripts/restricted.sh uring-off       kernel.io_uring_disabled = 2 (io_uring_setup fails
#                                         with EPERM for everyone), restored afterwards
#   scripts/restricted.sh unprivileged    as a container's root: RLIMIT_MEMLOCK 64 KiB, and
#                                         CAP_SYS_ADMIN, CAP_IPC_LOCK, CAP_SYS_RESOURCE and
#                                         CAP_DAC_OVERRIDE dropped (no loop devices, no locked
#                                         memory beyond the limit, no raising it)
#
# Extra arguments go to `cargo test` in place of `--workspace` (for example `-p aio-core`).
# Needs root (to set the sysctl and to drop capabilities) and setpriv (util-linux). Run it before resolving any
# issue that touches an engine or the daemon.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

if [ "$(id -u)" -ne 0 ]; then
    echo "restricted: needs root (it sets a sysctl and drops capabilities)" >&2
    exit 2
fi
ensure_installed setpriv util-linux
unset AIO_REQUIRE_ALL_BACKENDS

mode=all
case "${1:-}" in
uring-off | unprivileged | all) mode=$1 && shift ;;
esac
# The README's test command; extra arguments (a package, a filter) replace `--workspace`.
TEST_CMD=(cargo test --workspace)
[ $# -gt 0 ] && TEST_CMD=(cargo test)
# Build first, with every capability: a build under the restrictions would only measure cargo.
"${TEST_CMD[@]}" --no-run "$@" >/dev/null 2>&1 || "${TEST_CMD[@]}" --no-run "$@"

uring_off() {
    local knob=/proc/sys/kernel/io_uring_disabled before
    if [ ! -e "$knob" ]; then
        echo "restricted: this kernel has no $knob" >&2
        exit 2
    fi
    before=$(cat "$knob")
    # shellcheck disable=SC2064 # the value is read now, restored on exit
    trap "echo $before > $knob" EXIT
    echo 2 >"$knob"
    echo "== restricted: kernel.io_uring_disabled = 2"
    "${TEST_CMD[@]}" "$@"
    echo "$before" >"$knob"
    trap - EXIT
}

unprivileged() {
    local drop=-sys_admin,-ipc_lock,-sys_resource,-dac_override
    echo "== restricted: memlock 64 KiB, without CAP_SYS_ADMIN, CAP_IPC_LOCK, CAP_SYS_RESOURCE, CAP_DAC_OVERRIDE"
    # Lowering a limit needs no capability; setpriv then drops the capabilities from the
    # bounding and inheritable sets, so root's next exec (cargo) does not get them back.
    (
        ulimit -l 64
        setpriv --bounding-set "$drop" --inh-caps "$drop" -- \
            "${TEST_CMD[@]}" "$@"
    )
}

case $mode in
uring-off) uring_off "$@" ;;
unprivileged) unprivileged "$@" ;;
all) uring_off "$@" && unprivileged "$@" ;;
esac
echo "restricted: $mode passed"
