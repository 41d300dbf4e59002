#!/usr/bin/env bash
# Builds llama.cpp's own HTTP server (`llama-server`) for tests/llamacpp.rs, from the
# llama.cpp source vendored in the PyPI sdist of llama-cpp-python (no git clone, no
# network beyond PyPI), into target/llama.cpp/bin/llama-server. Idempotent: exits at once
# when that binary already runs. About 6.5 min on two cores. Needs python3 + pip, gcc/g++
# and cmake (installed with apt-get when missing).
#
# Env: CARGO_TARGET_DIR (default: <repo>/target), LLAMA_BUILD_JOBS (default 2).
set -euo pipefail
cd "$(dirname "$0")/../.."

VERSION=0.3.36
TARGET="${CARGO_TARGET_DIR:-$PWD/target}"
ROOT="$TARGET/llama.cpp"
BIN="$ROOT/bin/llama-server"
JOBS="${LLAMA_BUILD_JOBS:-2}"

if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then
  echo "llama-server already built: $BIN"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO=sudo; fi
if ! command -v cmake >/dev/null 2>&1; then
  ($SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq cmake >/dev/null) \
    || { echo "cannot install cmake (Debian package cmake)"; exit 1; }
fi
PYTHON="$(command -v python3 || command -v python)"

start=$(date +%s)
mkdir -p "$ROOT/src"
sdist="$ROOT/src/llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$sdist" ]; then
  # Only this package's source archive: `--no-binary :all:` would also build pip's build
  # tools (cmake, ninja) from source.
  "$PYTHON" -m pip download -q --disable-pip-version-check --no-deps \
    --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d "$ROOT/src"
fi
src="$ROOT/src/llama_cpp_python-$VERSION"
if [ ! -f "$src/vendor/llama.cpp/CMakeLists.txt" ]; then
  rm -rf "$src"
  tar -xzf "$sdist" -C "$ROOT/src"
fi

# LLAMA_BUILD_UI / LLAMA_USE_PREBUILT_UI off, or the build tries to download the web UI.
cmake -S "$src/vendor/llama.cpp" -B "$ROOT/build" \
  -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF \
  -DBUILD_SHARED_LIBS=OFF >"$ROOT/cmake.log" 2>&1 \
  || { tail -n 40 "$ROOT/cmake.log"; echo "cmake configure of llama.cpp failed"; exit 1; }
cmake --build "$ROOT/build" --config Release --target llama-server -j"$JOBS" >"$ROOT/build.log" 2>&1 \
  || { tail -n 40 "$ROOT/build.log"; echo "building llama-server failed"; exit 1; }

mkdir -p "$ROOT/bin"
cp "$ROOT/build/bin/llama-server" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
"$BIN" --version
echo "llama-server built in $(($(date +%s) - start)) s: $BIN"
