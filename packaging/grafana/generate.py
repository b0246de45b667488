# Generates packaging/grafana/fenced-dashboard.json (Grafana 10, schemaVersion 38):
#   python3 packaging/grafana/generate.py packaging/grafana/fenced-dashboard.json
# Edit the panels here and regenerate; tests/metrics.rs checks that every fenced_* series
# the JSON names is exported.
import json
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'job=~"$job", instance=~"$instance"'
RI = "$__rate_interval"
panels = []
pid = [0]
y = [0]
x = [0]
rowh = [0]

def row(title):
    if x[0] != 0:
        y[0] += rowh[0]; x[0] = 0
    pid[0] += 1
    panels.append({"type": "row", "title": title, "id": pid[0], "collapsed": False,
                   "gridPos": {"h": 1, "w": 24, "x": 0, "y": y[0]}, "panels": []})
    y[0] += 1; rowh[0] = 0

def panel(title, targets, unit="short", kind="timeseries", w=8, h=8, desc="", stack=False, minz=True):
    if x[0] + w > 24:
        y[0] += rowh[0]; x[0] = 0; rowh[0] = 0
    pid[0] += 1
    defaults = {"unit": unit, "color": {"mode": "palette-classic"}}
    if minz:
        defaults["min"] = 0
    if kind == "timeseries":
        defaults["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10 if stack else 0,
                              "showPoints": "never", "spanNulls": False,
                              "stacking": {"mode": "normal" if stack else "none", "group": "A"}}
        options = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                   "tooltip": {"mode": "multi", "sort": "desc"}}
    else:
        defaults["color"] = {"mode": "thresholds"}
        defaults["thresholds"] = {"mode": "absolute", "steps": [{"color": "green", "value": None}]}
        options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                   "colorMode": "value", "graphMode": "area", "justifyMode": "auto",
                   "orientation": "auto", "textMode": "auto"}
    tg = []
    for i, (expr, legend) in enumerate(targets):
        tg.append({"datasource": DS, "expr": expr, "legendFormat": legend,
                   "refId": chr(ord("A") + i), "range": True, "editorMode": "code"})
    panels.append({"type": kind, "title": title, "id": pid[0], "description": desc,
                   "datasource": DS, "gridPos": {"h": h, "w": w, "x": x[0], "y": y[0]},
                   "fieldConfig": {"defaults": defaults, "overrides": []},
                   "options": options, "targets": tg})
    x[0] += w; rowh[0] = max(rowh[0], h)

def q(p, metric, by, extra=""):
    sel = SEL + (", " + extra if extra else "")
    return f'histogram_quantile({p}, sum by ({by}le) (rate({metric}_bucket{{{sel}}}[{RI}])))'

row("Raft")
panel("Leaders in the cluster", [(f'sum(fenced_is_leader{{{SEL}}})', "leaders")], kind="stat", w=4, h=5,
      desc="Should be exactly 1; alert when it is not for more than a few seconds.")
panel("Term", [(f'max(fenced_raft_term{{{SEL}}})', "term")], kind="stat", w=4, h=5)
panel("Leader changes (1 h)", [(f'max(increase(fenced_leader_changes_total{{{SEL}}}[1h]))', "changes")],
      kind="stat", w=4, h=5, desc="Leader changes seen by a node in the last hour (including to 'no leader').")
panel("Leader", [(f'fenced_is_leader{{{SEL}}}', "{{instance}}")], w=8, h=5, desc="1 on the node that leads.")
panel("Divergence alarms", [(f'sum(fenced_alarm_corrupt{{{SEL}}})', "alarmed members"),
                            (f'max(fenced_apply_semantics{{{SEL}}})', "apply rules")], kind="stat", w=4, h=5,
      desc="Members fenced out because their state differs from the majority's (should be 0; docs/operations.md, 'Divergence alarm'), and the apply rules the leader stamps (2 once every member runs them).")
