//! Folding a job array's pending tasks into one line, as squeue shows them (issue 19): the
//! tasks of one array waiting in the same state for the same reason are the line of the
//! first, its id written `A_[3-5,7,9-20]` (the indexes in ranges, the running limit after a
//! `%`, as `A_[3-100000%50]`); running and ended tasks keep a line each (`A_1`). `berth jobs`,
//! squeue fold this way (`-r`/`--no-fold`: a line per task); JSON output never folds (one
//! object per task).

use berth_protocol::client::JobInfo;
use std::collections::HashMap;
use std::hash::Hash;

/// How long a folded index list may be (Slurm's default `SLURM_BITSTR_LEN`): a longer one is
/// cut after a whole range, `...` marking the cut.
pub const MAX_INDEXES_LEN: usize = 64;

/// What folding needs of one entry of a list: its array, its index in it, what must be equal
/// for tasks to share a line (state, reason), and the array's running limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Foldable<K> {
    pub array: u64,
    pub index: u32,
    pub key: K,
    pub limit: Option<u32>,
}

/// The lines for `items`, in their order: `(item, None)` for an item on a line of its own,
/// `(first, Some(id))` for the first of two or more foldable items of the same array and key
/// (the others are left out: the first stands for them all, shown `id`). An item
/// `foldable` gives `None` for is never folded; a lone task keeps its own line.
pub fn fold<T, K: Eq + Hash + Clone>(
    items: &[T],
    foldable: impl Fn(&T) -> Option<Foldable<K>>,
    max_len: usize,
) -> Vec<(&T, Option<String>)> {
    let keyed: Vec<Option<Foldable<K>>> = items.iter().map(&foldable).collect();
    let mut groups: HashMap<(u64, K), Vec<u32>> = HashMap::new();
    for f in keyed.iter().flatten() {
        groups.entry((f.array, f.key.clone())).or_default().push(f.index);
    }
    let mut out = Vec::with_capacity(items.len());
    for (item, f) in items.iter().zip(keyed) {
        let Some(f) = f else {
            out.push((item, None));
            continue;
        };
        match groups.remove(&(f.array, f.key)) {
            Some(mut indexes) if indexes.len() > 1 => {
                indexes.sort_unstable();
                indexes.dedup();
                out.push((item, Some(label(f.array, &indexes, f.limit, max_len))));
            }
            Some(_) => out.push((item, None)),
            // A later task of a group already shown.
            None => {}
        }
    }
    out
}

/// A folded line's id: `A_[1-3,5%2]`.
pub fn label(array: u64, indexes: &[u32], limit: Option<u32>, max_len: usize) -> String {
    let limit = limit.map(|l| format!("%{l}")).unwrap_or_default();
    format!("{array}_[{}{limit}]", indexes_text(indexes, max_len))
}

/// Ascending indexes in ranges (`1-3,5,7-9`), at most `max_len` characters (0: no bound): a
/// longer list is cut after the last whole range that fits, with `...` after it.
pub fn indexes_text(indexes: &[u32], max_len: usize) -> String {
    let full = berth_core::directives::array::fold(indexes);
    if max_len == 0 || full.len() <= max_len {
        return full;
    }
    let room = max_len.saturating_sub(3);
    let cut = full[..=room.min(full.len() - 1)].rfind(',').unwrap_or(0);
    format!("{}...", &full[..cut])
}

/// The bound on folded index lists squeue uses: `SLURM_BITSTR_LEN` (0: none), as Slurm's.
pub fn slurm_max_len() -> usize {
    std::env::var("SLURM_BITSTR_LEN").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(MAX_INDEXES_LEN)
}

/// A pending task of an array, keyed by `key`; anything else is not folded.
pub fn pending_task<K>(j: &JobInfo, key: impl Fn(&JobInfo) -> K) -> Option<Foldable<K>> {
    match (j.array_job, j.array_index) {
        (Some(a), Some(index)) if j.state.is_pending() => {
            Some(Foldable { array: a.0, index, key: key(j), limit: j.array_limit })
        }
        _ => None,
    }
}

