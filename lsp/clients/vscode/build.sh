#!/usr/bin/env bash
# Build the VS Code extension: npm ci (or install), tsc, vsce package -> lsp/clients/vscode/flywheel.vsix
#
# Run: bash lsp/clients/vscode/build.sh        (Node 20+ and npm; packages come from the npm registry)
# Idempotent: node_modules is reused when package-lock.json did not change.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
export npm_config_yes=true npm_config_fund=false npm_config_audit=false npm_config_update_notifier=false
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
    if [ -f package-lock.json ]; then npm ci --loglevel=error; else npm install --loglevel=error; fi
fi
npx tsc -p ./
npx vsce package --allow-missing-repository --skip-license -o flywheel.vsix
echo "[build-vscode] built $(pwd)/flywheel.vsix"
