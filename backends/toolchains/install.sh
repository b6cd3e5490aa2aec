#!/usr/bin/env bash
# Install the toolchains that functions in other languages need on the machine that builds and runs
# them: Go (`go`) for function-go, Ruby (`ruby`, with Bundler's `bundle` for a Gemfile) for
# function-ruby, Node.js (`node`, `npm`) for function-nodejs; the browser the chat widget's tests
# drive (`chromium`, through Playwright's executable_path: nothing is downloaded at test time). What the
# workload sandbox itself needs is `sandbox.sh`'s.
# Idempotent: does nothing when all are there. Installs the missing ones from Debian's packages when
# apt-get can (as root or with sudo -n); otherwise names the packages and fails, because the tests run
# these functions and this browser for real.
set -euo pipefail

declare -A PACKAGE=([go]=golang-go [ruby]=ruby [bundle]=ruby-bundler [gem]=ruby [node]=nodejs [npm]=npm
                   [chromium]=chromium)
missing=()
for tool in go ruby bundle gem node npm chromium; do
  command -v "$tool" >/dev/null || missing+=("${PACKAGE[$tool]}")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "toolchains: go, ruby, bundle, node, npm and chromium are installed"
  exit 0
fi
mapfile -t packages < <(printf '%s\n' "${missing[@]}" | sort -u)

if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  as_root=(unavailable)
fi
if ! command -v apt-get >/dev/null || [ "${as_root[0]:-}" = unavailable ]; then
  echo "toolchains: missing ${packages[*]} (Debian package names); install them to run the function and widget tests" >&2
  exit 1
fi

echo "toolchains: installing ${packages[*]} from Debian's packages"
export DEBIAN_FRONTEND=noninteractive
install() { "${as_root[@]}" apt-get install -y -q --no-install-recommends "${packages[@]}"; }
# A machine whose package lists were never fetched needs an update first.
install >/dev/null || { "${as_root[@]}" apt-get update -q >/dev/null && install >/dev/null; }
for tool in go ruby bundle node npm chromium; do
  command -v "$tool" >/dev/null || { echo "toolchains: $tool is still missing after the install" >&2; exit 1; }
done
echo "toolchains: installed ${packages[*]}"