panel("Commit and apply index", [
    (f'fenced_raft_committed_index{{{SEL}}}', "committed {{instance}}"),
    (f'fenced_raft_applied_index{{{SEL}}}', "applied {{instance}}"),
    (f'fenced_raft_last_log_index{{{SEL}}}', "last log {{instance}}"),
], w=12, minz=False)
panel("Lag (entries)", [
    (f'fenced_raft_committed_index{{{SEL}}} - fenced_raft_applied_index{{{SEL}}}', "commit - applied {{instance}}"),
    (f'scalar(max(fenced_raft_committed_index{{{SEL}}})) - fenced_raft_committed_index{{{SEL}}}', "behind the most advanced {{instance}}"),
    (f'fenced_raft_last_log_index{{{SEL}}} - fenced_raft_applied_index{{{SEL}}}', "last log - applied {{instance}}"),
], w=12, desc="Growing lag: a node that cannot keep up (disk, CPU) or is cut off.")
panel("Proposals", [
    (f'sum(rate(fenced_proposals_committed_total{{{SEL}}}[{RI}]))', "committed/s"),
    (f'sum(rate(fenced_proposals_failed_total{{{SEL}}}[{RI}]))', "failed/s"),
], unit="ops", w=8, desc="Commands proposed by the leader (forwarded ones included).")
panel("Batch size (commands per entry)", [
    (q(0.5, "fenced_proposal_batch_size", ""), "p50"),
    (q(0.99, "fenced_proposal_batch_size", ""), "p99"),
    (f'sum(rate(fenced_proposal_batch_size_sum{{{SEL}}}[{RI}])) / sum(rate(fenced_proposal_batch_size_count{{{SEL}}}[{RI}]))', "mean"),
], w=8)
panel("Commit latency", [
    (q(0.5, "fenced_commit_duration_seconds", ""), "p50"),
    (q(0.99, "fenced_commit_duration_seconds", ""), "p99"),
], unit="s", w=8, desc="From handing an entry to Raft to its commit and apply on the leader (quorum fsync included).")

row("Disk")
panel("WAL fsync p99", [(q(0.99, "fenced_wal_fsync_duration_seconds", "instance, "), "{{instance}}")], unit="s", w=8,
      desc="Each fdatasync of the write-ahead log. etcd's rule of thumb: p99 above 10 ms means the disk is too slow.")
panel("WAL append p99 (call to durable)", [(q(0.99, "fenced_wal_append_duration_seconds", "instance, "), "{{instance}}")], unit="s", w=8)
panel("WAL fsyncs/s", [(f'rate(fenced_wal_fsync_duration_seconds_count{{{SEL}}}[{RI}])', "{{instance}}")], unit="ops", w=8)
panel("Snapshot size", [(f'fenced_snapshot_bytes{{{SEL}}}', "{{instance}}")], unit="bytes", w=8)
panel("Snapshot build duration", [
    (f'rate(fenced_snapshot_duration_seconds_sum{{{SEL}}}[5m]) / rate(fenced_snapshot_duration_seconds_count{{{SEL}}}[5m])', "mean {{instance}}"),
    (q(0.99, "fenced_snapshot_duration_seconds", "instance, "), "p99 {{instance}}"),
], unit="s", w=8)
panel("Snapshots built (1 h)", [(f'increase(fenced_snapshot_total{{{SEL}}}[1h])', "{{instance}}")], w=8)

row("Network")
panel("Peer round trip p99 (heartbeats, from the leader)", [
    (q(0.99, "fenced_peer_round_trip_seconds", "instance, peer, "), "{{instance}} → {{peer}}"),
], unit="s", w=12, desc="Empty AppendEntries answered by each peer. Compare with the heartbeat interval and election timeout.")
panel("Peer round trip p50", [
    (q(0.5, "fenced_peer_round_trip_seconds", "instance, peer, "), "{{instance}} → {{peer}}"),
], unit="s", w=12)

row("Requests")
panel("gRPC requests by method", [
    (f'sum by (method) (rate(fenced_grpc_requests_total{{{SEL}}}[{RI}]))', "{{method}}"),
], unit="reqps", w=8)
panel("gRPC errors by method and code", [
    (f'sum by (method, code) (rate(fenced_grpc_requests_total{{{SEL}, code!="OK"}}[{RI}]))', "{{method}} {{code}}"),
], unit="reqps", w=8)
panel("gRPC p99 by method", [
    (q(0.99, "fenced_grpc_request_duration_seconds", "method, ", 'method!~"Session.Watch|Cluster.SnapshotSave"'), "{{method}}"),
], unit="s", w=8, desc="Streams (Session.Watch, Cluster.SnapshotSave) are left out: their duration is the stream's lifetime.")
panel("RESP commands by command", [
    (f'sum by (command) (rate(fenced_resp_commands_total{{{SEL}}}[{RI}]))', "{{command}}"),
], unit="reqps", w=8)
panel("RESP errors by command", [
    (f'sum by (command) (rate(fenced_resp_commands_total{{{SEL}, result="err"}}[{RI}]))', "{{command}}"),
], unit="reqps", w=8)
panel("RESP p99 by command", [
    (q(0.99, "fenced_resp_command_duration_seconds", "command, ", 'command!~"BLPOP|BRPOP|SUBSCRIBE|PSUBSCRIBE"'), "{{command}}"),
], unit="s", w=8, desc="Blocking pops and subscriptions are left out: they wait by design.")

