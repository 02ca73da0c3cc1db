#!/usr/bin/env bash
# Installs the pinned build and test dependencies on Debian/Ubuntu. Safe to run
# again: packages already present at the pinned version are left alone.
set -euo pipefail

apt_pins=(
  "cmake=3.25.1-1"
  "g++=4:12.2.0-3"
  "make=4.3-4.1"
  "libgtest-dev=1.12.1-0.2"
  "libcli11-dev=2.1.2+ds-1"
  "nlohmann-json3-dev=3.11.2-2"
)
pip_pins=(
  "numpy==2.1.3"
  "ml_dtypes==0.5.1"
  "pytest==8.4.2"
  "scikit-build-core==0.11.6"
  "nanobind==2.9.2"
)

missing=()
for pin in "${apt_pins[@]}"; do
  pkg=${pin%%=*}; ver=${pin#*=}
  have=$(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null || true)
  # Another distribution release may carry another version: any installed
  # version is accepted; the pin is what a fresh Debian 12 machine gets.
  [ -n "$have" ] || missing+=("$pin")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  echo "installing: ${missing[*]}"
  $sudo_cmd apt-get update -qq
  if ! DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}"; then
    # Not Debian 12: take the distribution's version of the same packages.
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]%%=*}"
  fi
fi

if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "note: nvcc found at /usr/local/cuda/bin; the Makefile adds it to PATH"
fi

py=${PYTHON:-python3}
if command -v "$py" >/dev/null 2>&1; then
  need_pip=0
  for pin in "${pip_pins[@]}"; do
    name=${pin%%==*}; ver=${pin#*==}
    have=$("$py" -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null || true)
    [ "$have" = "$ver" ] || need_pip=1
  done
  if [ $need_pip -eq 1 ]; then
    "$py" -m pip install -q "${pip_pins[@]}" || echo "warning: pip install failed; Python checks will be skipped"
  fi
fi
