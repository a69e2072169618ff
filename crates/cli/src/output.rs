//! Human-readable tables.

use berth_core::units::{format_duration, format_size};
use berth_protocol::client::JobInfo;
use berth_protocol::node::NodeInfo;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// `items` with every control character in every string written as an escape (`\n`,
/// `\u{1b}`): job names, reasons, paths and event details come from users, and printed raw
/// they could forge table rows or drive the terminal of whoever reads them (root included).
pub fn escaped<T: Serialize + DeserializeOwned + Clone>(items: &[T]) -> Vec<T> {
    let Ok(mut value) = serde_json::to_value(items) else { return items.to_vec() };
    if !escape_strings(&mut value) {
        return items.to_vec();
    }
    // Tags and numbers are untouched, so this reads back; if not, `terminal_safe` still holds.
    serde_json::from_value(value).unwrap_or_else(|_| items.to_vec())
}

/// Escape the control characters of every string in `v`; whether any was changed.
fn escape_strings(v: &mut serde_json::Value) -> bool {
    use serde_json::Value;
    match v {
        Value::String(s) => match berth_core::limits::escape_control(s) {
            std::borrow::Cow::Borrowed(_) => false,
            std::borrow::Cow::Owned(e) => {
                *s = e;
                true
            }
        },
        Value::Array(a) => a.iter_mut().fold(false, |any, x| escape_strings(x) | any),
        Value::Object(o) => o.values_mut().fold(false, |any, x| escape_strings(x) | any),
        _ => false,
    }
}

/// Human output as a whole: every control character but newline and tab escaped.
pub fn terminal_safe(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

fn local_time(t: f64) -> libc::tm {
    let secs = t as i64;
    // SAFETY: a zeroed tm is valid; localtime_r writes only into it.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    unsafe { libc::localtime_r(&secs, &mut tm) };
    tm
}

fn time_of(t: Option<f64>) -> String {
    match t {
        None => "-".into(),
        Some(t) => when(t, now()),
    }
}

/// Unix time now.
fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// A time for a table, as of `now`: the time of day when it is today, else the month, day and
/// minute (this year), else the date (issue 17 item 11: a start a year ahead read `~14:58:35`).
fn when(t: f64, now: f64) -> String {
    let (tm, today) = (local_time(t), local_time(now));
    if (tm.tm_year, tm.tm_yday) == (today.tm_year, today.tm_yday) {
        format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
    } else if tm.tm_year == today.tm_year {
        format!("{:02}-{:02} {:02}:{:02}", tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min)
    } else {
        format!("{:04}-{:02}-{:02}", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday)
    }
}

/// Local date and time to the second (a job's details).
fn full_time(t: Option<f64>) -> String {
    match t {
        None => "-".into(),
        Some(t) => {
            let tm = local_time(t);
            format!(
                "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
                tm.tm_year + 1900,
                tm.tm_mon + 1,
                tm.tm_mday,
                tm.tm_hour,
                tm.tm_min,
                tm.tm_sec
            )
        }
    }
}

/// The CPUs (cores, or PUs with `--threads`) a job has, or asks for while it waits: all its
/// nodes', a binding's count on each node (issue 17 item 11: 16 for a 48-core job over 3
/// nodes, 1 for a bound job). "-" when the request cannot be read.
pub fn job_cpus(j: &JobInfo) -> String {
    let held: u64 = j.allocation.iter().map(|a| a.cores as u64).sum();
    if held > 0 {
        return held.to_string();
    }
    let r = &j.request;
    if let Some(count) = j.binding.as_ref().and_then(|b| b.fixed_count()) {
        return (count as u64 * r.nodes.unwrap_or(1) as u64).to_string();
    }
    match r.shape() {
        Ok(berth_core::job::Shape::PerNode { nodes, cores_per_node }) => {
            (nodes as u64 * cores_per_node as u64).to_string()
        }
        Ok(berth_core::job::Shape::Total { cores, .. }) => cores.to_string(),
        Err(_) => "-".into(),
    }
}

/// Local date and time with milliseconds (event logs).
pub fn date_time(t: f64) -> String {
    let tm = local_time(t);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:03}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        ((t.fract()) * 1000.0) as u32
    )
}

pub fn alloc_summary(j: &JobInfo) -> String {
    if j.allocation.is_empty() {
        return "-".into();
    }
    j.allocation.iter().map(|a| format!("{}[{}]", a.node, a.cpus)).collect::<Vec<_>>().join(",")
}

fn exit_of(j: &JobInfo) -> String {
    match (j.exit_code, j.signal) {
        (Some(c), _) => c.to_string(),
        (None, Some(s)) => format!("sig{s}"),
        _ => "-".into(),
    }
}

