#!/usr/bin/env bash
# The chart's monitoring (docs/monitoring.md) with Prometheus's own promtool: the alerts as
# `helm template` renders them into the PrometheusRule pass `promtool check rules` and the unit
# tests of tests/monitoring/alerts_test.yaml (`promtool test rules`); every metric the alerts, the
# Grafana dashboard and the docs' metric table name is one the C++ sources emit; the dashboard's
# queries parse as PromQL.
# promtool comes from $PROMTOOL or scripts/fetch-promtool.sh (Go module proxy, into the build
# tree; `make test` fetches it first), helm from $HELM, PATH or deploy/helm/fetch-helm.sh; without
# them the cases that need them skip, saying why.
# Usage: monitoring.sh CASE
set -uo pipefail
src=${GPUFENCE_SOURCE_DIR:?}
# shellcheck source=scripts/lib/harness.sh
. "$src/scripts/lib/harness.sh"
build=${GPUFENCE_BUILD_DIR:?}
chart=$src/deploy/helm/gpufence
alerts=$chart/files/alerts.yaml
dashboard=$chart/files/dashboard.json
python3 -c 'import yaml' 2>/dev/null || skip "python3-yaml is not installed"
work=$(gf_work_dir gpufence-monitoring)
trap 'rm -rf "$work"' EXIT

need_helm() {
  helm=$("$src/deploy/helm/fetch-helm.sh" "$build/tools/helm") || skip "no helm"
}
need_promtool() {
  promtool=$(GPUFENCE_BUILD_DIR=$build "$src/scripts/fetch-promtool.sh" 2>"$work/promtool.err") ||
    skip "no promtool: $(cat "$work/promtool.err")"
}
# render_rules OUT [--set ...]: the PrometheusRule's spec (its rule groups) as a rule file.
render_rules() {
  local out=$1
  shift
  "$helm" template gf "$chart" --namespace gpufence --set monitoring.prometheusRule.enabled=true \
    --show-only templates/monitoring.yaml "$@" > "$work/rule-object.yaml" || return 1
  python3 - "$work/rule-object.yaml" "$out" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "PrometheusRule"]
assert len(docs) == 1, f"{len(docs)} PrometheusRules rendered"
yaml.safe_dump(docs[0]["spec"], open(sys.argv[2], "w"), sort_keys=False, width=10000)
PY
}

# promql.py: the metric names PromQL text uses, and the names the C++ sources emit.
cat > "$work/promql.py" <<'PY'
import json, pathlib, re, sys
import yaml

KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
            "group_left", "group_right", "inf", "nan", "start", "end"}
SUFFIXES = ("_bucket", "_sum", "_count")
# Made by Prometheus itself for every target, not by gpufence.
PROMETHEUS_OWN = {"up"}

