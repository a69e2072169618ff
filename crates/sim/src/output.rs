//! Per-job CSV and the SVG plot of utilization and queue length over time (hand-written SVG:
//! two panels sharing the time axis, no dependency).

use crate::engine::Sample;
use crate::metrics::SimReport;
use crate::outcome::JobResult;
use crate::policy_name;
use std::fmt::Write;

/// One line per simulated job, in submit order.
pub fn jobs_csv(jobs: &[JobResult]) -> String {
    let mut out = String::from("id,submit,start,end,wait,run,procs,estimate,bsld,backfilled,suspended\n");
    for j in jobs {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{:.4},{},{}",
            j.id, j.submit, j.start, j.end, j.wait, j.run, j.procs, j.estimate, j.bsld, j.backfilled, j.suspended
        );
    }
    out
}

const WIDTH: f64 = 960.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 30.0;
/// (top, bottom) of the utilization panel and of the queue panel.
const UTIL_PANEL: (f64, f64) = (60.0, 270.0);
const QUEUE_PANEL: (f64, f64) = (330.0, 540.0);
const HEIGHT: f64 = 600.0;
/// Most points per line: samples are averaged (utilization) or maxed (queue) into bins.
const BINS: usize = 800;

/// The plot as SVG text.
pub fn plot_svg(timeline: &[Sample], report: &SimReport) -> String {
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let title = format!(
        "berth sim: {}{} on {}, {} jobs",
        policy_name(report.policy),
        if report.fair_share { " + fair share" } else { "" },
        report.machine,
        report.jobs
    );
    let _ = writeln!(svg, r#"<text x="{LEFT}" y="24" font-size="15">{}</text>"#, escape(&title));
    let (Some(first), Some(last)) = (timeline.first(), timeline.last()) else {
        svg.push_str(r#"<text x="80" y="120">no events</text></svg>"#);
        return svg;
    };
    let (t0, t1) = (first.time, last.time.max(first.time + 1.0));
    let (unit, per_unit) = time_unit(t1 - t0);
    let bins = binned(timeline, t0, t1, report.machine_procs.max(1));
    let most_queued = bins.iter().map(|b| b.1).fold(0.0, f64::max).max(1.0);
    let max_queue = (most_queued / nice_step(most_queued, 5)).ceil() * nice_step(most_queued, 5);

    let x_of = |t: f64| LEFT + (t - t0) / (t1 - t0) * (WIDTH - LEFT - RIGHT);
    let util: Vec<(f64, f64)> = bins.iter().map(|b| (x_of(b.0), y_in(UTIL_PANEL, b.2, 100.0))).collect();
    let queue: Vec<(f64, f64)> = bins.iter().map(|b| (x_of(b.0), y_in(QUEUE_PANEL, b.1, max_queue))).collect();

    axes(&mut svg, UTIL_PANEL, 100.0, "utilization (%)", t0, t1, unit, per_unit);
    axes(&mut svg, QUEUE_PANEL, max_queue, "queue length (jobs)", t0, t1, unit, per_unit);
    polyline(&mut svg, &util, "#1f77b4");
    polyline(&mut svg, &queue, "#d62728");
    let _ = writeln!(
        svg,
        r##"<text x="{}" y="{}" text-anchor="end" fill="#1f77b4">mean {:.1}%</text>"##,
        WIDTH - RIGHT,
        UTIL_PANEL.0 - 6.0,
        report.utilization * 100.0
    );
    svg.push_str("</svg>\n");
    svg
}

/// Per bin: (middle time, most jobs queued, mean utilization in percent).
fn binned(timeline: &[Sample], t0: f64, t1: f64, procs: u64) -> Vec<(f64, f64, f64)> {
    let bins = BINS.min(timeline.len().max(2));
    let width = (t1 - t0) / bins as f64;
    let mut area = vec![0.0; bins];
    let mut queue_max = vec![0usize; bins];
    let bin_of = |t: f64| (((t - t0) / width) as usize).min(bins - 1);
    for (i, s) in timeline.iter().enumerate() {
        // The state holds from this sample until the next one.
        let until = timeline.get(i + 1).map_or(s.time, |n| n.time);
        for b in bin_of(s.time)..=bin_of(until) {
            let (lo, hi) = (t0 + b as f64 * width, t0 + (b + 1) as f64 * width);
            area[b] += s.busy_procs as f64 * (until.min(hi) - s.time.max(lo)).max(0.0);
            queue_max[b] = queue_max[b].max(s.queued);
        }
    }
    (0..bins)
        .map(|b| (t0 + (b as f64 + 0.5) * width, queue_max[b] as f64, area[b] / width / procs as f64 * 100.0))
        .collect()
}

fn y_in(panel: (f64, f64), value: f64, max: f64) -> f64 {
    panel.1 - (value / max).clamp(0.0, 1.0) * (panel.1 - panel.0)
}

fn polyline(svg: &mut String, points: &[(f64, f64)], colour: &str) {
    let pts: Vec<String> = points.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
    let _ = writeln!(svg, r#"<polyline fill="none" stroke="{colour}" stroke-width="1.2" points="{}"/>"#, pts.join(" "));
}

/// A panel's frame, y ticks with grid lines, x ticks and labels.
#[allow(clippy::too_many_arguments)]
fn axes(svg: &mut String, panel: (f64, f64), y_max: f64, y_label: &str, t0: f64, t1: f64, unit: &str, per: f64) {
    let (top, bottom) = panel;
    let right = WIDTH - RIGHT;
    let _ = writeln!(
        svg,
        r##"<rect x="{LEFT}" y="{top}" width="{}" height="{}" fill="none" stroke="#333"/>"##,
        right - LEFT,
        bottom - top
    );
    let step = nice_step(y_max, 5);
    let mut v = 0.0;
    while v <= y_max + step * 1e-9 {
        let y = y_in(panel, v, y_max);
        let _ = writeln!(svg, r##"<line x1="{LEFT}" y1="{y:.1}" x2="{right}" y2="{y:.1}" stroke="#ddd"/>"##);
        let _ = writeln!(svg, r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#, LEFT - 6.0, y + 4.0, tick(v));
        v += step;
    }
    let mid = (top + bottom) / 2.0;
    let _ = writeln!(
        svg,
        r#"<text x="20" y="{mid:.1}" text-anchor="middle" transform="rotate(-90 20 {mid:.1})">{}</text>"#,
        escape(y_label)
    );
    let span = (t1 - t0) / per;
    let step = nice_step(span, 8);
    let mut u = 0.0;
    while u <= span + step * 1e-9 {
        let x = LEFT + u / span * (right - LEFT);
        let _ = writeln!(svg, r##"<line x1="{x:.1}" y1="{bottom}" x2="{x:.1}" y2="{}" stroke="#333"/>"##, bottom + 5.0);
        let _ = writeln!(svg, r#"<text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"#, bottom + 18.0, tick(u));
        u += step;
    }
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{}" text-anchor="middle">time since the first submission ({unit})</text>"#,
        (LEFT + right) / 2.0,
        bottom + 34.0
    );
}

/// The unit the time axis is labelled in, and its length in seconds.
fn time_unit(span: f64) -> (&'static str, f64) {
    match span {
        s if s <= 600.0 => ("s", 1.0),
        s if s <= 3.0 * 3600.0 => ("min", 60.0),
        s if s <= 3.0 * 86400.0 => ("h", 3600.0),
        _ => ("days", 86400.0),
    }
}

/// A round step (1, 2 or 5 times a power of ten) giving about `ticks` ticks over `range`.
fn nice_step(range: f64, ticks: usize) -> f64 {
    let raw = (range / ticks as f64).max(f64::MIN_POSITIVE);
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * magnitude).find(|&s| s >= raw).unwrap_or(raw);
    step.max(1e-9)
}

fn tick(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else {
        format!("{v:.1}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(100.0, 5), 20.0);
        assert_eq!(nice_step(7.0, 8), 1.0);
        assert_eq!(nice_step(1234.0, 8), 200.0);
    }

    #[test]
    fn bins_average_utilization_over_time() {
        // 2 of 4 procs busy for the first half, all 4 for the second: 50% then 100%.
        let t = [
            Sample { time: 0.0, busy_procs: 2, queued: 3 },
            Sample { time: 50.0, busy_procs: 4, queued: 1 },
            Sample { time: 100.0, busy_procs: 0, queued: 0 },
        ];
        let b = binned(&t, 0.0, 100.0, 4);
        assert_eq!(b.len(), 3);
        let means: Vec<f64> = b.iter().map(|x| (x.2 * 10.0).round() / 10.0).collect();
        assert_eq!(means, vec![50.0, 75.0, 100.0]);
        assert_eq!(b[0].1, 3.0);
    }
}