/// `berth jobs`' table, a line per job.
pub fn jobs_table(jobs: &[JobInfo]) -> String {
    jobs_table_folded(jobs, false)
}

/// `berth jobs`' table; with `fold`, the pending tasks of an array in the same state for the
/// same reason are one line, the first's, shown `A_[3-9%2]` (`crate::fold`).
pub fn jobs_table_folded(jobs: &[JobInfo], fold: bool) -> String {
    let jobs = &escaped(jobs)[..];
    let lines = if fold { crate::fold::jobs_lines(jobs) } else { crate::fold::unfolded(jobs) };
    let ids: Vec<String> =
        lines.iter().map(|(j, id)| id.clone().unwrap_or_else(|| crate::arrays::shown_id(j))).collect();
    // A folded id may be wider than the column: the column grows, the rows stay aligned.
    let w = ids.iter().map(|i| i.len()).max().unwrap_or(0).max(6);
    let mut out = format!(
        "{:>w$}  {:<16} {:<10} {:<10} {:>5}  {:>11}  {:>12}  {:>7}  {:<5} {:<24} {}\n",
        "ID", "NAME", "USER", "STATE", "CORES", "SUBMIT", "START", "PRIO", "EXIT", "NODES[CPUS]", "REASON"
    );
    for ((j, _), id) in lines.iter().zip(&ids) {
        out.push_str(&format!(
            "{:>w$}  {:<16} {:<10} {:<10} {:>5}  {:>11}  {:>12}  {:>7}  {:<5} {:<24} {}\n",
            id,
            truncate(&j.name, 16),
            truncate(&j.user, 10),
            j.state.as_str(),
            job_cpus(j),
            time_of(Some(j.submit_time)),
            // Running: when it started; pending: when the scheduler expects it to ("~").
            match (j.start_time, j.expected_start) {
                (Some(t), _) => time_of(Some(t)),
                (None, Some(t)) => format!("~{}", time_of(Some(t))),
                _ => "-".into(),
            },
            j.priority.as_ref().map(|p| format!("{:.0}", p.total)).unwrap_or("-".into()),
            exit_of(j),
            truncate(&alloc_summary(j), 24),
            // A job that is not a batch job says what it is (`alloc`, `interactive`, ...).
            j.reason.clone().or_else(|| j.kind.as_ref().map(|k| format!("({k})"))).unwrap_or_default()
        ));
    }
    out
}