def metric_names(expr):
    """Every metric name an expression selects: identifiers outside strings, label matchers,
    ranges and grouping clauses that are neither keywords nor followed by '(' (functions and
    aggregations)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    e = re.sub(r"#[^\n]*", "", e)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"(?<![\w.:])[A-Za-z_:][\w:]*", e):
        if m.group(0).lower() in KEYWORDS or e[m.end():].lstrip().startswith("("):
            continue
        names.add(m.group(0))
    return names

def template_queries(text):
    """PromQL inside alert annotations' `query "..."` template calls (printf's %q left as "")."""
    return [q.replace('\\"', '"').replace("%q", '""')
            for q in re.findall(r'query \(printf "((?:[^"\\]|\\.)*)"', text)]

def rule_exprs(path):
    out = []
    for g in yaml.safe_load(open(path))["groups"]:
        for r in g["rules"]:
            name = r.get("alert") or r.get("record")
            out.append((name, r["expr"]))
            for k, v in r.get("annotations", {}).items():
                out += [(f"{name} annotation {k}", q) for q in template_queries(v)]
    return out

def dashboard_exprs(path):
    d = json.load(open(path))
    out = []
    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                out.append((f"panel {p['id']} ({p['title']}) {t['refId']}", t["expr"]))
            walk(p.get("panels", []))
    walk(d["panels"])
    for v in d.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query", "") if isinstance(q, dict) else q or ""
        m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", q)
        if v["type"] == "query":
            out.append((f"variable {v['name']}", m.group(1) if m else q))
    return out

def doc_metrics(path):
    """The first column of the table under '## Metrics' in docs/monitoring.md."""
    text = pathlib.Path(path).read_text().split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    return {m.group(1) for m in re.finditer(r"^\| `(\w+)`", text, re.M)}

def emitted(src):
    """Metric names found whole in string literals of the C++ sources."""
    names = set()
    for f in pathlib.Path(src, "src").rglob("*"):
        if f.suffix in (".cpp", ".hpp", ".h", ".cc"):
            for lit in re.findall(r'"((?:[^"\\\n]|\\.)*)"', f.read_text(errors="replace")):
                names.update(re.findall(r"\bgpufence_[a-z0-9_]+", lit))
    return names

def verdict(name, names):
    if name in PROMETHEUS_OWN:
        return "prometheus"
    return "ok" if name in names or any(
        name.endswith(s) and name[: -len(s)] in names for s in SUFFIXES) else "NOT-EMITTED"

if __name__ == "__main__":
    mode, src = sys.argv[1], sys.argv[2]
    names = emitted(src)
    if mode == "names":
        # One line per metric: "ok|prometheus|NOT-EMITTED NAME<TAB>where it is used (the first
        # three)".
        used = {}
        for f in sys.argv[3:]:
            for where, expr in dashboard_exprs(f) if f.endswith(".json") else rule_exprs(f):
                for n in metric_names(expr):
                    used.setdefault(n, []).append(where)
        for n in sorted(used):
            print(verdict(n, names), n + "\t" + "; ".join(used[n][:3]))
    elif mode == "docs":
        for n in sorted(doc_metrics(sys.argv[3])):
            print(verdict(n, names), n)
    elif mode == "exprs":
        # The dashboard's queries as recording rules, Grafana's variables given values.
        rules = []
        for i, (where, expr) in enumerate(dashboard_exprs(sys.argv[3])):
            expr = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m")
            expr = re.sub(r"\$\{?\w+\}?", ".*", expr)
            rules.append({"record": f"gpufence:dashboard_query_{i}", "expr": expr})
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, sys.stdout, width=10000)
PY
promql() { python3 "$work/promql.py" "$@"; }

case ${1:?usage: monitoring.sh CASE} in  # gf:cases
  rules)
    need_helm
    need_promtool
    render_rules "$work/rules.yaml"
    check "the PrometheusRule renders with monitoring.prometheusRule.enabled=true" test -s "$work/rules.yaml"
    check "promtool check rules: the rendered rules are valid Prometheus rules" "$promtool" check rules "$work/rules.yaml"
    check "files/alerts.yaml itself is a valid rule file (the defaults in place)" "$promtool" check rules "$alerts"
    check "rendered with the default thresholds, the rules are files/alerts.yaml's" python3 -c "
import sys, yaml
sys.exit(yaml.safe_load(open('$alerts')) != yaml.safe_load(open('$work/rules.yaml')))"
    render_rules "$work/t.yaml" --set monitoring.prometheusRule.thresholds.gpuUnhealthyFor=30m \
      --set monitoring.prometheusRule.thresholds.nriDownFor=1m --set monitoring.prometheusRule.thresholds.refusalsPer10m=20 \
      --set monitoring.prometheusRule.thresholds.doctorStaleSeconds=1800
    check "each threshold reaches its rule" python3 -c "
import sys, yaml
r = {x['alert']: x for g in yaml.safe_load(open('$work/t.yaml'))['groups'] for x in g['rules']}
ok = (r['GPUFenceGPUUnhealthy']['for'] == '30m' and r['GPUFenceNRIDown']['for'] == '1m'
      and r['GPUFenceAllocateRefusals']['expr'] == 'increase(gpufence_allocate_errors_total[10m]) > 20'
      and r['GPUFenceDoctorStale']['expr'] == 'time() - gpufence_doctor_last_run_timestamp_seconds > 1800')
print('  ', {k: (v.get('for'), v['expr']) for k, v in r.items()}) if not ok else None
sys.exit(0 if ok else 1)"
    check "and the result is still valid" "$promtool" check rules "$work/t.yaml"
    out=$("$helm" template gf "$chart" --set monitoring.prometheusRule.enabled=true \
      --set monitoring.prometheusRule.thresholds.nosuch=1m 2>&1)
    check "a threshold files/alerts.yaml does not mark is refused" grep -q "files/alerts.yaml marks no value '# nosuch'" <<<"$out"
    out=$("$helm" template gf "$chart" --set monitoring.prometheusRule.enabled=true \
      --set 'monitoring.prometheusRule.thresholds.nriDownFor=2m or vector(1)' 2>&1)
    check "a threshold that is no number or duration is refused" grep -q "must be a number or a duration" <<<"$out"
    check "every alert has a severity, a summary and a description naming the node" python3 -c "
import sys, yaml
bad = [r['alert'] for g in yaml.safe_load(open('$work/rules.yaml'))['groups'] for r in g['rules']
       if r['labels'].get('severity') not in ('critical', 'warning', 'info')
       or '\$labels.node' not in r['annotations'].get('summary', '')
       or '\$labels.node' not in r['annotations'].get('description', '')]
print('  ', bad) if bad else None
sys.exit(1 if bad else 0)"
    ;;
  alerts)
    need_helm
    need_promtool
    render_rules "$work/rules.yaml"
    cp "$src/tests/monitoring/alerts_test.yaml" "$work/"
    check "promtool test rules tests/monitoring/alerts_test.yaml (the rendered rules)" "$promtool" test rules "$work/alerts_test.yaml"
    # Every alert is tested firing and quiet (an alert with no test could never fail).
    python3 - "$work/rules.yaml" "$work/alerts_test.yaml" > "$work/coverage" <<'PY'
import sys, yaml
alerts = [r["alert"] for g in yaml.safe_load(open(sys.argv[1]))["groups"] for r in g["rules"] if "alert" in r]
tests = yaml.safe_load(open(sys.argv[2]))["tests"]
fires = {a["alertname"] for t in tests for a in t.get("alert_rule_test", []) if a.get("exp_alerts")}
quiet = {a["alertname"] for t in tests for a in t.get("alert_rule_test", []) if not a.get("exp_alerts")}
for a in alerts:
    print(a, "fires" if a in fires else "NEVER-FIRES", "quiet" if a in quiet else "NEVER-QUIET")
PY
    check "the rules have alerts ($(wc -l < "$work/coverage"))" test "$(wc -l < "$work/coverage")" -ge 9
    while read -r alert fires quiet; do
      check "$alert is tested firing and staying quiet" test "$fires $quiet" = "fires quiet"
    done < "$work/coverage"
    # The test file must be able to fail: a rule that never fires makes its tests fail.
    sed 's/expr: gpufence_container_gpu_access{allocated="false"} > 0/expr: gpufence_container_gpu_access{allocated="nope"} > 0/' \
      "$work/rules.yaml" > "$work/broken.yaml"
    sed 's/rule_files: \[rules.yaml\]/rule_files: [broken.yaml]/' "$work/alerts_test.yaml" > "$work/broken_test.yaml"
    check "a broken alert fails the tests" bash -c "! '$promtool' test rules '$work/broken_test.yaml' >/dev/null 2>&1"
    ;;
  metric-names)
    # Every metric a query names must be one the code emits: a metric renamed in src/ (or in a
    # query) fails here. Emitted = found whole in a string literal of src/**/*.{cpp,hpp}; a
    # histogram's _bucket/_sum/_count count as its name's; `up` is Prometheus's own.
    promql names "$src" "$alerts" "$dashboard" > "$work/names"
    check "the alerts and dashboard name metrics ($(wc -l < "$work/names"))" test "$(wc -l < "$work/names")" -ge 15
    while IFS=$'\t' read -r verdict where; do
      case ${verdict%% *} in
        prometheus) echo "ok   - ${verdict#* } is Prometheus's own (used in: $where)" ;;
        *) check "${verdict#* } is emitted by src/ (used in: $where)" test "${verdict%% *}" = ok ;;
      esac
    done < "$work/names"
    promql docs "$src" "$src/docs/monitoring.md" > "$work/docs"
    check "docs/monitoring.md's metric table has rows ($(wc -l < "$work/docs"))" test "$(wc -l < "$work/docs")" -ge 15
    while read -r verdict name; do
      check "docs/monitoring.md: $name is emitted by src/" test "$verdict" = ok
    done < "$work/docs"
    check "every metric the queries name is in docs/monitoring.md's table" bash -c "
      missing=\$(comm -23 <(cut -f1 '$work/names' | awk '{print \$2}' | sed -E 's/_(bucket|sum|count)\$//' | grep -vx up | sort -u) <(awk '{print \$2}' '$work/docs' | sort -u))
      [ -z \"\$missing\" ] || { echo \"  not in the table: \$missing\"; false; }"
    # The extractor itself: a name it cannot see would pass everything above.
    cat > "$work/planted.yaml" <<'YAML'
groups:
  - name: planted
    rules:
      - alert: Planted
        expr: sum by (node) (rate(gpufence_no_such_metric_total{job="x"}[5m])) > on (node) group_left (pod) gpufence_devices
YAML
    check "a query naming a metric src/ does not emit is caught" bash -c \
      "python3 '$work/promql.py' names '$src' '$work/planted.yaml' | grep -q '^NOT-EMITTED gpufence_no_such_metric_total'"
    check "labels, functions and grouping are not taken for metrics" bash -c \
      "[ \"\$(python3 '$work/promql.py' names '$src' '$work/planted.yaml' | cut -f1 | awk '{print \$2}' | sort | paste -sd' ' -)\" = 'gpufence_devices gpufence_no_such_metric_total' ]"
    # Informative: metrics the code emits that no alert or panel uses.
    unused=$(comm -13 <(cut -f1 "$work/names" | awk '{print $2}' | sed -E 's/_(bucket|sum|count)$//' | sort -u) \
      <(awk '{print $2}' "$work/docs" | sort -u) | paste -sd' ' -)
    echo "info - in the docs' table but in no alert or panel: ${unused:-none}"
    ;;
  dashboard)
    need_helm
    need_promtool
    check "files/dashboard.json is a Grafana dashboard: uid, title, panels with unique ids" python3 -c "
import json, sys
d = json.load(open('$dashboard'))
ids = [p['id'] for p in d['panels']]
sys.exit(0 if d['uid'] and d['title'] and len(ids) == len(set(ids)) and len(ids) >= 10 else 1)"
    check "every panel queries Prometheus through the \${datasource} variable, and has a query" python3 -c "
import json, sys
d = json.load(open('$dashboard'))
bad = [p['title'] for p in d['panels'] if p['type'] != 'row' and (
    p.get('datasource', {}).get('uid') != '\${datasource}' or not p.get('targets')
    or any(not t.get('expr') or t.get('datasource', {}).get('uid') != '\${datasource}' for t in p['targets']))]
print('  ', bad) if bad else None
sys.exit(1 if bad else 0)"
    check "panels do not overlap on Grafana's 24-column grid" python3 -c "
import json, sys
cells = {}
for p in json.load(open('$dashboard'))['panels']:
    g = p['gridPos']
    assert g['x'] + g['w'] <= 24, p['title']
    for x in range(g['x'], g['x'] + g['w']):
        for y in range(g['y'], g['y'] + g['h']):
            if (x, y) in cells: sys.exit(f'  {p[\"title\"]} overlaps {cells[(x, y)]}')
            cells[(x, y)] = p['title']"
    # promtool parses each query (as a recording rule, Grafana's variables given values).
    promql exprs "$src" "$dashboard" > "$work/dashboard-rules.yaml"
    check "every dashboard query is valid PromQL ($(grep -c 'record:' "$work/dashboard-rules.yaml") queries)" \
      "$promtool" check rules "$work/dashboard-rules.yaml"
    "$helm" template gf "$chart" --namespace gpufence --set monitoring.dashboard.enabled=true \
      --show-only templates/monitoring.yaml > "$work/cm.yaml"
    check "the ConfigMap carries files/dashboard.json unchanged, labelled for Grafana's sidecar" python3 -c "
import json, sys, yaml
cm = [d for d in yaml.safe_load_all(open('$work/cm.yaml')) if d and d['kind'] == 'ConfigMap'][0]
sys.exit(0 if json.loads(cm['data']['gpufence.json']) == json.load(open('$dashboard'))
         and cm['metadata']['labels'].get('grafana_dashboard') == '1' else 1)"
    ;;
  *) echo "unknown case $1"; exit 2 ;;
esac
[ "$failures" = 0 ]
