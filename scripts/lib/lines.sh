# shellcheck shell=bash
# The containerd lines the tests run, from their one table (scripts/lib/containerd-lines.tsv):
#   gf_line_field LINE FIELD  one field of LINE's row (source, pin, config, features, tests);
#                             exit 1 when the table has no such line
#   gf_line_has LINE FEATURE  true when LINE's row lists FEATURE
#   gf_lines                  every line, in the table's order
#   gf_lines_running TOKEN    the lines whose tests name TOKEN (a group or GROUP.CASE)
#   gf_line_bin LINE          the directory holding LINE's containerd, ctr and shim: the system's
#                             for a system line, else fetched by scripts/fetch-containerd.sh (its
#                             failure printed on stdout, exit 1: callers skip with it)
gf_lines_table=${gf_lines_table:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/containerd-lines.tsv}

gf_line_field() {
  awk -v l="$1" -v f="$2" '
    BEGIN {split("line source pin config features tests", names, " "); for (i in names) col[names[i]] = i}
    /^#/ || NF == 0 {next}
    $1 == l {if (f == "tests") {s = ""; for (i = 6; i <= NF; i++) s = s (i > 6 ? " " : "") $i; print s} else print $col[f]; found = 1; exit}
    END {exit !found}' "$gf_lines_table"
}
gf_line_has() {
  local features
  features=$(gf_line_field "$1" features) || return 1
  [[ ",$features," == *",$2,"* ]]
}
gf_lines() { awk '!/^#/ && NF {print $1}' "$gf_lines_table"; }
gf_lines_running() {
  awk -v t="$1" '!/^#/ && NF {for (i = 6; i <= NF; i++) if ($i == t) {print $1; break}}' "$gf_lines_table"
}
gf_line_bin() {
  local line=$1 source bin
  source=$(gf_line_field "$line" source) || { echo "no containerd line '$line' in $gf_lines_table"; return 1; }
  if [ "$source" = system ]; then
    bin=$(dirname "$(command -v containerd 2>/dev/null || echo /usr/bin/containerd)")
    [ -x "$bin/containerd" ] || { echo "containerd $line: not installed (apt-get install containerd)"; return 1; }
    "$bin/containerd" --version | grep -q " $(gf_line_field "$line" pin | sed 's/\./\\./g')\." ||
      { echo "containerd $line: the system's is $("$bin/containerd" --version)"; return 1; }
    echo "$bin"
    return 0
  fi
  local build_dir=${GPUFENCE_BUILD_DIR:-${build:-$(cd "$(dirname "$gf_lines_table")/../.." && pwd)/build}}
  if ! GPUFENCE_BUILD_DIR=$build_dir bash "$(dirname "$gf_lines_table")/../fetch-containerd.sh" "$line" >/dev/null 2>&1; then
    echo "containerd $line: $(cat "$build_dir/containerd/$line/FETCH-FAILED" 2>/dev/null || echo 'fetch failed')"
    return 1
  fi
  echo "$build_dir/containerd/$line/root/usr/bin"
}