pub fn job_detail(j: &JobInfo) -> String {
    let j = &escaped(std::slice::from_ref(j))[0];
    let mut s = String::new();
    let mut kv = |k: &str, v: String| s.push_str(&format!("{k:>14}: {v}\n"));
    kv("id", j.id.to_string());
    if let (Some(a), Some(i)) = (j.array_job, j.array_index) {
        kv(
            "array",
            format!(
                "{a}_{i} (task {i} of array {a}{})",
                j.array_limit.map(|l| format!(", at most {l} at once")).unwrap_or_default()
            ),
        );
    }
    kv("name", j.name.clone());
    if let Some(k) = &j.kind {
        kv("kind", k.clone());
    }
    kv("user", format!("{} (uid {}, gid {})", j.user, j.uid, j.gid));
    kv("state", j.state.as_str().into());
    if let Some(r) = &j.reason {
        kv("reason", r.clone());
    }
    kv("queue", j.queue.clone());
    kv("account", j.account.clone());
    if let Some(p) = &j.priority {
        kv(
            "priority",
            format!(
                "{:.0} (age {:.3}, size {:.3}, queue {:.3}, fair share {:.3})",
                p.total, p.age, p.size, p.queue, p.fair_share
            ),
        );
    }
    if let Some(t) = j.expected_start {
        kv("expected start", full_time(Some(t)));
    }
    let r = &j.request;
    kv(
        "request",
        format!(
            "nodes={} cores={} tasks-per-node={} cpus-per-task={} mem/node={} mem/cpu={}{}",
            opt(r.nodes),
            opt(r.cores),
            opt(r.tasks_per_node),
            opt(r.cpus_per_task),
            r.mem_per_node.map(format_size).unwrap_or("-".into()),
            r.mem_per_cpu.map(format_size).unwrap_or("-".into()),
            if r.threads { " threads" } else { "" }
        ),
    );
    if r.wants_gpus() {
        let mut g = match (r.gpus, r.gpus_per_node, r.gpus_per_socket) {
            (_, _, Some(n)) => format!("{n} per socket on {} socket(s) a node", opt(r.sockets_per_node)),
            (_, Some(n), None) => format!("{n} per node"),
            (Some(n), None, None) => format!("{n} in all"),
            (None, None, None) => String::new(),
        };
        if let Some(t) = &r.gpu_type {
            g.push_str(&format!(" of type {t}"));
        }
        kv("gpus wanted", g);
    }
    if !r.gres.is_empty() {
        kv("gres wanted", format!("{} per node", berth_core::gres::render(&r.gres)));
    }
    if !r.licenses.is_empty() {
        kv("licenses wanted", berth_core::gres::render(&r.licenses));
    }
    kv("walltime", j.walltime_seconds.map(format_duration).unwrap_or("unlimited".into()));
    if let Some(d) = &j.dependency {
        kv("dependency", d.clone());
    }
    if let Some(t) = j.begin_time {
        kv("begin", full_time(Some(t)));
    }
    if let Some(c) = &j.comment {
        kv("comment", c.clone());
    }
    if let Some(d) = &j.work_dir {
        kv("workdir", d.clone());
    }
    if let Some(m) = &j.mail_type {
        kv("mail", format!("{m} to {}", j.mail_user.clone().unwrap_or_else(|| j.user.clone())));
    }
    if let Some(s) = &j.early_signal {
        kv("signal", format!("{s} (signal@seconds before the walltime ends)"));
    }
    if j.exclusive {
        kv(
            "exclusive",
            match j.tasks {
                Some(t) => format!(
                    "whole nodes, {} task(s){}",
                    t.total,
                    t.per_node.map(|k| format!(", {k} per node")).unwrap_or_default()
                ),
                None => "whole nodes".into(),
            },
        );
    }
    if let Some(t) = j.suspended_seconds {
        kv("suspended", format!("{} in total (not counted against the walltime)", format_duration(t.round() as u64)));
    }
    kv("submitted", full_time(Some(j.submit_time)));
    kv("started", full_time(j.start_time));
    kv("ended", full_time(j.end_time));
    kv("exit", format!("code {} signal {}", opt(j.exit_code), opt(j.signal)));
    kv("cwd", j.cwd.clone());
    kv("stdout", j.stdout.clone());
    kv("stderr", j.stderr.clone());
    for a in &j.allocation {
        let per_numa: Vec<String> =
            a.numa_memory.iter().map(|m| format!("{}:{}", m.numa, format_size(m.bytes))).collect();
        kv(
            "allocation",
            format!(
                "{}: cpus {} ({} {}), memory nodes {}, memory {}{}",
                a.node,
                a.cpus,
                a.cores,
                if r.threads { "PUs" } else { "cores" },
                a.mems,
                format_size(a.memory_bytes),
                if per_numa.is_empty() { String::new() } else { format!(" ({})", per_numa.join(" ")) }
            ),
        );
        if !a.gpus.is_empty() {
            let gpus: Vec<String> = a.gpus.iter().map(u32::to_string).collect();
            kv("gpus", format!("{}: {}", a.node, gpus.join(",")));
            for p in j.gpu_places.iter().filter(|p| p.node == a.node) {
                kv("gpu", format!("{}: {}", a.node, gpu_place(p)));
            }
        }
        if !a.gres.is_empty() {
            kv("gres", format!("{}: {}", a.node, berth_core::gres::render(&a.gres)));
        }
        if !a.licenses.is_empty() {
            kv("licenses", berth_core::gres::render(&a.licenses));
        }
        if !a.exclusive_numa.is_empty() {
            kv("exclusive", format!("{}: NUMA nodes {} held alone", a.node, a.exclusive_numa));
        }
        if !a.subnodes.is_empty() {
            let subs: Vec<String> = a.subnodes.iter().map(|s| s.to_string()).collect();
            kv("subnodes", format!("{}: {}", a.node, subs.join(",")));
        }
        if !a.binding.is_empty() {
            let cores: Vec<String> = a.binding.iter().map(|(s, c)| format!("{s},{c}")).collect();
            kv("binding", format!("{}: {} ({})", a.node, cores.join(" "), j_binding(j)));
        }
        for (rank, set) in a.ranks.iter().enumerate() {
            kv("rank cpuset", format!("{}: rank {rank}: cpus {} mems {}", a.node, set.cpus, set.mems));
        }
    }
    for c in &j.cgroups {
        let what = c.rank.map(|r| format!("rank {r}")).unwrap_or_else(|| "job".into());
        kv("cgroup", format!("{}: {what} {} cpus {} mems {} (host)", c.node, c.path, c.cpus, c.mems));
    }
    if let Some(acct) = &j.accounting {
        kv(
            "usage",
            format!(
                "wall {:.2}s, user {:.2}s, system {:.2}s, peak memory {}",
                acct.wall_seconds,
                acct.user_cpu_seconds,
                acct.system_cpu_seconds,
                format_size(acct.peak_memory_bytes)
            ),
        );
    }
    s
}

