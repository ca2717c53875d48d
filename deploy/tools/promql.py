"""Small PromQL helpers for deploy/check.sh: pull the metric names and the
label names of each selector out of an expression, and turn Grafana /
prometheus-adapter templates into plain PromQL.

Syntax itself is checked by promtool (check_metrics.py feeds every expression
to `promtool check rules`); this lexer only has to find names, so it skips
strings, durations, numbers, keywords, functions and aggregation operators.
"""
import re

_TOKEN = re.compile(r"""
    (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<num>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?(?:ms|[smhdwy])*)
  | (?P<id>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<op>=~|!~|!=|==|<=|>=|[-+*/%^=<>(){},@])
  | (?P<ws>\s+)
""", re.X)

AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count",
                "count_values", "bottomk", "topk", "quantile", "limitk", "limit_ratio"}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "start", "end"} | GROUPING
MATCH_OPS = {"=", "!=", "=~", "!~"}


class PromQLError(ValueError):
    pass


def tokens(expr):
    pos, out = 0, []
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m:
            raise PromQLError(f"cannot lex {expr[pos:pos + 20]!r} in {expr!r}")
        pos = m.end()
        if m.lastgroup != "ws":
            out.append((m.lastgroup, m.group()))
    return out


def selectors(expr):
    """[(metric name, {label names used in its matchers})] in order of appearance."""
    toks = tokens(expr)
    out = []
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        nxt = toks[i + 1][1] if i + 1 < len(toks) else None
        if kind == "id" and text in GROUPING and nxt == "(":
            i = _skip_parens(toks, i + 1)
            continue
        if kind == "id" and (text in AGGREGATIONS or text.lower() in KEYWORDS or nxt == "("):
            i += 1
            continue
        if kind == "id" or text == "{":
            name = text if kind == "id" else None
            if kind == "id":
                i += 1
            labels = set()
            if i < len(toks) and toks[i][1] == "{":
                i, labels, name_from_matcher = _matchers(toks, i)
                name = name or name_from_matcher
            if name is None:
                raise PromQLError(f"selector without a metric name in {expr!r}")
            out.append((name, labels))
            continue
        i += 1
    return out


def _skip_parens(toks, i):
    depth = 0
    while i < len(toks):
        if toks[i][1] == "(":
            depth += 1
        elif toks[i][1] == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise PromQLError("unbalanced parentheses")


def _matchers(toks, i):
    labels, name = set(), None
    i += 1  # '{'
    while i < len(toks) and toks[i][1] != "}":
        kind, text = toks[i]
        if kind == "id" and i + 1 < len(toks) and toks[i + 1][1] in MATCH_OPS:
            if text == "__name__" and toks[i + 1][1] == "=" and i + 2 < len(toks):
                name = toks[i + 2][1][1:-1]
            else:
                labels.add(text)
        i += 1
    if i >= len(toks):
        raise PromQLError("unbalanced braces")
    return i + 1, labels, name


# ---- templates -------------------------------------------------------------

_GRAFANA_BUILTINS = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h",
                     "__interval_ms": "60000", "__range_s": "3600"}


def from_grafana(expr):
    """Grafana query -> PromQL: built-in intervals, dashboard variables, and
    label_values(selector, label) -> selector."""
    def var(m):
        name = m.group(1) or m.group(2) or m.group(3)
        name = name.split(":")[0]
        return _GRAFANA_BUILTINS.get(name, "var")
    expr = re.sub(r"\$\{([^}]+)\}|\[\[([^\]]+)\]\]|\$(\w+)", var, expr)
    m = re.fullmatch(r"\s*label_values\((.*),\s*[a-zA-Z_]\w*\s*\)\s*", expr, re.S)
    if m:
        return m.group(1)
    m = re.fullmatch(r"\s*label_values\(\s*[a-zA-Z_]\w*\s*\)\s*", expr)
    if m:
        return None
    return expr


def from_adapter(query, series_name):
    """prometheus-adapter metricsQuery -> PromQL for one series name."""
    return (query.replace("<<.Series>>", series_name)
            .replace("<<.LabelMatchers>>", 'namespace="ns",pod="pod"')
            .replace("<<.GroupBy>>", "namespace, pod"))
