#!/usr/bin/env bash
# Installs the Debian packages hetserve needs when run as root; otherwise names the command.
#   pocl-opencl-icd + ocl-icd-libopencl1: OpenCL on the CPU (PyPI's PoCL is too old for new CPUs)
#   oclgrind: the OpenCL simulator `make kernel-check` runs the kernel tests under
#   systemd: `systemd-analyze verify` checks deploy/systemd/hetserve.service
#   default-jre-headless: the Java 17+ runtime that Spark needs
#   prometheus (prometheus + promtool, for the metrics tests): unpacked from Debian's package into
#     .tools/prometheus, never installed, so no service is left running
set -euo pipefail

prom_dir="$(cd "$(dirname "$0")/.." && pwd)/.tools/prometheus"
if [ ! -x "$prom_dir/usr/bin/promtool" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  if ! (cd "$work" && apt-get download -q prometheus >/dev/null 2>&1); then
    if [ "$(id -u)" -ne 0 ]; then
      echo "hetserve's tests need Debian's prometheus package lists; run: sudo apt-get update" >&2
      exit 1
    fi
    apt-get update -q
    (cd "$work" && apt-get download -q prometheus)
  fi
  mkdir -p "$prom_dir"
  dpkg -x "$work"/prometheus_*.deb "$prom_dir"
  echo "unpacked prometheus and promtool into $prom_dir"
fi

missing=()
for pkg in pocl-opencl-icd ocl-icd-libopencl1 oclgrind systemd; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
done
java_major=$(java -version 2>&1 | sed -nE '1s/.*version "([0-9]+).*/\1/p')
[ -n "$java_major" ] && [ "$java_major" -ge 17 ] || missing+=(default-jre-headless)

[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "hetserve needs Debian packages; run: sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing ${missing[*]}"
apt-get update -q
DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
