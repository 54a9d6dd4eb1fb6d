# Shared set-up for scripts/demo and scripts/test: find the Rust toolchain and install the Debian
# packages a step needs. Sourced, not executed.

export PATH="$HOME/.cargo/bin:$PATH"

# apt-get install the given packages if any is missing (root on Debian 12; sudo otherwise).
ensure_packages() {
    local missing=()
    for package in "$@"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "==> installing ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

# Miri on the nightly toolchain (rustup's components miri and rust-src), installed when missing:
# the test command runs Miri rather than skipping it. Fails loudly when rustup cannot install it.
ensure_miri() {
    if cargo +nightly miri --version >/dev/null 2>&1; then
        return
    fi
    if ! command -v rustup >/dev/null 2>&1; then
        echo "error: Miri is missing and there is no rustup to install it with" >&2
        exit 1
    fi
    rustup toolchain list | grep -q '^nightly' ||
        rustup toolchain install nightly --profile minimal >/dev/null
    rustup component add miri rust-src --toolchain nightly >/dev/null
    cargo +nightly miri --version >/dev/null
}

ensure_rust() {
    if ! command -v cargo >/dev/null 2>&1; then
        echo "error: cargo not found (looked in PATH and ~/.cargo/bin). MPIB needs Rust 1.80 or newer:" >&2
        echo "       install it with rustup (https://rustup.rs) and run this again." >&2
        exit 1
    fi
}
