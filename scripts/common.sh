# Shared by scripts/demo, scripts/test and scripts/gpu-check: install what is missing, configure,
# build. Idempotent: a second run with nothing changed only re-checks and re-links nothing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JOBS="${JOBS:-$(nproc)}"

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

# Debian packages lowbit builds against (header-only or shared): installed only when missing.
DEBIAN_PACKAGES=(cmake ninja-build g++ libcli11-dev nlohmann-json3-dev libfmt-dev
                 libgtest-dev python3 python3-pip)
# PyPI packages for the Python module and its tests.
PYPI_PACKAGES=(nanobind numpy pytest safetensors scikit-build-core)
# Headers only: CUTLASS 3.x (cute/, cutlass/) for the sm_90a int8 GEMM, installed without its
# Python dependencies (CMake reads cutlass_library/source/include; nothing is imported).
HEADER_PYPI_PACKAGES=(nvidia-cutlass)
# Optional, for the tests of lowbit.torch (tests/python/test_torch.py skips without it): torch is
# ~3 GB with its CUDA libraries, so the install is best effort (bounded in time; a failure only
# leaves those tests skipped). LOWBIT_NO_TORCH=1 skips it.
OPTIONAL_PYPI_PACKAGES=(torch)

ensure_debian_packages() {
  local missing=()
  for p in "${DEBIAN_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  # python3/pip may come from elsewhere (pyenv): accept any working python3 -m pip.
  if command -v python3 >/dev/null && python3 -m pip --version >/dev/null 2>&1; then
    local keep=()
    for p in "${missing[@]}"; do [[ "$p" == python3 || "$p" == python3-pip ]] || keep+=("$p"); done
    missing=("${keep[@]+"${keep[@]}"}")
  fi
  if ((${#missing[@]})); then
    log "installing Debian packages: ${missing[*]}"
    local sudo=""; [[ $(id -u) -eq 0 ]] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

python_has() { python3 -c "import $1" >/dev/null 2>&1; }

ensure_pypi_packages() {
  local missing=()
  for p in "${PYPI_PACKAGES[@]}"; do
    local mod="${p//-/_}"
    python_has "$mod" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    log "installing PyPI packages: ${missing[*]}"
    python3 -m pip install -q "${missing[@]}" 2>&1 | grep -v "Running pip as the 'root' user" || true
  fi
  if [[ "${LOWBIT_NO_TORCH:-0}" != 1 ]]; then
    local p
    for p in "${OPTIONAL_PYPI_PACKAGES[@]}"; do
      python_has "$p" && continue
      log "installing optional PyPI package: $p (best effort: its tests skip without it)"
      if ! timeout 1200 python3 -m pip install -q "$p" >/tmp/lowbit-pip-$p.log 2>&1 ||
         ! python_has "$p"; then
        # A cut or broken install must not leave a package that fails on import (the tests
        # would error instead of skipping): remove what is there.
        python3 -m pip uninstall -q -y "$p" >>/tmp/lowbit-pip-$p.log 2>&1 || true
        log "$p not installed (see /tmp/lowbit-pip-$p.log): its tests will skip"
      fi
    done
  fi
  # nvidia-cutlass -> cutlass_library, looked up without importing it (its deps are not installed).
  if ! python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('cutlass_library') is None)" \
       >/dev/null 2>&1; then
    log "installing PyPI packages (headers, no deps): ${HEADER_PYPI_PACKAGES[*]}"
    python3 -m pip install -q --no-deps "${HEADER_PYPI_PACKAGES[@]}" 2>&1 \
      | grep -v "Running pip as the 'root' user" || true
  fi
}

# configure_and_build BUILD_DIR [cmake args...]
configure_and_build() {
  local dir="$1"; shift
  local py_args=()
  if python_has nanobind; then
    py_args=(-DLOWBIT_BUILD_PYTHON=ON -Dnanobind_DIR="$(python3 -m nanobind --cmake_dir)"
             -DPython_EXECUTABLE="$(command -v python3)")
  fi
  if [[ ! -f "$dir/build.ninja" ]]; then
    log "configuring $dir"
    cmake -S "$ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${py_args[@]}" "$@" >/dev/null
  fi
  log "building $dir ($JOBS jobs)"
  cmake --build "$dir" -j "$JOBS"
}
