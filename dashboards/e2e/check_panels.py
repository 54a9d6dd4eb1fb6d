#!/usr/bin/env python3
"""Run every query of a Grafana dashboard against a live Prometheus, and check its metric names
against the exporter's scrape.

usage: check_panels.py DASHBOARD.json --prometheus URL --metrics URL
                       [--start UNIX] [--rate-interval 1m] [--rules RULES.yml] [--no-fire ALERT,...]

Checks, each counted as passed or failed:
  * every query variable (label_values(...)) returns at least one value;
  * every panel target, with the variables set to "All" (.*), returns at least one series
    (range targets: query_range over [--start, T] with at least one point; instant targets:
    an instant query at T), where T is the last second Prometheus has live MPIB series: "now"
    while the workload runs, its last sample if it already stopped (Prometheus marks series
    stale when the target drops them);
  * the same again with the variables set to concrete values (the first host, the pid of a
    process with an advanced-mode connection if there is one, rail "sup"), which catches label
    filters a family does not carry;
  * every metric name the dashboard uses is in the exporter's scrape (GET --metrics), and every
    label name that metric's selectors match on is on its series;
  * with --rules: every recording rule returns a series, and the alerts named by --no-fire are
    not firing.

Grafana's macros are substituted: $__rate_interval (--rate-interval), $__interval (the step),
$__range (the checked window). Standard library only. Prints "N passed, M failed"; exit 1 on
any failure.
"""

import argparse
import json
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

AGGREGATORS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
               "bottomk", "topk", "quantile"}
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "by", "without", "on",
            "ignoring", "group_left", "group_right"}
LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}


class Result:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.failures = []

    def ok(self, what, detail=""):
        self.passed += 1
        print(f"  ok    {what}{('  ' + detail) if detail else ''}")

    def fail(self, what, detail):
        self.failed += 1
        self.failures.append(f"{what}: {detail}")
        print(f"  FAIL  {what}: {detail}")


# ------------------------------------------------------------------------------ PromQL scanning

def _skip_string(s, i):
    quote = s[i]
    i += 1
    while i < len(s) and s[i] != quote:
        if s[i] == "\\" and quote != "`":
            i += 1
        i += 1
    return i + 1


def _skip_group(s, i, open_ch, close_ch):
    depth = 0
    while i < len(s):
        c = s[i]
        if c in "\"'`":
            i = _skip_string(s, i)
            continue
        if c == open_ch:
            depth += 1
        elif c == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return i


def _matcher_labels(body):
    """Label names of a `{...}` matcher list (without the braces)."""
    names = set()
    i = 0
    while i < len(body):
        c = body[i]
        if c in "\"'`":
            i = _skip_string(body, i)
            continue
        m = re.match(r"[A-Za-z_][A-Za-z0-9_]*", body[i:])
        if m:
            rest = body[i + m.end():].lstrip()
            if rest[:2] in ("=~", "!=", "!~") or rest[:1] == "=":
                names.add(m.group(0))
            i += m.end()
            continue
        i += 1
    return names


def scan(expr):
    """(metric names, {metric: label names its selectors match on}).

    Identifiers outside strings, matchers, ranges and label lists that are not functions,
    aggregators or keywords are metric names. Grafana variables ($x, ${x}) are skipped.
    """
    s = expr
    metrics = set()
    labels = {}
    i = 0
    while i < len(s):
        c = s[i]
        if c in "\"'`":
            i = _skip_string(s, i)
        elif c == "{":
            i = _skip_group(s, i, "{", "}")
        elif c == "[":
            i = _skip_group(s, i, "[", "]")
        elif c == "#":
            while i < len(s) and s[i] != "\n":
                i += 1
        elif c == "$":
            i += 1
            if i < len(s) and s[i] == "{":
                i = _skip_group(s, i, "{", "}")
            else:
                while i < len(s) and (s[i].isalnum() or s[i] == "_"):
                    i += 1
        elif c.isdigit() or (c == "." and i + 1 < len(s) and s[i + 1].isdigit()):
            while i < len(s) and (s[i].isalnum() or s[i] == "."):
                i += 1
        elif c.isalpha() or c in "_:":
            m = re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", s[i:])
            word = m.group(0)
            i += m.end()
            j = i
            while j < len(s) and s[j].isspace():
                j += 1
            nxt = s[j] if j < len(s) else ""
            if word in LABEL_LISTS:
                if nxt == "(":
                    i = _skip_group(s, j, "(", ")")
            elif nxt == "(" or word in AGGREGATORS or word.lower() in KEYWORDS:
                pass
            else:
                metrics.add(word)
                used = labels.setdefault(word, set())
                if nxt == "{":
                    end = _skip_group(s, j, "{", "}")
                    used.update(_matcher_labels(s[j + 1:end - 1]))
                    i = end
        else:
            i += 1
    return metrics, labels