/// One GPU's place as `berth show` prints it: `gpu 1 (a100) on NUMA node 0, socket 0, link
/// group 0; local cpus 0-15, 4 of the job's`.
fn gpu_place(p: &berth_core::gpu::GpuPlace) -> String {
    let mut where_: Vec<String> = vec![];
    where_.extend(p.numa.map(|n| format!("NUMA node {n}")));
    where_.extend(p.socket.map(|n| format!("socket {n}")));
    where_.extend(p.link_group.map(|g| format!("link group {g}")));
    let at = if where_.is_empty() { "locality unknown".to_string() } else { format!("on {}", where_.join(", ")) };
    let cpus = if p.cpus.is_empty() {
        String::new()
    } else {
        format!("; local cpus {}, {} of the job's", p.cpus.to_list(), p.job_cpus_local)
    };
    format!("gpu {} ({}) {at}{cpus}", p.index, p.type_name)
}

/// The binding strategy and mode as submitted.
fn j_binding(j: &JobInfo) -> String {
    let mode = j.binding_mode.map(|m| m.to_string()).unwrap_or_else(|| "set".into());
    match &j.binding {
        Some(b) => format!("{b}, mode {mode}"),
        None => format!("mode {mode}"),
    }
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

pub fn nodes_table(nodes: &[NodeInfo]) -> String {
    let nodes = &escaped(nodes)[..];
    // A GPUS column only when some node has GPUs, so that GPU-less clusters look as before.
    let with_gpus = nodes.iter().any(|n| !n.gpus.is_empty());
    // Beside it their types (`3/4 a100`), one word so the columns after it stay one word each.
    let gpus_column =
        |text: &str, types: &str| if with_gpus { format!(" {text:>5} {types:<9}") } else { String::new() };
    // A GRES column (used/total of each, e.g. `nvme:100/800`) only when some node has them.
    let with_gres = nodes.iter().any(|n| !n.gres.is_empty());
    let gres_column = |text: &str| if with_gres { format!("  {text:<24}") } else { String::new() };
    let mut out = format!(
        "{:<10} {:<20} {:>5} {:<24} {:<24} {:>9}{}{}  {}\n",
        "NODE",
        "STATE",
        "CPUS",
        "TOPOLOGY",
        "FREE",
        "MEM",
        gpus_column("GPUS", "TYPE"),
        gres_column("GRES (used/total)"),
        "MEMORY PER NUMA NODE (used/total)"
    );
    for n in nodes {
        let numa: Vec<String> = n
            .numa
            .iter()
            .map(|m| {
                // Memory hwloc did not give is marked with its source (README, "Agent flags").
                let source = if m.memory_source.is_hwloc() { String::new() } else { format!("({})", m.memory_source) };
                format!("{}:{}/{}{source}", m.os_index, format_size(m.allocated_bytes), format_size(m.memory_bytes))
            })
            .collect();
        out.push_str(&format!(
            "{:<10} {:<20} {:>5} {:<24} {:<24} {:>9}{}{}  {}\n",
            n.name,
            n.state,
            format!("{}/{}", n.cpus_allocated, n.pus),
            truncate(&n.topology, 24),
            truncate(&n.free, 24),
            format_size(n.memory_bytes),
            gpus_column(&format!("{}/{}", n.gpus_allocated, n.gpus.len()), &gpu_types_text(&n.gpus)),
            gres_column(&gres_text(&n.gres)),
            numa.join(" ")
        ));
    }
    out
}

/// A node's GPU types for `berth nodes` (`Gpu::type_name`): the type when all are of one
/// (`a100`), else each type and how many in order of first index (`a100:2,v100:2`); `-` for none.
pub fn gpu_types_text(gpus: &[berth_core::gpu::Gpu]) -> String {
    let mut types: Vec<(String, usize)> = vec![];
    for g in gpus {
        let t = g.type_name();
        match types.iter_mut().find(|(k, _)| *k == t) {
            Some((_, n)) => *n += 1,
            None => types.push((t, 1)),
        }
    }
    match types.as_slice() {
        [] => "-".into(),
        [(t, _)] => t.clone(),
        _ => types.iter().map(|(t, n)| format!("{t}:{n}")).collect::<Vec<_>>().join(","),
    }
}

/// `name:used/total,...` (`-` for none).
pub fn gres_text(counts: &[berth_protocol::node::CountInfo]) -> String {
    if counts.is_empty() {
        return "-".into();
    }
    counts.iter().map(|c| format!("{}:{}/{}", c.name, c.used, c.total)).collect::<Vec<_>>().join(",")
}

/// `berth licenses`: each license, how many exist, are held and are free.
pub fn licenses_table(licenses: &[berth_protocol::node::CountInfo]) -> String {
    let mut out = format!("{:<32} {:>10} {:>10} {:>10}\n", "LICENSE", "TOTAL", "USED", "FREE");
    for l in licenses {
        out.push_str(&format!(
            "{:<32} {:>10} {:>10} {:>10}\n",
            berth_core::limits::escape_control(&l.name),
            l.total,
            l.used,
            l.total.saturating_sub(l.used)
        ));
    }
    out
}

pub fn acct_table(jobs: &[JobInfo]) -> String {
    let jobs = &escaped(jobs)[..];
    // GPU-seconds only when a job had GPUs: the table of a site without GPUs stays as it was.
    let gpus = jobs.iter().any(|j| j.accounting.as_ref().is_some_and(|a| a.gpu_seconds > 0.0));
    let gpu_col = |v: &str| if gpus { format!(" {v:>9}") } else { String::new() };
    // Generic resources and licenses held, likewise only when a job held some.
    let held: Vec<String> = jobs.iter().map(held_tres).collect();
    let width = held.iter().map(String::len).max().unwrap_or(0);
    let held_col = |v: &str| if width > 0 { format!("  {v:<width$}", width = width.max(4)) } else { String::new() };
    let mut out = format!(
        "{:>6}  {:<16} {:<10} {:<10} {:>5} {:>9} {:>9} {:>9} {:>9}{}{}  {}\n",
        "ID",
        "NAME",
        "USER",
        "STATE",
        "EXIT",
        "WALL(s)",
        "USER(s)",
        "SYS(s)",
        "PEAKMEM",
        gpu_col("GPU(s)"),
        held_col("HELD"),
        "NODES"
    );
    for (j, held) in jobs.iter().zip(&held) {
        let (w, u, s, m, g) = j
            .accounting
            .as_ref()
            .map(|a| {
                (
                    format!("{:.2}", a.wall_seconds),
                    format!("{:.2}", a.user_cpu_seconds),
                    format!("{:.2}", a.system_cpu_seconds),
                    format_size(a.peak_memory_bytes),
                    format!("{:.2}", a.gpu_seconds),
                )
            })
            .unwrap_or(("-".into(), "-".into(), "-".into(), "-".into(), "-".into()));
        let nodes: Vec<&str> = j.allocation.iter().map(|a| a.node.as_str()).collect();
        out.push_str(&format!(
            "{:>6}  {:<16} {:<10} {:<10} {:>5} {:>9} {:>9} {:>9} {:>9}{}{}  {}\n",
            j.id.0,
            truncate(&j.name, 16),
            truncate(&j.user, 10),
            j.state.as_str(),
            exit_of(j),
            w,
            u,
            s,
            m,
            gpu_col(&g),
            held_col(if held.is_empty() { "-" } else { held }),
            nodes.join(",")
        ));
    }
    out
}

/// The generic resources (summed over the job's nodes) and licenses a job holds or held, in
/// Slurm's TRES spelling: `gres/nvme=500,license/matlab=2`; empty when none.
pub fn held_tres(j: &JobInfo) -> String {
    let mut gres = berth_core::gres::Counts::new();
    let mut licenses = berth_core::gres::Counts::new();
    for a in &j.allocation {
        for (sum, part) in [(&mut gres, &a.gres), (&mut licenses, &a.licenses)] {
            for (name, &n) in part {
                let c = sum.entry(name.clone()).or_insert(0);
                *c = c.saturating_add(n);
            }
        }
    }
    let items = gres.iter().map(|(n, c)| format!("gres/{n}={c}"));
    items.chain(licenses.iter().map(|(n, c)| format!("license/{n}={c}"))).collect::<Vec<_>>().join(",")
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n.saturating_sub(1)).collect();
        t.push('+');
        t
    }
}

