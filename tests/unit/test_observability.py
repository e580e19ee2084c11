"""deploy/observability: the alerting rules pass `promtool check rules` and their own unit
tests (`promtool test rules`), the example Prometheus configuration passes `promtool check
config`, and the Grafana dashboard is well formed and queries only what the processes
export. (That each name is really exported by a running process is checked on a real
scrape in tests/embedded/test_metrics_embedded.py, with `referenced_metrics`.)"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.metrics import promtool

OBSERVABILITY = Path(__file__).resolve().parents[2] / "deploy" / "observability"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
_METRIC = re.compile(r"\bscheduler_(?:dispatcher|worker)_[a-z0-9_]+")


def run_promtool(*args: str) -> str:
    done = subprocess.run([promtool(), *args], cwd=OBSERVABILITY, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def alert_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load((OBSERVABILITY / "alerts.yml").read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((OBSERVABILITY / "grafana-dashboard.json").read_text())
    return loaded


def dashboard_queries() -> list[str]:
    return [target["expr"] for panel in dashboard()["panels"] for target in panel.get("targets", [])]


def referenced_metrics() -> set[str]:
    """Every sample name the rules and the dashboard query."""
    texts = [rule["expr"] for rule in alert_rules()] + dashboard_queries()
    return {name for text in texts for name in _METRIC.findall(text)}


def test_the_rules_pass_promtool_and_their_unit_tests() -> None:
    assert "SUCCESS: 7 rules found" in run_promtool("check", "rules", "alerts.yml")
    assert "SUCCESS" in run_promtool("test", "rules", "alerts_test.yml")
    run_promtool("check", "config", "prometheus.yml")


def test_every_alert_the_promise_needs_is_there_with_a_unit_test() -> None:
    names = {rule["alert"] for rule in alert_rules()}
    assert names == {"SchedulerFiringLate", "SchedulerShardUnowned", "SchedulerNoDispatcher", "SchedulerCursorLagging",
                     "SchedulerDeadLetters", "SchedulerUnreadableRows", "SchedulerConsumerLag"}
    tests = yaml.safe_load((OBSERVABILITY / "alerts_test.yml").read_text())["tests"]
    tested = {case["alertname"] for test in tests for case in test["alert_rule_test"] if case["exp_alerts"]}
    assert tested == names, "every alert has a case in which it fires"
    by_name = {rule["alert"]: rule for rule in alert_rules()}
    assert by_name["SchedulerFiringLate"]["for"] == "1m" and "> 2" in by_name["SchedulerFiringLate"]["expr"]
    assert by_name["SchedulerShardUnowned"]["for"] == "15s"  # the default lease timeout (10 s) + 5 s
    for rule in alert_rules():
        assert rule["labels"]["severity"] in {"page", "warning"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_the_dashboard_is_well_formed_and_every_panel_queries_prometheus() -> None:
    board = dashboard()
    assert board["uid"] and board["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    graphs = [panel for panel in board["panels"] if panel["type"] != "row"]
    assert len(graphs) >= 15
    for panel in graphs:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]
        for target in panel["targets"]:
            assert _METRIC.search(target["expr"]), (panel["title"], target["expr"])
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]


def test_every_metric_the_rules_and_dashboard_query_is_documented() -> None:
    def family(name: str) -> str:
        return re.sub(r"_(total|bucket|count|sum)$", "", name)

    documented = {family(name) for name in _METRIC.findall(DOCS.read_text())}
    queried = {family(name) for name in referenced_metrics()}
    assert queried <= documented, queried - documented