/// `berth jobs`' lines: pending tasks of an array in the same state with the same reason fold.
pub fn jobs_lines(jobs: &[JobInfo]) -> Vec<(&JobInfo, Option<String>)> {
    fold(jobs, |j| pending_task(j, |j| (j.state, j.reason.clone())), MAX_INDEXES_LEN)
}

/// Every job on its own line (`-r`, `--no-fold`).
pub fn unfolded(jobs: &[JobInfo]) -> Vec<(&JobInfo, Option<String>)> {
    jobs.iter().map(|j| (j, None)).collect()
}

/// One line of qstat's tables: a job or a subjob, or a whole array (`A[].server`) for which
/// its first task listed stands.
#[derive(Debug, Clone, PartialEq)]
pub struct PbsLine<'a> {
    pub job: &'a JobInfo,
    pub array: Option<PbsArray>,
}

/// An array as qstat shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PbsArray {
    pub id: u64,
    /// `Q` while every subjob waits, `H` all held, `B` once one has begun, `F` all ended.
    pub state: char,
    /// Its subjobs' indexes (those listed).
    pub indexes: Vec<u32>,
    /// Subjobs queued (or held), running (or suspended), and ended (`Expired`: those ended,
    /// counted from the array's size when ended ones are not listed).
    pub queued: usize,
    pub running: usize,
    pub expired: usize,
}

/// The state of an array of `count` subjobs from those listed (`tasks`).
pub fn pbs_array_state(tasks: &[&JobInfo], count: usize) -> char {
    if tasks.iter().all(|t| t.state.is_finished()) {
        'F'
    } else if tasks.len() < count || tasks.iter().any(|t| t.start_time.is_some() || t.state.is_finished()) {
        // Some subjob has begun (one not listed has ended).
        'B'
    } else if tasks.iter().all(|t| t.state == berth_core::job::JobState::Held) {
        'H'
    } else {
        'Q'
    }
}

