#!/usr/bin/env bash
# Installs what codagpt builds with, from Debian/Ubuntu packages. As root it runs apt-get;
# otherwise it prints the command to run. Does nothing when everything is already there.
# The CUDA toolkit (nvcc, cuBLASLt), cuDNN and NCCL are optional and not installed here:
# without nvcc the CPU reference is built; see README.md for the GPU set-up.
set -euo pipefail

# python3-numpy: the tests of scripts/compare_dumps.py (a debugging aid; training runs no Python)
packages=(cmake make g++ nlohmann-json3-dev libcli11-dev libgtest-dev libicu-dev python3-numpy)

# A package counts as present when dpkg has it installed; on machines without dpkg we look for
# the files the build needs instead (headers may have been copied by hand).
missing=()
if command -v dpkg-query >/dev/null 2>&1; then
  for p in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [[ "$status" == "install ok installed" ]] || missing+=("$p")
  done
else
  for tool in cmake make g++; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
fi

if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: missing packages: ${missing[*]}" >&2
  echo "setup: run: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
