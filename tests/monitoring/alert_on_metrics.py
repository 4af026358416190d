"""A promtool unit test that runs one of the chart's alerts on metrics a gpufence binary printed.

Each sample of METRICS (Prometheus' text format, e.g. `gpufence doctor --metrics` on a real node)
becomes an input series holding its value for ten minutes; the test evaluates the alert's own
expression (read from RULES, the chart's files/alerts.yaml) and expects it to select something
(`fires`) or nothing (`quiet`). Printed as YAML on stdout for `promtool test rules`.
Usage: alert_on_metrics.py RULES ALERT METRICS fires|quiet
"""
import json
import re
import sys

import yaml

rules_path, alert, metrics_path, expect = sys.argv[1:5]
rules = yaml.safe_load(open(rules_path))
exprs = [r["expr"] for g in rules["groups"] for r in g["rules"] if r.get("alert") == alert]
if len(exprs) != 1:
    sys.exit(f"{rules_path}: {len(exprs)} alerts named {alert}")
expr = re.sub(r"\s+#.*$", "", str(exprs[0]), flags=re.M).strip()

series = []
for line in open(metrics_path):
    line = line.rstrip("\n")
    if not line or line.startswith("#"):
        continue
    name, value = line.rsplit(" ", 1)
    series.append({"series": name, "values": f"{value}x10"})
if not series:
    sys.exit(f"{metrics_path}: no samples")

test = {
    "rule_files": [rules_path],
    "evaluation_interval": "1m",
    "tests": [{
        "interval": "1m",
        "input_series": series,
        "promql_expr_test": [{
            "expr": f"(count({expr}) or vector(0)) > bool 0",
            "eval_time": "5m",
            "exp_samples": [{"labels": "{}", "value": 1 if expect == "fires" else 0}],
        }],
    }],
}
print(json.dumps(test, indent=1))
