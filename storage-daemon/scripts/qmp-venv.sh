#!/usr/bin/env bash
# qmp-venv.sh OUTDIR: a Python virtual environment in OUTDIR with QEMU's QMP library
# (`qemu.qmp` from PyPI, which brings `qmp-shell`), for the tests that drive the daemon with
# QEMU's own client. Prints the environment's python3.
#
# Idempotent: a second run only checks that the library imports. Exit codes: 0 done, 2 what it
# needs cannot be had here (no python3 with venv, no PyPI), 1 anything else.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 1; }
out="$1"
py="$out/bin/python3"
if [ -x "$py" ] && "$py" -c "import qemu.qmp" 2>/dev/null; then
    echo "$py"
    exit 0
fi
command -v python3 >/dev/null || { echo "qmp-venv: unavailable: no python3" >&2; exit 2; }
rm -rf "$out"
python3 -m venv "$out" >&2 || { echo "qmp-venv: unavailable: python3 -m venv failed" >&2; exit 2; }
"$out/bin/pip" install --quiet qemu.qmp >&2 ||
    { echo "qmp-venv: unavailable: pip install qemu.qmp failed" >&2; exit 2; }
"$py" -c "import qemu.qmp" || exit 1
echo "$py"