row("Locks")
panel("Locks held, waiters, sessions", [
    (f'max(fenced_locks_held{{{SEL}}})', "locks held"),
    (f'max(fenced_lock_waiters{{{SEL}}})', "waiters"),
    (f'max(fenced_sessions{{{SEL}}})', "sessions"),
], w=8, desc="The replicated state: every node has the same values once caught up.")
panel("Grants and releases", [
    (f'sum(rate(fenced_lock_grants_total{{{SEL}}}[{RI}]))', "granted at once"),
    (f'max(rate(fenced_lock_waiter_grants_total{{{SEL}}}[{RI}]))', "granted after waiting"),
    (f'max(rate(fenced_lock_waiter_timeouts_total{{{SEL}}}[{RI}]))', "waits that ran out"),
    (f'max by (reason) (rate(fenced_lock_releases_total{{{SEL}}}[{RI}]))', "released: {{reason}}"),
], unit="ops", w=8, desc="Grants at once are counted by the leader; the rest by every node as it applies (max over nodes).")
panel("Lock losses and stale writes rejected", [
    (f'max by (reason) (increase(fenced_lock_releases_total{{{SEL}, reason!="released"}}[5m]))', "lost: {{reason}}"),
    (f'sum by (via) (increase(fenced_stale_writes_rejected_total{{{SEL}}}[5m]))', "stale writes rejected: {{via}}"),
], w=8, desc="Holders losing locks (expired, session ended, force-unlocked) and the writes their tokens stopped.")
panel("Revision (tokens issued)", [(f'max(fenced_store_revision{{{SEL}}})', "revision")], w=12, minz=False)
panel("Revisions/s", [(f'max(rate(fenced_store_revision{{{SEL}}}[{RI}]))', "revisions/s")], unit="ops", w=12)

dash = {
    "__requires": [
        {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.0.0"},
        {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
        {"type": "panel", "id": "timeseries", "name": "Time series", "version": ""},
        {"type": "panel", "id": "stat", "name": "Stat", "version": ""},
    ],
    "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                              "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                              "name": "Annotations & Alerts", "type": "dashboard"}]},
    "description": "fenced: Raft, disk, network, requests (gRPC and RESP) and the lock service. Series: README 'Metrics and health'.",
    "editable": True,
    "fiscalYearStartMonth": 0,
    "graphTooltip": 1,
    "id": None,
    "links": [],
    "panels": panels,
    "refresh": "10s",
    "schemaVersion": 38,
    "tags": ["fenced", "raft", "locks"],
    "templating": {"list": [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "refresh": 1, "regex": "", "includeAll": False, "multi": False,
         "options": [], "skipUrlSync": False},
        {"name": "job", "label": "Job", "type": "query", "datasource": DS,
         "definition": "label_values(fenced_raft_term, job)",
         "query": {"query": "label_values(fenced_raft_term, job)", "refId": "job"},
         "current": {}, "hide": 0, "includeAll": True, "multi": True, "allValue": ".*",
         "options": [], "refresh": 2, "regex": "", "sort": 1, "skipUrlSync": False},
        {"name": "instance", "label": "Instance", "type": "query", "datasource": DS,
         "definition": 'label_values(fenced_raft_term{job=~"$job"}, instance)',
         "query": {"query": 'label_values(fenced_raft_term{job=~"$job"}, instance)', "refId": "instance"},
         "current": {}, "hide": 0, "includeAll": True, "multi": True, "allValue": ".*",
         "options": [], "refresh": 2, "regex": "", "sort": 1, "skipUrlSync": False},
    ]},
    "time": {"from": "now-1h", "to": "now"},
    "timepicker": {},
    "timezone": "",
    "title": "fenced",
    "uid": "fenced-overview",
    "version": 1,
    "weekStart": "",
}
import sys
json.dump(dash, open(sys.argv[1], "w"), indent=2, ensure_ascii=False)
open(sys.argv[1], "a").write("\n")