/// The invocation log (`berth acct --steps`).
pub fn steps_table(steps: &[berth_protocol::step::StepInfo]) -> String {
    let steps = &escaped(steps)[..];
    let mut out = format!(
        "{:>9}  {:<11} {:<12} {:>7} {:<8} {:>5} {:>5}  {:<20} {:<24} {}\n",
        "STEP", "START", "HOST", "PID", "USER", "RANKS", "EXIT", "CWD", "COMMAND", "FAILURE"
    );
    for s in steps {
        let exit = match (s.exit_code, s.end_time) {
            (Some(c), _) => c.to_string(),
            (None, None) => "run".into(),
            (None, Some(_)) => "-".into(),
        };
        out.push_str(&format!(
            "{:>9}  {:<11} {:<12} {:>7} {:<8} {:>5} {:>5}  {:<20} {:<24} {}\n",
            format!("{}.{}", s.job.0, s.step),
            time_of(Some(s.start_time)),
            truncate(&s.host, 12),
            s.pid,
            truncate(&s.user, 8),
            s.size,
            exit,
            truncate(&s.cwd, 20),
            truncate(&s.argv.join(" "), 24),
            s.failure.as_deref().unwrap_or("")
        ));
    }
    out
}

pub fn share_table(half_life_secs: f64, accounts: &[berth_core::sched::fairshare::ShareLine]) -> String {
    let accounts = &escaped(accounts)[..];
    let mut out = format!(
        "usage decays with a half-life of {}\n{:<20} {:>8} {:>14} {:>8} {:>8}\n",
        format_duration(half_life_secs.round() as u64),
        "ACCOUNT",
        "SHARE",
        "USAGE(cpu-h)",
        "USED",
        "FACTOR"
    );
    for a in accounts {
        out.push_str(&format!(
            "{:<20} {:>7.1}% {:>14.2} {:>7.1}% {:>8.3}\n",
            truncate(&a.account, 20),
            a.share * 100.0,
            a.usage / 3600.0,
            a.usage_fraction * 100.0,
            a.factor
        ));
    }
    if accounts.is_empty() {
        out.push_str("(no account has used anything or been given a share yet)\n");
    }
    out
}