def variable_promql(query):
    """The PromQL of a Prometheus template-variable query, and the label it lists (or None)."""
    q = query.strip()
    m = re.fullmatch(r"label_values\((.*)\)", q, re.S)
    if m:
        inner = m.group(1)
        depth, in_str, split = 0, False, None
        for k, ch in enumerate(inner):
            if ch == '"':
                in_str = not in_str
            elif not in_str and ch in "({[":
                depth += 1
            elif not in_str and ch in ")}]":
                depth -= 1
            elif not in_str and ch == "," and depth == 0:
                split = k
        if split is None:
            return None, inner.strip()
        return inner[:split].strip(), inner[split + 1:].strip()
    m = re.fullmatch(r"query_result\((.*)\)", q, re.S)
    if m:
        return m.group(1), None
    return q, None


# ------------------------------------------------------------------------------ HTTP

def http_get(url, timeout=20):
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode("utf-8", "replace")


def prom(base, path, params):
    url = f"{base.rstrip('/')}{path}?{urllib.parse.urlencode(params, doseq=True)}"
    try:
        body = http_get(url)
    except urllib.error.HTTPError as e:
        body = e.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as e:
        return None, f"request failed: {e}"
    try:
        doc = json.loads(body)
    except ValueError:
        return None, f"not JSON: {body[:200]!r}"
    if doc.get("status") != "success":
        return None, f"{doc.get('errorType', 'error')}: {doc.get('error', body[:200])}"
    return doc["data"], None


