# The scenario harness every test script sources (and scripts/lib/cri_node.sh, for the demo and
# the benchmarks): `skip REASON` (exit 77: CTest shows it skipped, with the reason printed),
# `check DESCRIPTION COMMAND...` (one line per promise, failures counted), `gf_work_dir PREFIX` (a
# fresh private directory under $TMPDIR, default /tmp), the containerd lines (lines.sh). Sourcing
# it again keeps the count.
# shellcheck shell=bash
skip() { echo "SKIP: $*"; exit 77; }
failures=${failures:-0}
check() { if "${@:2}"; then echo "ok   - $1"; else echo "FAIL - $1"; failures=$((failures + 1)); fi; }
gf_work_dir() { mktemp -d "${TMPDIR:-/tmp}/$1-XXXXXX"; }
# The containerd lines' table and its readers (gf_line_field, gf_line_has, gf_line_bin, ...).
# shellcheck source=scripts/lib/lines.sh
. "$(dirname "${BASH_SOURCE[0]}")/lines.sh"

# `SCRIPT --list` prints the cases a scenario script dispatches on, one a line: the labels of its
# dispatcher, the `case` line marked `# gf:cases` (labels at two spaces' indent, `a|b)` giving
# two, up to the `esac` at the line's start). tests/CMakeLists.txt adds one CTest test per case
# from this list, so the labels are the one list: a new label is a test with no other edit, and
# CMake cannot name a case the script lacks.
gf_list_cases() {
  awk '/# gf:cases$/ {on = 1; n++; next}
       on && /^esac/ {exit}
       on && /^  [a-z0-9][a-z0-9.|-]*\)/ {sub(/^  /, ""); sub(/\).*/, ""); gsub(/\|/, "\n"); print}
       END {if (n != 1) exit 1}' "$1"
}
if [ "${1:-}" = --list ]; then
  gf_list_cases "$0" || { echo "$0: no one dispatcher marked '# gf:cases'" >&2; exit 2; }
  exit 0
fi
