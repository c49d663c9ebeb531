# Shared by the scripts: source it, then `ensure_installed COMMAND PACKAGE`.

# Installs PACKAGE with apt-get (Debian/Ubuntu, as root) when COMMAND is missing; exits with
# code 2 and says what to run when that is not possible.
ensure_installed() {
    local cmd="$1" pkg="$2" me
    me="$(basename "$0" .sh)"
    command -v "$cmd" >/dev/null 2>&1 && return 0
    echo "$me: $cmd is missing; installing $pkg with apt-get" >&2
    if [ "$(id -u)" -ne 0 ]; then
        echo "$me: not root: run 'sudo apt-get install -y $pkg' first" >&2
        exit 2
    fi
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >/dev/null
}