pub fn queues_table(queues: &[berth_protocol::client::QueueInfo]) -> String {
    let queues = &escaped(queues)[..];
    let limit = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let mut out = format!(
        "{:<12} {:<8} {:>5} {:>6} {:>10} {:>10} {:>9} {:>9} {:>6} {:>6} {:>5} {:>7}  {}\n",
        "QUEUE",
        "STATE",
        "PRIO",
        "CLASS",
        "MAXWALL",
        "DEFWALL",
        "CORES/JOB",
        "CORES/USR",
        "QUEUED",
        "HELD",
        "RUN",
        "RUNCORE",
        "PROPERTIES"
    );
    for q in queues {
        let s = &q.spec;
        let mut props = match (&s.allowed_properties, s.allowed_subnodes) {
            (_, Some(false)) => "no subnode properties".to_string(),
            (Some(p), _) => p.join(","),
            (None, _) => "any".into(),
        };
        if !s.target_properties.is_empty() {
            // Where the queue's jobs run (and, reserved, where no other queue's do).
            let only = if s.reserved { ", reserved" } else { "" };
            props.push_str(&format!("; runs on {}{only}", s.target_properties.join(",")));
        }
        out.push_str(&format!(
            "{:<12} {:<8} {:>5} {:>6} {:>10} {:>10} {:>9} {:>9} {:>6} {:>6} {:>5} {:>7}  {}\n",
            truncate(&s.name, 12),
            if s.enabled { "open" } else { "closed" },
            s.priority,
            s.preempt_class,
            limit(s.max_walltime_secs.map(format_duration)),
            limit(s.default_walltime_secs.map(format_duration)),
            limit(s.max_cores_per_job.map(|c| c.to_string())),
            limit(s.max_cores_per_user.map(|c| c.to_string())),
            q.queued,
            q.held,
            q.running,
            q.running_cores,
            props
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(name: &str, reason: &str) -> JobInfo {
        serde_json::from_value(serde_json::json!({
            "id": 7, "name": name, "user": "mallory", "uid": 1000, "gid": 1000, "state": "failed",
            "queue": "batch", "request": {"nodes": null, "cores": 1, "tasks_per_node": null,
            "cpus_per_task": null, "mem_per_node": null, "mem_per_cpu": null, "threads": false},
            "walltime_seconds": 60, "submit_time": 0.0, "start_time": null, "end_time": null,
            "allocation": [], "exit_code": 1, "signal": null, "reason": reason,
            "cwd": "/tmp", "stdout": "/tmp/o", "stderr": "/tmp/e", "accounting": null
        }))
        .unwrap()
    }

    /// Issue 20: `berth show` gives each GPU of the job its place, under its node's `gpus`.
    #[test]
    fn show_prints_where_each_gpu_sits() {
        let mut j = job("g", "");
        j.allocation = serde_json::from_value(serde_json::json!([
            {"node_id": 0, "node": "g1", "cpus": "0-1,4", "cores": 3, "mems": "0", "memory_bytes": 0, "gpus": [0, 2]},
            {"node_id": 1, "node": "g2", "cpus": "0", "cores": 1, "mems": "0", "memory_bytes": 0}
        ]))
        .unwrap();
        j.gpu_places = serde_json::from_value(serde_json::json!([
            {"node": "g1", "index": 0, "type": "a100", "numa": 0, "socket": 0, "cpus": "0-3", "link_group": 0, "job_cpus_local": 2},
            {"node": "g1", "index": 2, "type": "a100\u{1b}[31m", "job_cpus_local": 0}
        ]))
        .unwrap();
        let text = job_detail(&j);
        let lines: Vec<&str> = text.lines().filter(|l| l.trim_start().starts_with("gpu")).collect();
        assert_eq!(
            lines,
            [
                "          gpus: g1: 0,2",
                "           gpu: g1: gpu 0 (a100) on NUMA node 0, socket 0, link group 0; local cpus 0-3, 2 of the job's",
                "           gpu: g1: gpu 2 (a100\\u{1b}[31m) locality unknown",
            ],
            "{text}"
        );
    }

    /// Issue 19: `berth jobs` folds an array's pending tasks into one line; its ID column
    /// grows to the folded id, the other columns stay aligned.
    #[test]
    fn jobs_table_folds_pending_array_tasks() {
        let task = |id: u64, index: u32, state: &str| {
            let mut j = job("arr", "");
            j.id = berth_core::JobId(id);
            j.state = berth_core::job::JobState::parse(state).unwrap();
            (j.array_job, j.array_index, j.exit_code) = (Some(berth_core::JobId(12)), Some(index), None);
            j
        };
        let mut jobs = vec![task(12, 1, "running")];
        jobs.extend((3..=2_000u32).map(|i| task(10 + u64::from(i), i, "queued")));
        let folded = jobs_table_folded(&jobs, true);
        let lines: Vec<&str> = folded.lines().collect();
        assert_eq!(lines.len(), 3, "{folded}");
        assert_eq!(lines[1].split_whitespace().next(), Some("12_1"));
        assert_eq!(lines[2].split_whitespace().next(), Some("12_[3-2000]"));
        let name_at = |l: &str| l.find("arr").or_else(|| l.find("NAME"));
        assert_eq!(name_at(lines[0]), name_at(lines[2]), "aligned:\n{folded}");
        assert_eq!(name_at(lines[1]), name_at(lines[2]), "aligned:\n{folded}");
        assert_eq!(jobs_table_folded(&jobs, false).lines().count(), jobs.len() + 1, "--no-fold: a line per task");
    }

    /// Issue 17 item 11: a time not today shows its date; a waiting job's CORES is what it
    /// asks for over all its nodes, a binding's count per node included.
    #[test]
    fn start_shows_the_date_and_cores_count_every_node() {
        let now = 1_800_000_000.0;
        assert_eq!(when(now, now).len(), 8, "today: the time of day");
        assert!(when(now + 2.0 * 86_400.0, now).contains(' '), "{}", when(now + 2.0 * 86_400.0, now));
        let next_year = when(now + 365.0 * 86_400.0, now);
        assert_eq!(next_year.len(), 10, "{next_year}");
        assert!(next_year.starts_with("2028-"), "{next_year}");
        let mut j = job("wide", "");
        j.request.cores = None;
        j.request.nodes = Some(3);
        j.request.tasks_per_node = Some(16);
        assert_eq!(job_cpus(&j), "48");
        j.request = Default::default();
        j.request.nodes = Some(2);
        j.binding = Some("linear:4".parse().unwrap());
        assert_eq!(job_cpus(&j), "8");
        j.binding = None;
        j.request = Default::default();
        j.request.cores = Some(6);
        assert_eq!(job_cpus(&j), "6");
        assert!(jobs_table(&[j]).lines().nth(1).is_some_and(|l| l.split_whitespace().nth(4) == Some("6")));
    }

    /// Issue 16 item 8: a name or reason with newlines and escape sequences neither forges a
    /// row nor reaches the terminal as a control sequence, in any human table or detail.
    #[test]
    fn user_strings_cannot_forge_rows_or_drive_the_terminal() {
        let hostile = job("x\n     8  forged           root       running\u{1b}]0;pwned\u{7}", "oom\r\u{9b}2J");
        let jobs = [hostile.clone(), job("plain", "walltime")];
        for text in [jobs_table(&jobs), acct_table(&jobs), job_detail(&hostile)] {
            let safe = terminal_safe(&text);
            assert!(!safe.contains('\u{1b}') && !safe.contains('\u{9b}') && !safe.contains('\r'), "{safe:?}");
            assert!(!text.lines().any(|l| l.trim_start().starts_with("8  forged")), "a forged row:\n{text}");
        }
        assert_eq!(jobs_table(&jobs).lines().count(), 3, "a header and one row per job");
        assert!(jobs_table(&jobs).contains("x\\n"), "the newline is shown escaped");
        assert_eq!(terminal_safe("a\tb\nc"), "a\tb\nc", "layout characters stay");
    }

    /// Issue 17 item 1: memory hwloc did not give is shown with where it came from.
    #[test]
    fn nodes_table_shows_where_numa_memory_came_from() {
        let numa = |os: u32, source: &str| {
            let mut n =
                serde_json::json!({"os_index": os, "memory_bytes": 32u64 << 30, "allocated_bytes": 0, "cpus": "0"});
            if !source.is_empty() {
                n["memory_source"] = source.into();
            }
            n
        };
        let node: NodeInfo = serde_json::from_value(serde_json::json!({
            "id": 0, "name": "epyc1", "state": "up", "address": "a", "sockets": 2, "cores": 16, "pus": 32,
            "topology": "SCC", "free": "SCC", "cpus_allocated": 0, "memory_bytes": 128u64 << 30,
            "memory_allocated_bytes": 0, "real_cpus": "0", "jobs": [], "last_heard_seconds_ago": null,
            "numa": [numa(0, ""), numa(1, "os"), numa(2, "split"), numa(3, "config")]
        }))
        .unwrap();
        let table = nodes_table(&[node]);
        assert!(table.contains("0:0B/32G 1:0B/32G(os) 2:0B/32G(split) 3:0B/32G(config)"), "{table}");
    }

    /// Issue 20: a GPUS column when some node has GPUs, none otherwise; `--json` lists them.
    #[test]
    fn nodes_table_counts_gpus_only_when_there_are_some() {
        let node = |name: &str, gpus: u32| -> NodeInfo {
            let mut topo = berth_core::topology::Topology::uniform(2, 1, 1, 1, 1 << 30);
            topo.add_emulated_gpus(gpus).unwrap();
            serde_json::from_value(serde_json::json!({
                "id": 0, "name": name, "state": "up", "address": "a", "sockets": 2, "cores": 2, "pus": 2,
                "topology": "SCSC", "free": "SCSC", "cpus_allocated": 0, "memory_bytes": 2u64 << 30,
                "memory_allocated_bytes": 0, "real_cpus": "0", "jobs": [], "last_heard_seconds_ago": null,
                "numa": [], "gpus": topo.gpus
            }))
            .unwrap()
        };
        let plain = nodes_table(&[node("cpu1", 0)]);
        assert!(!plain.contains("GPUS"), "{plain}");
        assert!(plain.starts_with("NODE       STATE                 CPUS TOPOLOGY"), "{plain}");
        let (cpu, mut gpu) = (node("cpu1", 0), node("gpu1", 2));
        assert_eq!(gpu.gpus.len(), 4);
        gpu.gpus_allocated = 3;
        let table = nodes_table(&[cpu.clone(), gpu.clone()]);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].contains("      MEM  GPUS TYPE       MEMORY PER NUMA NODE"), "{table}");
        assert!(lines[1].ends_with("       2G   0/0 -          "), "{table}");
        assert!(lines[2].ends_with("       2G   3/4 emulated   "), "{table}");
        // Each column stays one word: GPUS is the 7th, its types the 8th.
        let words: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!((words[6], words[7]), ("3/4", "emulated"), "{table}");
        // Several types: each with its count, in index order.
        let mut mixed = gpu.gpus.clone();
        mixed[0].emulated = false;
        mixed[0].model = Some("NVIDIA A100-SXM4-80GB".into());
        mixed[1].emulated = false;
        mixed[1].model = Some("NVIDIA A100-SXM4-80GB".into());
        assert_eq!(gpu_types_text(&mixed), "a100-sxm4-80gb:2,emulated:2");
        assert_eq!(gpu_types_text(&mixed[..2]), "a100-sxm4-80gb");
        assert_eq!(gpu_types_text(&[]), "-");
        // The JSON of a node has its GPUs; a node without has no `gpus` key.
        let json = serde_json::to_value([&cpu, &gpu]).unwrap();
        assert!(json[0].get("gpus").is_none(), "{json}");
        assert_eq!(json[1]["gpus"].as_array().map(Vec::len), Some(4));
        assert_eq!(json[1]["gpus"][3]["numa"], 1);
        assert_eq!((json[0].get("gpus_allocated"), &json[1]["gpus_allocated"]), (None, &serde_json::json!(3)));
    }

    #[test]
    fn queues_show_their_subnode_targets() {
        use berth_core::sched::queue::QueueSpec;
        let q = |spec: QueueSpec| berth_protocol::client::QueueInfo {
            spec,
            priority_factor: 0.5,
            queued: 1,
            held: 0,
            running: 2,
            running_cores: 4,
        };
        let fat = QueueSpec {
            name: "fat".into(),
            target_properties: vec!["bigmem".into()],
            reserved: true,
            ..Default::default()
        };
        let table = queues_table(&[q(QueueSpec::default()), q(fat)]);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[1].starts_with("batch") && lines[1].ends_with("  any"), "{table}");
        assert!(lines[2].starts_with("fat") && lines[2].ends_with("  any; runs on bigmem, reserved"), "{table}");
    }
}
