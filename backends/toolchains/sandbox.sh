#!/usr/bin/env bash
# Install what the workload sandbox needs beyond Python packages (docs/sandbox.md): the system's libseccomp
# (`libseccomp.so.2`, loaded by the `pyseccomp` binding to compile the syscall filter), and for each
# workload's own network `pasta` (Debian's passt), `nft` (nftables) and `nsenter` (util-linux); with
# `--tests`, also a C compiler (the sandbox tests build an LD_PRELOAD library). Idempotent; installs from
# Debian's packages when apt-get can (as root or with sudo -n), otherwise names the packages and fails.
set -euo pipefail

missing=()
ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2 ' || missing+=(libseccomp2)
command -v pasta >/dev/null || missing+=(passt)
command -v nft >/dev/null || missing+=(nftables)
command -v nsenter >/dev/null || missing+=(util-linux)
if [ "${1:-}" = "--tests" ]; then
  command -v gcc >/dev/null || missing+=(gcc libc6-dev)
fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "sandbox: libseccomp, pasta, nft and nsenter are installed"
  exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  echo "sandbox: missing ${missing[*]} (Debian package names); install them to run the sandbox and its tests" >&2
  exit 1
fi
command -v apt-get >/dev/null || { echo "sandbox: missing ${missing[*]} and no apt-get" >&2; exit 1; }
echo "sandbox: installing ${missing[*]} from Debian's packages"
export DEBIAN_FRONTEND=noninteractive
install() { "${as_root[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"; }
install >/dev/null || { "${as_root[@]}" apt-get update -q >/dev/null && install >/dev/null; }
echo "sandbox: installed ${missing[*]}"