def scrape_families(text):
    """{sample name: set of label names} from Prometheus exposition text."""
    families = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{([^}]*)\})?\s", line)
        if not m:
            continue
        names = families.setdefault(m.group(1), set())
        if m.group(3):
            names.update(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="', m.group(3)))
    return families


# ------------------------------------------------------------------------------ dashboard

def all_panels(panels):
    for p in panels or []:
        yield p
        yield from all_panels(p.get("panels"))


def substitute(expr, values, rate_interval, step, window):
    out = expr
    for macro, value in (("__rate_interval", rate_interval), ("__interval_ms", str(step * 1000)),
                         ("__interval", f"{step}s"), ("__range_s", str(window)),
                         ("__range_ms", str(window * 1000)), ("__range", f"{window}s")):
        out = out.replace("${" + macro + "}", value).replace("$" + macro, value)
    for name in sorted(values, key=len, reverse=True):
        value = values[name]
        if value != ".*":
            # What Grafana does with a multi-value variable's value for Prometheus: regex
            # characters escaped, the backslash doubled inside the PromQL string
            # ("loop0+loop1" -> "loop0\\+loop1").
            value = re.sub(r"([\\^$*+?.()|{}\[\]])", r"\\\\\1", value)
        # A function as replacement: re.sub would read the value's backslashes as escapes.
        out = re.sub(r"\$\{" + re.escape(name) + r"(:[a-z]+)?\}", lambda _m: value, out)
        out = re.sub(r"\$" + re.escape(name) + r"\b", lambda _m: value, out)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dashboard")
    ap.add_argument("--prometheus", required=True, help="Prometheus base URL")
    ap.add_argument("--metrics", required=True, action="append",
                    help="an exporter's /metrics URL (repeat for several: the collector, mpib-agent)")
    ap.add_argument("--start", type=float, help="start of the checked window (unix s; default T-5m)")
    ap.add_argument("--rate-interval", default="1m", help="value of $__rate_interval (default 1m)")
    ap.add_argument("--step", type=int, default=2, help="query_range step in s (default 2)")
    ap.add_argument("--probe-metric", default="mpib_rail_tx_bytes_total",
                    help="a metric that is live while the workload runs (finds T)")
    ap.add_argument("--rules", help="a rules file loaded by this Prometheus: check its recording rules")
    ap.add_argument("--no-fire", default="", help="comma-separated alerts that must not be firing")
    args = ap.parse_args()

    with open(args.dashboard, encoding="utf-8") as f:
        dash = json.load(f)
    res = Result()
    now = time.time()
    start = args.start if args.start else now - 300

    # T: the last second with live series of the workload.
    data, err = prom(args.prometheus, "/api/v1/query_range",
                     {"query": f"count({args.probe_metric})", "start": f"{start:.3f}",
                      "end": f"{now:.3f}", "step": "1"})
    if err or not data["result"]:
        print(f"no live {args.probe_metric} in Prometheus between {start:.0f} and {now:.0f}: {err or 'empty'}")
        print("0 passed, 1 failed")
        return 1
    last = max(float(v[0]) for v in data["result"][0]["values"])
    first = min(float(v[0]) for v in data["result"][0]["values"])
    t_eval = min(now, last)
    window = max(int(t_eval - start), args.step)
    print(f"window: {t_eval - start:.0f} s of data checked (live series from {first - start:+.0f} s "
          f"to {last - start:+.0f} s); instant queries at T={t_eval:.0f} ({now - t_eval:.0f} s ago)")

    # Template variables (query type) first: they give the concrete values.
    variables = [v for v in dash.get("templating", {}).get("list", []) if v.get("type") == "query"]
    all_values = {v["name"]: ".*" for v in variables}
    concrete = {}
    print("template variables:")
    for var in variables:
        raw = var.get("query")
        query = raw.get("query", "") if isinstance(raw, dict) else (raw or "")
        selector, label = variable_promql(query)
        expr = substitute(selector or "", all_values, args.rate_interval, args.step, window)
        if label:
            params = {"start": f"{start:.3f}", "end": f"{t_eval + 1:.3f}"}
            if selector:
                params["match[]"] = expr
            data, err = prom(args.prometheus, f"/api/v1/label/{label}/values", params)
            values = data if not err else []
        else:
            data, err = prom(args.prometheus, "/api/v1/query", {"query": expr, "time": f"{t_eval:.3f}"})
            values = [json.dumps(r["metric"]) for r in data["result"]] if not err else []
        what = f"variable ${var['name']}: {query}"
        if err:
            res.fail(what, err)
        elif not values:
            res.fail(what, "no values")
        else:
            res.ok(what, f"{len(values)} value(s): {', '.join(values[:6])}")
            concrete[var["name"]] = values[0]

    # Concrete values: the first host, a pid with an advanced connection, rail sup.
    if "pid" in concrete:
        data, err = prom(args.prometheus, "/api/v1/query",
                         {"query": 'max by (pid) (mpib_connection_info{mode="advanced"})', "time": f"{t_eval:.3f}"})
        if not err and data["result"]:
            concrete["pid"] = data["result"][0]["metric"].get("pid", concrete["pid"])
    if "rail" in concrete:
        concrete["rail"] = "sup"
    passes = [("all", all_values), ("concrete " + ", ".join(f"{k}={v}" for k, v in concrete.items()), concrete)]

    targets = []
    used_metrics = {}
    for panel in all_panels(dash.get("panels")):
        for t in panel.get("targets") or []:
            expr = t.get("expr")
            if not expr:
                continue
            targets.append((panel.get("title", "?"), t.get("refId", "?"), expr, bool(t.get("instant")) and not t.get("range")))
    for var in variables:
        raw = var.get("query")
        query = raw.get("query", "") if isinstance(raw, dict) else (raw or "")
        selector, _ = variable_promql(query)
        if selector:
            m, l = scan(selector)
            for name in m:
                used_metrics.setdefault(name, set()).update(l.get(name, set()))

    for pass_name, values in passes:
        print(f"panel targets ({pass_name}):")
        for title, ref, expr, instant in targets:
            q = substitute(expr, values, args.rate_interval, args.step, window)
            what = f"{title} [{ref}]"
            if instant:
                data, err = prom(args.prometheus, "/api/v1/query", {"query": q, "time": f"{t_eval:.3f}"})
                series = data["result"] if not err else []
                points = len(series)
            else:
                data, err = prom(args.prometheus, "/api/v1/query_range",
                                 {"query": q, "start": f"{start:.3f}", "end": f"{t_eval:.3f}", "step": str(args.step)})
                series = [s for s in data["result"] if s.get("values")] if not err else []
                points = sum(len(s["values"]) for s in series)
            if err:
                res.fail(what, f"{err}\n        query: {q}")
            elif not series:
                res.fail(what, f"empty result\n        query: {q}")
            else:
                res.ok(what, f"{len(series)} series, {points} point(s)")

    # Metric and label names against the exporter's own scrape.
    for _, _, expr, _ in targets:
        m, l = scan(expr)
        for name in m:
            used_metrics.setdefault(name, set()).update(l.get(name, set()))
    print(f"metric names against the scrapes ({', '.join(args.metrics)}):")
    families = {}
    for url in args.metrics:
        try:
            for name, labels in scrape_families(http_get(url)).items():
                families.setdefault(name, set()).update(labels)
        except (urllib.error.URLError, OSError) as e:
            families = None
            res.fail("scrape", f"GET {url}: {e}")
            break
    if families is not None:
        for name in sorted(used_metrics):
            if name not in families:
                res.fail(f"metric {name}", "in no exporter's scrape")
                continue
            missing = sorted(used_metrics[name] - families[name] - {"__name__"})
            if missing:
                res.fail(f"metric {name}", f"labels {missing} not on its series (has {sorted(families[name])})")
            else:
                res.ok(f"metric {name}", f"labels {sorted(families[name])}")

    # Rules loaded by this Prometheus.
    if args.rules:
        print(f"rules ({args.rules}):")
        data, err = prom(args.prometheus, "/api/v1/rules", {})
        if err:
            res.fail("rules", err)
        else:
            groups = data.get("groups", [])
            loaded = [r for g in groups for r in g.get("rules", [])]
            if not loaded:
                res.fail("rules", "Prometheus has no rules loaded")
            for r in loaded:
                if r.get("health") not in ("ok", "unknown"):
                    res.fail(f"rule {r.get('name')}", f"health {r.get('health')}: {r.get('lastError')}")
            for r in (r for r in loaded if r.get("type") == "recording"):
                data, err = prom(args.prometheus, "/api/v1/query", {"query": r["name"], "time": f"{t_eval:.3f}"})
                if err:
                    res.fail(f"recording rule {r['name']}", err)
                elif not data["result"]:
                    res.fail(f"recording rule {r['name']}", "empty result")
                else:
                    vals = ", ".join(f"{s['metric'].get('rail', '?')}={float(s['value'][1]):.3f}" for s in data["result"][:6])
                    res.ok(f"recording rule {r['name']}", vals)
            for name in filter(None, (a.strip() for a in args.no_fire.split(","))):
                firing = [r for r in loaded if r.get("type") == "alerting" and r.get("name") == name]
                if not firing:
                    res.fail(f"alert {name}", "not loaded")
                    continue
                active = [a for a in firing[0].get("alerts", []) if a.get("state") in ("firing", "pending")]
                if active:
                    res.fail(f"alert {name}", f"{len(active)} active during a clean run: {active[0].get('labels')}")
                else:
                    res.ok(f"alert {name}", f"inactive ({firing[0].get('state')})")

    print(f"{res.passed} passed, {res.failed} failed")
    if res.failures:
        print("failures:")
        for f in res.failures:
            print(f"  - {f.splitlines()[0]}")
    return 1 if res.failed else 0


if __name__ == "__main__":
    sys.exit(main())
