//! `results.json` (every checker's verdict) and `report.html` (an SVG timeline: one row per
//! client, op bars coloured by outcome, nemesis windows shaded, latency over time below).

use std::fmt::Write as _;
use std::path::Path;

use serde_json::{json, Value};

use crate::checker::{
    self, agreement, availability, counter, fencing, holders, limiter, linear, mutex, watch, Op,
    Verdict,
};
use crate::history::{Event, Kind};

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

/// Run the checkers that fit `workload` over the history.
pub fn check(events: &[Event], system: &str, workload: &str) -> (Vec<Op>, Vec<Verdict>) {
    let ops = checker::pair(events);
    let windows = availability::nemesis_windows(events);
    let tokens = crate::system::issues_tokens(system);
    let mut v = Vec::new();
    match workload {
        "kv" => {
            v.push(linear::check(&ops, linear::DEFAULT_BUDGET));
            v.push(availability::check(&ops, &windows, &[]));
        }
        "watch" => {
            v.push(watch::check(events, &ops));
            v.push(availability::check(&ops, &windows, &["put"]));
        }
        "register" => {
            v.push(linear::check(&ops, linear::DEFAULT_BUDGET));
            v.push(availability::check(&ops, &windows, &[]));
        }
        "limiter" => {
            v.push(limiter::check(&ops));
            v.push(availability::check(&ops, &windows, &["throttle"]));
        }
        // Readers overlap, permits overlap up to the semaphore's size: holders per mode
        // instead of mutual exclusion.
        "rwlock" | "semaphore" => {
            v.push(holders::check(&ops));
            v.push(fencing::check(&ops, tokens));
            v.push(availability::check(&ops, &windows, &["acquire"]));
        }
        _ => {
            v.push(mutex::check(&ops));
            v.push(fencing::check(&ops, tokens));
            if workload.starts_with("counter") {
                v.push(fencing::stale_writes(&ops));
                v.push(counter::check(&ops));
            }
            v.push(availability::check(&ops, &windows, &["acquire"]));
        }
    }
    (ops, v)
}

/// The `results.json` object for a checked history.
pub fn results(ops: &[Op], verdicts: &[Verdict], meta: Value) -> Value {
    let count = |k: Kind| ops.iter().filter(|o| o.kind == k).count();
    let anomalies: serde_json::Map<String, Value> = verdicts
        .iter()
        .filter(|v| v.checker != "availability")
        .map(|v| (v.checker.clone(), json!(v.anomalies)))
        .collect();
    let valid = verdicts.iter().all(|v| v.valid != Some(false));
    json!({
        "valid": valid,
        "anomalies": anomalies,
        "ops": { "ok": count(Kind::Ok), "fail": count(Kind::Fail), "info": count(Kind::Info) },
        "checkers": verdicts,
        "meta": meta,
    })
}

/// Check, then write `results.json` and `report.html` into `out`. Returns the results.
pub fn write(
    out: &Path,
    events: &[Event],
    system: &str,
    workload: &str,
    meta: Value,
) -> Result<Value, ReportError> {
    let (ops, mut verdicts) = check(events, system, workload);
    // Not from the history: computed from the data dirs when the run ended (fenced only).
    if let Some(v) = agreement::from_meta(&meta["replica_agreement"]) {
        verdicts.push(v);
    }
    let res = results(&ops, &verdicts, meta);
    let p = out.join("results.json");
    std::fs::write(&p, serde_json::to_vec_pretty(&res)?)
        .map_err(|e| ReportError::Io(p.display().to_string(), e))?;
    let html = html(events, &ops, &res);
    let p = out.join("report.html");
    std::fs::write(&p, html).map_err(|e| ReportError::Io(p.display().to_string(), e))?;
    Ok(res)
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn fault_color(kind: &str) -> &'static str {
    match kind {
        "partition" => "#f4a261",
        "kill" => "#e76f51",
        "pause" => "#8ecae6",
        "clock" => "#cdb4db",
        "restart-empty" => "#ef476f",
        "membership" => "#90be6d",
        _ => "#ffd166",
    }
}

