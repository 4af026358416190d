#!/usr/bin/env bash
# Builds and runs gpufence's libFuzzer targets (docs/fuzzing.md).
#   fuzz.sh build [DIR]            configure and build the fuzz build (default build-fuzz); when no
#                                  clang with libFuzzer is found, record why in DIR/UNAVAILABLE
#   fuzz.sh run NAME SECONDS [DIR] replay tests/fuzz/corpus/NAME (crash regressions included),
#                                  then fuzz for SECONDS; exit 77 when there is no fuzz build
#   fuzz.sh all SECONDS [DIR]      run every target in turn, one at a time
# Environment: FUZZ_CXX (the clang++ to use, and no other), JOBS (build parallelism), FUZZ_ARGS (extra
# libFuzzer flags, e.g. -jobs=2 or -seed=1).
set -uo pipefail
# Symbolised stack traces in crash reports (any llvm-symbolizer reads clang 19 DWARF well enough).
if [ -z "${ASAN_SYMBOLIZER_PATH:-}" ] && command -v llvm-symbolizer >/dev/null 2>&1; then
  export ASAN_SYMBOLIZER_PATH="$(command -v llvm-symbolizer)"
fi

here="$(cd "$(dirname "$0")" && pwd)"
source_dir="$(cd "$here/../.." && pwd)"

# libstdc++ 12's <expected> needs __cpp_concepts >= 202002L, which clang defines from 19 on:
# older clangs are found but cannot compile gpufence (docs/fuzzing.md).
probe_clang() {
  local cxx="$1" tmp
  command -v "$cxx" >/dev/null 2>&1 || return 1
  tmp="$(mktemp -d)"
  cat >"$tmp/probe.cpp" <<'EOF'
#include <cstddef>
#include <cstdint>
#include <expected>
extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t n) {
  std::expected<int, int> r = static_cast<int>(n);
  return r ? 0 : 1;
}
EOF
  "$cxx" -std=c++2b -fsanitize=fuzzer,address,undefined "$tmp/probe.cpp" -o "$tmp/probe" \
    >"$tmp/log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || probe_error="$cxx: $(grep -m1 error "$tmp/log")"
  rm -rf "$tmp"
  return $rc
}

find_clang() {
  local candidates=(clang++-19 clang++ clang++-22 clang++-21 clang++-20)
  [ -n "${FUZZ_CXX:-}" ] && candidates=("$FUZZ_CXX")  # named: that one or none
  probe_error="no clang++ found (tried ${candidates[*]})"
  for cxx in "${candidates[@]}"; do
    if probe_clang "$cxx"; then
      fuzz_cxx="$cxx"
      return 0
    fi
  done
  return 1
}

cmd_build() {
  local dir="${1:-$source_dir/build-fuzz}" cxx cc
  mkdir -p "$dir"
  if ! find_clang; then
    echo "no clang with libFuzzer that compiles C++23 std::expected: $probe_error" \
      "(scripts/install-deps.sh installs clang-19 and libclang-rt-19-dev)" >"$dir/UNAVAILABLE"
    echo "fuzz: skipping the fuzz build: $(cat "$dir/UNAVAILABLE")" >&2
    return 0
  fi
  rm -f "$dir/UNAVAILABLE"
  cxx="$fuzz_cxx"
  cc="${cxx/clang++/clang}"
  command -v "$cc" >/dev/null 2>&1 || cc=clang
  local launcher=()
  if command -v ccache >/dev/null 2>&1; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  fi
  # Warnings stay warnings here: this build exists to find crashes, and clang warns about things
  # g++ (the compiler the project's -Werror is for) does not.
  cmake -S "$source_dir" -B "$dir" -DGPUFENCE_FUZZ=ON -DGPUFENCE_WERROR=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_COMPILER="$cc" \
    "${launcher[@]}" >/dev/null || return 1
  cmake --build "$dir" -j "${JOBS:-2}"
}

cmd_run() {
  local name="$1" seconds="$2" dir="${3:-$source_dir/build-fuzz}"
  local bin="$dir/bin/fuzz_$name" corpus="$here/corpus/$name"
  if [ -f "$dir/UNAVAILABLE" ]; then
    echo "SKIP fuzz.$name: $(cat "$dir/UNAVAILABLE")"
    return 77
  fi
  if [ ! -x "$bin" ]; then
    echo "SKIP fuzz.$name: no fuzz build at $dir (make fuzz-build, or make test, builds it)"
    return 77
  fi
  # New inputs go to the build directory; the committed seeds are only read.
  local work="$dir/fuzz-work/$name" artifacts="$dir/fuzz-artifacts/$name"
  mkdir -p "$work" "$artifacts"
  local dict=()
  [ -f "$here/$name.dict" ] && dict=(-dict="$here/$name.dict")

  # 1. Every committed input, crash regressions included, must run clean.
  local files=()
  [ -d "$corpus" ] && mapfile -t files < <(find "$corpus" -type f | sort)
  if [ ${#files[@]} -gt 0 ]; then
    if ! "$bin" -runs=1 "${files[@]}" >"$work.replay.log" 2>&1; then
      echo "FAIL fuzz.$name: a committed corpus input crashes:"
      tail -n 60 "$work.replay.log"
      return 1
    fi
  fi

  # 2. Fuzz from the seeds for the budget.
  # shellcheck disable=SC2086
  "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" "${dict[@]}" ${FUZZ_ARGS:-} "$work" "$corpus" \
    >"$work.log" 2>&1
  local rc=$?
  local execs corpus_size
  execs="$(grep -m1 -o 'stat::number_of_executed_units: [0-9]*' "$work.log" | awk '{print $2}')"
  corpus_size="$(find "$work" -type f | wc -l)"
  if [ $rc -ne 0 ]; then
    echo "FAIL fuzz.$name: libFuzzer exited $rc; the input is in $artifacts/ (commit it to" \
      "tests/fuzz/corpus/$name/ with a unit test once fixed). Log tail:"
    tail -n 80 "$work.log"
    return 1
  fi
  echo "fuzz.$name: ${seconds}s, ${execs:-?} executions, ${#files[@]} seeds replayed," \
    "$corpus_size inputs in $work, no crash"
}

cmd_all() {
  local seconds="$1" dir="${2:-$source_dir/build-fuzz}" failed=0 skipped=0 passed=0 rc
  local names
  names="$(tr '\n' ' ' <"$here/targets.cmake" | sed 's/.*GPUFENCE_FUZZ_TARGETS\([^)]*\)).*/\1/')"
  for name in $names; do
    cmd_run "$name" "$seconds" "$dir"
    rc=$?
    case $rc in
      0) passed=$((passed + 1)) ;;
      77) skipped=$((skipped + 1)) ;;
      *) failed=$((failed + 1)) ;;
    esac
  done
  echo "fuzz: $passed passed, $failed failed, $skipped skipped"
  [ $failed -eq 0 ]
}

case "${1:-}" in
  build) shift; cmd_build "$@" ;;
  run) shift; cmd_run "$@" ;;
  all) shift; cmd_all "$@" ;;
  *) echo "usage: fuzz.sh build [DIR] | run NAME SECONDS [DIR] | all SECONDS [DIR]" >&2; exit 2 ;;
esac
