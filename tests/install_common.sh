# What the test tiers' install scripts share (tests/*/install.sh); source it after setting NAME
# (the prefix of every line they print) and, for pip_, PY (the environment's python).

say() { echo "[install-$NAME] $*"; }
fail() {
    echo "[install-$NAME] ERROR: $*" >&2
    exit 1
}
# pip, minus the warnings this machine's extra index locations print for every package.
pip_() {
    "$PY" -m pip "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
    return "${PIPESTATUS[0]}"
}
