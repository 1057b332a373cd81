#!/usr/bin/env bash
# Debian's chromium and chromium-driver, for the headless-browser tests of `arpo view`
# (tests/view/test_view_browser.py, driven by selenium from the `test` extra). Without them those
# tests skip locally; under CI (CI=true) they fail, so CI runs this first (.ci/run).
#
#   scripts/install_browser.sh        # as root, or with sudo; Debian/Ubuntu apt
#
# Idempotent: when both are already installed it only says so.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  echo "chromium and chromedriver are installed ($(chromium --version 2>/dev/null | head -n1))"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq chromium chromium-driver >/dev/null
echo "installed $(chromium --version 2>/dev/null | head -n1) and $(chromedriver --version | head -n1)"
