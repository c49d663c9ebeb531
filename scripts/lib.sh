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

# The apt release qemu-utils was installed from when it is a backports build (its version has
# `~bpoNN`, as bookworm-backports' 10.0.x does), else nothing: QEMU's other packages
# (qemu-block-extra, qemu-system-x86) must come from the same release, since bookworm's own 7.2
# would replace qemu-utils and remove qemu-storage-daemon.
qemu_backports_release() {
    local version codename
    version="$(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null || true)"
    case "$version" in
    *~bpo*) ;;
    *) return 0 ;;
    esac
    codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
    [ -n "$codename" ] && echo "$codename-backports"
}

# The apt source file this project adds (never an edit of the machine's own sources).
AIO_BACKPORTS_SOURCE=/etc/apt/sources.list.d/aio-rs-backports.sources

# Adds an apt source for RELEASE (deb.debian.org, Debian's archive key) in a file of its own
# when no configured source names it, and runs `apt-get update` then. Returns 1 when it cannot
# (not root). A machine whose qemu-utils came from backports may have no backports source: apt
# then refuses `-t RELEASE` ("such a release is not available in the sources").
ensure_apt_source() {
    local release="$1" me f
    me="$(basename "$0" .sh)"
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        grep -v '^[[:space:]]*#' "$f" | grep -qw -- "$release" && return 0
    done
    if [ "$(id -u)" -ne 0 ]; then
        echo "$me: no apt source names $release and this is not root" >&2
        return 1
    fi
    echo "$me: adding the $release apt source ($AIO_BACKPORTS_SOURCE)" >&2
    cat >"$AIO_BACKPORTS_SOURCE" <<SOURCE
Types: deb
URIs: http://deb.debian.org/debian
Suites: $release
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCE
    apt-get update -qq
}

# Installs the QEMU package PKG (qemu-block-extra, qemu-system-x86, ...) of exactly the version
# of the installed qemu-utils, adding its backports source first when needed. Refuses an install
# that would remove a package (apt replacing qemu-utils by another release's). Returns non-zero
# with a message when it cannot.
ensure_qemu_package() {
    local pkg="$1" me version release sim
    me="$(basename "$0" .sh)"
    if [ "$(id -u)" -ne 0 ]; then
        echo "$me: $pkg is missing and this is not root: run 'sudo apt-get install $pkg'" >&2
        return 1
    fi
    version="$(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null || true)"
    release="$(qemu_backports_release)"
    if [ -n "$release" ]; then
        ensure_apt_source "$release" || return 1
    else
        apt-get update -qq
    fi
    local want="$pkg" target=()
    [ -n "$version" ] && want="$pkg=$version"
    # -t as well as the version: the package's own QEMU dependencies come from the same release.
    [ -n "$release" ] && target=(-t "$release")
    if ! sim="$(apt-get install -s -y --no-install-recommends "${target[@]}" "$want" 2>&1)"; then
        echo "$me: apt-get cannot install $want: $(echo "$sim" | tail -n2)" >&2
        return 1
    fi
    if echo "$sim" | grep -q '^Remv '; then
        echo "$sim" | grep '^Remv ' >&2
        echo "$me: installing $want would remove the packages above; refused" >&2
        return 1
    fi
    echo "$me: apt-get install ${target[*]} $want" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${target[@]}" "$want" >/dev/null
}

# Whether QEMU's rbd block driver module is installed. `qemu-img --help` lists `rbd` among its
# formats even without the module (qemu-block-extra), so it cannot tell.
qemu_has_rbd_module() {
    compgen -G '/usr/lib/*/qemu/block-rbd.so' >/dev/null ||
        compgen -G '/usr/lib/qemu/block-rbd.so' >/dev/null
}