/// qstat's lines, by PBS's rule: an array is one line `A[].server` where its first listed
/// subjob is (states in [`pbs_array_state`]); with `subjobs` (`-t`) its subjobs `A[i].server`
/// follow it; `arrays_only` (`-J`) leaves out jobs that are no array's.
pub fn pbs_lines(jobs: &[JobInfo], subjobs: bool, arrays_only: bool) -> Vec<PbsLine<'_>> {
    let mut tasks: HashMap<u64, Vec<&JobInfo>> = HashMap::new();
    for j in jobs {
        if let (Some(a), Some(_)) = (j.array_job, j.array_index) {
            tasks.entry(a.0).or_default().push(j);
        }
    }
    let mut out = Vec::new();
    for j in jobs {
        let Some(a) = j.array_job.filter(|_| j.array_index.is_some()) else {
            if !arrays_only {
                out.push(PbsLine { job: j, array: None });
            }
            continue;
        };
        let Some(mut members) = tasks.remove(&a.0) else { continue };
        members.sort_by_key(|t| t.array_index);
        let count = members.iter().filter_map(|t| t.array_count).max().map_or(members.len(), |c| c as usize);
        let queued = members.iter().filter(|t| t.state.is_pending()).count();
        let running = members.iter().filter(|t| t.state.has_allocation()).count();
        let array = PbsArray {
            id: a.0,
            state: pbs_array_state(&members, count),
            indexes: members.iter().filter_map(|t| t.array_index).collect(),
            queued,
            running,
            expired: count.max(members.len()) - queued - running,
        };
        out.push(PbsLine { job: members[0], array: Some(array) });
        if subjobs {
            out.extend(members.into_iter().map(|t| PbsLine { job: t, array: None }));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plain list entry: (id, array, index, state).
    type Entry = (u64, Option<u64>, u32, &'static str);

    fn lines(items: &[Entry], max_len: usize) -> Vec<String> {
        let foldable = |e: &Entry| -> Option<Foldable<&'static str>> {
            let (_, array, index, state) = *e;
            (state == "PD").then_some(Foldable { array: array?, index, key: state, limit: None })
        };
        fold(items, foldable, max_len)
            .into_iter()
            .map(|((id, array, index, state), label)| match (label, array) {
                (Some(l), _) => format!("{l} {state}"),
                (None, Some(a)) => format!("{a}_{index} {state}"),
                (None, None) => format!("{id} {state}"),
            })
            .collect()
    }

    #[test]
    fn pending_tasks_of_an_array_fold_into_one_line() {
        let mut items: Vec<Entry> = vec![(9, None, 0, "PD"), (12, Some(12), 1, "R"), (13, Some(12), 2, "R")];
        items.extend((3..=100_000).map(|i| (12 + u64::from(i) - 1, Some(12), i, "PD")));
        assert_eq!(lines(&items, MAX_INDEXES_LEN), vec!["9 PD", "12_1 R", "12_2 R", "12_[3-100000] PD"]);
    }

    #[test]
    fn gaps_states_and_arrays_are_kept_apart() {
        let items: Vec<Entry> = vec![
            (20, Some(20), 3, "PD"),
            (21, Some(20), 4, "PD"),
            (22, Some(20), 5, "PD"),
            (23, Some(20), 6, "R"),
            (24, Some(20), 7, "PD"),
            (25, Some(20), 9, "PD"),
            (26, Some(20), 10, "PD"),
            (30, Some(30), 0, "PD"),
            (31, Some(30), 1, "PD"),
            (40, Some(40), 0, "PD"),
            (41, Some(40), 1, "R"),
        ];
        assert_eq!(
            lines(&items, MAX_INDEXES_LEN),
            vec!["20_[3-5,7,9-10] PD", "20_6 R", "30_[0-1] PD", "40_0 PD", "40_1 R"],
            "one line per array and state, at its first task; a lone pending task keeps its id"
        );
    }

    #[test]
    fn the_running_limit_follows_the_indexes() {
        assert_eq!(label(12, &[3, 4, 5, 7], Some(50), 0), "12_[3-5,7%50]");
        assert_eq!(label(12, &[3], None, 0), "12_[3]");
    }

    #[test]
    fn long_index_lists_are_cut_after_a_whole_range() {
        let odd: Vec<u32> = (0..100).map(|i| 2 * i + 1).collect();
        let text = indexes_text(&odd, 20);
        assert_eq!(text, "1,3,5,7,9,11,13...");
        assert!(text.len() <= 20);
        assert_eq!(indexes_text(&odd, 0).matches(',').count(), 99, "0: no bound");
        assert_eq!(indexes_text(&[1, 2, 3], 3), "1-3", "what fits is whole");
        assert_eq!(indexes_text(&[100_000, 100_002], 4), "...", "not even one range fits");
    }

    fn task(id: u64, i: u32, state: &str, reason: &str) -> JobInfo {
        let mut j: JobInfo = serde_json::from_value(serde_json::json!({
            "id": id, "name": "a", "user": "ann", "uid": 1, "gid": 1, "state": state, "queue": "batch",
            "request": {"nodes": null, "cores": 1, "tasks_per_node": null, "cpus_per_task": null,
            "mem_per_node": null, "mem_per_cpu": null, "threads": false},
            "walltime_seconds": 60, "submit_time": 0.0, "start_time": null, "end_time": null,
            "allocation": [], "exit_code": null, "signal": null, "reason": reason,
            "cwd": "/", "stdout": "/o", "stderr": "/e", "accounting": null
        }))
        .unwrap();
        (j.array_job, j.array_index, j.array_limit) = (Some(berth_core::JobId(10)), Some(i), Some(2));
        j
    }

    fn shown(lines: Vec<(&JobInfo, Option<String>)>) -> Vec<String> {
        lines.into_iter().map(|(j, id)| id.unwrap_or_else(|| crate::arrays::shown_id(j))).collect()
    }

    #[test]
    fn jobs_and_squeue_fold_queued_and_held_tasks_apart() {
        let limit = "JobArrayTaskLimit: array 10 runs at most 2 tasks at once (%2)";
        let mut plain = task(9, 0, "queued", "");
        (plain.array_job, plain.array_index) = (None, None);
        let jobs = vec![
            plain,
            task(10, 1, "running", ""),
            task(11, 2, "queued", limit),
            task(12, 3, "queued", limit),
            task(13, 5, "queued", limit),
            task(14, 6, "held", "held: run `berth release <id>`"),
            task(15, 7, "held", "held: run `berth release <id>`"),
            task(16, 8, "completed", ""),
        ];
        assert_eq!(shown(jobs_lines(&jobs)), vec!["9", "10_1", "10_[2-3,5%2]", "10_[6-7%2]", "10_8"]);
        assert_eq!(
            shown(crate::compat::slurm::squeue_lines(&jobs)),
            vec!["9", "10_1", "10_[2-3,5%2]", "10_[6-7%2]", "10_8"]
        );
        assert_eq!(unfolded(&jobs).len(), jobs.len());
        // `berth jobs` keeps tasks whose reasons differ apart; squeue, which shows only the
        // reason's name, folds them.
        let two = vec![task(11, 2, "queued", "resources: a"), task(12, 3, "queued", "resources: b")];
        assert_eq!(shown(jobs_lines(&two)), vec!["10_2", "10_3"]);
        assert_eq!(shown(crate::compat::slurm::squeue_lines(&two)), vec!["10_[2-3%2]"]);
        let one = vec![task(11, 2, "queued", limit)];
        assert_eq!(jobs_lines(&one)[0].1, None, "a lone task keeps its own id");
    }

    #[test]
    fn qstat_shows_an_array_as_one_line_unless_subjobs() {
        let mut plain = task(9, 0, "running", "");
        (plain.array_job, plain.array_index) = (None, None);
        let mut jobs = vec![plain, task(10, 0, "running", ""), task(11, 1, "queued", ""), task(12, 2, "queued", "")];
        jobs[1].start_time = Some(1.0);
        let ids = |lines: &[PbsLine]| -> Vec<String> {
            lines
                .iter()
                .map(|l| match &l.array {
                    Some(a) => format!("{}[] {}", a.id, a.state),
                    None => crate::compat::pbs::pbs_job_id(l.job, "s"),
                })
                .collect()
        };
        assert_eq!(ids(&pbs_lines(&jobs, false, false)), vec!["9.s", "10[] B"]);
        assert_eq!(ids(&pbs_lines(&jobs, true, false)), vec!["9.s", "10[] B", "10[0].s", "10[1].s", "10[2].s"]);
        assert_eq!(ids(&pbs_lines(&jobs, false, true)), vec!["10[] B"]);
        let a = pbs_lines(&jobs, false, false)[1].array.clone().unwrap();
        assert_eq!((a.queued, a.running, a.expired, a.indexes), (2, 1, 0, vec![0, 1, 2]));
        // Waiting, held, and with ended subjobs not listed (the array has 5).
        let queued = [task(11, 1, "queued", ""), task(12, 2, "queued", "")];
        let refs: Vec<&JobInfo> = queued.iter().collect();
        assert_eq!(pbs_array_state(&refs, 2), 'Q');
        assert_eq!(pbs_array_state(&refs, 5), 'B');
        let held = [task(11, 1, "held", "")];
        assert_eq!(pbs_array_state(&held.iter().collect::<Vec<_>>(), 1), 'H');
        let done = [task(11, 1, "completed", ""), task(12, 2, "failed", "")];
        assert_eq!(pbs_array_state(&done.iter().collect::<Vec<_>>(), 2), 'F');
        let mut five = queued.to_vec();
        five.iter_mut().for_each(|t| t.array_count = Some(5));
        let a = pbs_lines(&five, false, false)[0].array.clone().unwrap();
        assert_eq!((a.state, a.queued, a.expired), ('B', 2, 3));
    }
}