/// The report page. Self-contained (inline SVG and CSS, no scripts).
pub fn html(events: &[Event], ops: &[Op], res: &Value) -> String {
    let windows = availability::nemesis_windows(events);
    let end = events.iter().map(|e| e.time).max().unwrap_or(1).max(1);
    let meta = &res["meta"];
    let stride = meta["clients"].as_u64().unwrap_or(1).max(1);
    let lanes = stride as usize;
    let (w, left, lane_h) = (1400.0f64, 60.0f64, 22.0f64);
    let plot_w = w - left - 20.0;
    let x = |t: u64| left + (t.min(end) as f64 / end as f64) * plot_w;
    let tl_h = 30.0 + lanes as f64 * lane_h;
    let lat_top = tl_h + 40.0;
    let lat_h = 200.0;
    let h = lat_top + lat_h + 40.0;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
    );
    // Nemesis windows across both plots.
    for win in &windows {
        let (a, b) = (x(win.start), x(win.end));
        let _ = write!(
            svg,
            r##"<rect x="{a:.1}" y="20" width="{:.1}" height="{:.1}" fill="{}" opacity="0.35"><title>{} {}</title></rect><text x="{:.1}" y="14" fill="#555">{}</text>"##,
            (b - a).max(1.0),
            h - 40.0,
            fault_color(&win.fault),
            esc(&win.fault),
            esc(&win.detail),
            a + 2.0,
            esc(&win.detail.chars().take(32).collect::<String>())
        );
    }
    // The steps of membership changes and other nemesis notes (member-add, retired, …):
    // a dashed line each, the note on hover.
    for e in events.iter().filter(|e| {
        e.process.is_nemesis() && !e.f.starts_with("start-") && !e.f.starts_with("stop-")
    }) {
        let xx = x(e.time);
        let note = match &e.value {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
            None => String::new(),
        };
        let _ = write!(
            svg,
            r##"<line x1="{xx:.1}" y1="20" x2="{xx:.1}" y2="{:.1}" stroke="#2d6a4f" stroke-width="1.5" stroke-dasharray="3,3"><title>{} {}</title></line>"##,
            tl_h,
            esc(&e.f),
            esc(&note)
        );
    }
    // Time axis.
    let secs = end / 1_000_000_000;
    let step = (secs / 12).max(1);
    for s in (0..=secs).step_by(step as usize) {
        let xx = x(s * 1_000_000_000);
        let _ = write!(
            svg,
            r##"<line x1="{xx:.1}" y1="20" x2="{xx:.1}" y2="{:.1}" stroke="#ddd"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{s}s</text>"##,
            h - 30.0,
            h - 16.0
        );
    }
    for lane in 0..lanes {
        let y = 30.0 + lane as f64 * lane_h;
        let _ = write!(
            svg,
            r##"<text x="4" y="{:.1}">client {lane}</text>"##,
            y + 14.0
        );
    }
    // Op bars.
    let mut max_lat = 1u64;
    for op in ops {
        if let Some(c) = op.complete {
            max_lat = max_lat.max(c.saturating_sub(op.invoke));
        }
    }
    for op in ops {
        let lane = (op.process % stride) as usize;
        let y = 30.0 + lane as f64 * lane_h + 3.0;
        let done = op.complete.unwrap_or(end);
        let (a, b) = (x(op.invoke), x(done));
        let color = match op.kind {
            Kind::Ok => "#2a9d8f",
            Kind::Fail => "#e9c46a",
            _ => "#9e9e9e",
        };
        let title = format!(
            "p{} {} {} {:?} token={:?} in={} out={} [{:.1} ms → {:.1} ms]{}",
            op.process,
            op.f,
            op.key.clone().unwrap_or_default(),
            op.kind,
            op.token,
            op.value_in.clone().unwrap_or_default(),
            op.value_out.clone().unwrap_or_default(),
            op.invoke as f64 / 1e6,
            done as f64 / 1e6,
            op.error
                .as_ref()
                .map(|e| format!(" error: {e}"))
                .unwrap_or_default()
        );
        let _ = write!(
            svg,
            r##"<rect x="{a:.2}" y="{y:.1}" width="{:.2}" height="{:.1}" fill="{color}" stroke="{}" stroke-width="0.3"><title>{}</title></rect>"##,
            (b - a).max(0.8),
            lane_h - 6.0,
            if op.f == "acquire" { "#264653" } else { "none" },
            esc(&title)
        );
    }
    // Latency scatter (log scale, 0.1 ms .. max).
    let _ = write!(
        svg,
        r##"<text x="4" y="{:.1}">latency</text><rect x="{left}" y="{lat_top}" width="{plot_w}" height="{lat_h}" fill="none" stroke="#ccc"/>"##,
        lat_top - 6.0
    );
    let lo = 1e5f64.ln();
    let hi = (max_lat.max(200_000) as f64).ln();
    let yl = |ns: u64| lat_top + lat_h - ((ns.max(100_000) as f64).ln() - lo) / (hi - lo) * lat_h;
    for ms_mark in [1u64, 10, 100, 1000, 10_000] {
        let ns = ms_mark * 1_000_000;
        if ns > max_lat.max(200_000) {
            break;
        }
        let yy = yl(ns);
        let _ = write!(
            svg,
            r##"<line x1="{left}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" text-anchor="end">{ms_mark} ms</text>"##,
            left + plot_w,
            left - 4.0,
            yy + 4.0
        );
    }
    for op in ops {
        let Some(c) = op.complete else { continue };
        let color = match op.kind {
            Kind::Ok => "#2a9d8f",
            Kind::Fail => "#e9c46a",
            _ => "#6c757d",
        };
        let _ = write!(
            svg,
            r#"<circle cx="{:.1}" cy="{:.1}" r="1.6" fill="{color}"/>"#,
            x(c),
            yl(c.saturating_sub(op.invoke))
        );
    }
    svg.push_str("</svg>");

    let mut rows = String::new();
    if let Some(cs) = res["checkers"].as_array() {
        for c in cs {
            let verdict = match c["valid"].as_bool() {
                Some(true) => r#"<td class="ok">valid</td>"#.to_owned(),
                Some(false) => r#"<td class="bad">INVALID</td>"#.to_owned(),
                None => r#"<td class="na">n/a</td>"#.to_owned(),
            };
            let ex: Vec<String> = c["examples"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|e| e.as_str())
                        .map(|e| format!("<li>{}</li>", esc(e)))
                        .collect()
                })
                .unwrap_or_default();
            let _ = write!(
                rows,
                "<tr><td>{}</td>{verdict}<td>{}</td><td><code>{}</code><ul>{}</ul></td></tr>",
                esc(c["checker"].as_str().unwrap_or("?")),
                c["anomalies"],
                esc(&c["stats"].to_string()),
                ex.join("")
            );
        }
    }
    let title = format!(
        "{} · {} · nemesis {} · seed {}",
        meta["system"].as_str().unwrap_or("?"),
        meta["workload"].as_str().unwrap_or("?"),
        meta["nemesis"],
        meta["seed"]
    );
    let overall = if res["valid"].as_bool() == Some(true) {
        r#"<span class="ok">VALID</span>"#
    } else {
        r#"<span class="bad">INVALID</span>"#
    };
    let mut legend = String::new();
    for k in crate::nemesis::KINDS {
        let _ = write!(
            legend,
            r#"<span class="sw" style="background:{}"></span>{k} "#,
            fault_color(k)
        );
    }
    format!(
        r#"<!doctype html>
<html><head><meta charset="utf-8"><title>{t}</title>
<style>
body{{font-family:sans-serif;margin:16px;color:#222}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top;font-size:13px}}
.ok{{color:#1b7f3a;font-weight:bold}} .bad{{color:#c1121f;font-weight:bold}} .na{{color:#888}}
.sw{{display:inline-block;width:12px;height:12px;margin:0 4px 0 10px;opacity:.6}}
code{{font-size:11px}} ul{{margin:4px 0;padding-left:18px;font-size:12px}}
</style></head><body>
<h1>{t}</h1>
<p>Verdict: {overall} &nbsp; ops: ok {ok}, fail {fail}, info {info}</p>
<p>Bars: <span class="sw" style="background:#2a9d8f"></span>ok <span class="sw" style="background:#e9c46a"></span>fail <span class="sw" style="background:#9e9e9e"></span>info (unknown) · acquires outlined · shaded: nemesis windows {legend}</p>
{svg}
<h2>Checkers</h2>
<table><tr><th>checker</th><th>verdict</th><th>anomalies</th><th>details</th></tr>{rows}</table>
<h2>Run</h2><pre>{meta}</pre>
</body></html>
"#,
        t = esc(&title),
        ok = res["ops"]["ok"],
        fail = res["ops"]["fail"],
        info = res["ops"]["info"],
        meta = esc(&serde_json::to_string_pretty(meta).unwrap_or_default()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Process;

    #[test]
    fn invalid_history_gives_invalid_results_and_a_page() {
        let mut events = vec![];
        let mut ev = |p: u64, k: Kind, t: u64, token: Option<u64>| {
            let mut e = Event::new(Process::Client(p), k, "acquire", t * 1_000_000).key("L");
            e.ttl_ms = Some(1000);
            e.token = token;
            events.push(e);
        };
        ev(0, Kind::Invoke, 0, None);
        ev(0, Kind::Ok, 1, Some(3));
        ev(1, Kind::Invoke, 2, None);
        ev(1, Kind::Ok, 3, Some(4));
        events.push(
            Event::new(Process::nemesis(), Kind::Info, "start-pause", 1_500_000)
                .value(json!("pause c0")),
        );
        let (ops, v) = check(&events, "fenced", "lock");
        let r = results(&ops, &v, json!({"system": "fenced", "clients": 2}));
        assert_eq!(r["valid"], false);
        assert_eq!(r["anomalies"]["mutual-exclusion"], 1);
        let page = html(&events, &ops, &r);
        assert!(page.contains("<svg") && page.contains("INVALID") && page.contains("pause"));
    }

    #[test]
    fn fencing_applies_to_every_fenced_client() {
        let mut events = vec![];
        for (p, k, t, token) in [
            (0, Kind::Invoke, 0, None),
            (0, Kind::Ok, 1, Some(9)),
            (1, Kind::Invoke, 5_000, None),
            (1, Kind::Ok, 5_001, Some(7)),
        ] {
            let mut e = Event::new(Process::Client(p), k, "acquire", t * 1_000_000).key("L");
            e.ttl_ms = Some(1000);
            e.token = token;
            events.push(e);
        }
        for system in ["fenced", "fenced-resp", "fenced-setnx"] {
            let (_, v) = check(&events, system, "lock");
            let f = v.iter().find(|v| v.checker == "fencing").expect("fencing");
            assert_eq!((f.valid, f.anomalies), (Some(false), 1), "{system}");
        }
        let (_, v) = check(&events, "redis", "lock");
        let f = v.iter().find(|v| v.checker == "fencing").expect("fencing");
        assert_eq!(f.valid, None);
    }
}
