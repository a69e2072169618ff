//! Priority order and per-user limits: which queued jobs the pass sees, in which order.

use super::{RoundInput, RoundMachine, UserKey};
use crate::sched::backfill::{QueuedJob, Waiting};
use crate::sched::fairshare::FairShare;
use crate::sched::priority::{priority, Priority, PriorityInput};
use crate::sched::queue::user_limit_reason;
use crate::JobId;
use std::borrow::Cow;

pub(super) struct Ordered {
    /// Indices into the input queue, highest priority first (None: as given).
    pub order: Option<Vec<usize>>,
    pub priorities: Vec<(JobId, Priority)>,
}

/// The queue's priority order: highest total first, then earlier submission, then lower id.
/// `charged`: the fair-share usage after this round's charges, whose factors replace those
/// given (with [`RoundInput::usage`]).
pub(super) fn ordered<M: RoundMachine>(input: &RoundInput<M>, charged: Option<&FairShare>, now: f64) -> Ordered {
    let Some(p) = &input.priority else { return Ordered { order: None, priorities: vec![] } };
    let accounts = input.usage.map(|u| u.accounts);
    let totals: Vec<Priority> = p
        .jobs
        .iter()
        .enumerate()
        .map(|(i, j)| {
            let refactored;
            let job = match (charged, accounts.and_then(|a| a.get(i))) {
                (Some(share), Some(account)) => {
                    refactored = PriorityInput { fair_share_factor: share.factor(account), ..j.input.clone() };
                    &refactored
                }
                _ => &j.input,
            };
            let mut total = priority(p.weights, job, now, p.machine_cpus.max(1));
            if let Some(admin) = j.admin {
                total.total = admin;
            }
            total
        })
        .collect();
    let mut order: Vec<usize> = (0..input.queue.len()).collect();
    let submit = |i: usize| p.jobs[i].input.submit_time;
    order.sort_by(|&a, &b| {
        totals[b]
            .total
            .total_cmp(&totals[a].total)
            .then(submit(a).total_cmp(&submit(b)))
            .then(input.queue[a].id.cmp(&input.queue[b].id))
    });
    let priorities = input.queue.iter().zip(totals).map(|(q, t)| (q.id, t)).collect();
    Ordered { order: Some(order), priorities }
}

/// The queue in `order`, without the jobs barred or held by a per-user limit (returned as
/// waiting, with their reason). Jobs ahead of one count as started for its user's total, and
/// so do the jobs resumed in this round (`resumed`: whose, how many cores).
pub(super) fn limited<'a, M: RoundMachine>(
    input: &RoundInput<'a, M>,
    order: &Option<Vec<usize>>,
    resumed: &[(UserKey, u64)],
) -> (Cow<'a, [QueuedJob]>, Vec<Waiting>) {
    let barred = input.barred.filter(|b| !b.is_empty());
    if input.user_limits.is_none() && barred.is_none() {
        return match order {
            None => (Cow::Borrowed(input.queue), vec![]),
            Some(order) => (Cow::Owned(order.iter().map(|&i| input.queue[i].clone()).collect()), vec![]),
        };
    }
    let indices: Box<dyn Iterator<Item = usize>> = match order {
        Some(order) => Box::new(order.iter().copied()),
        None => Box::new(0..input.queue.len()),
    };
    let mut used = input.user_limits.map(|l| l.running.clone()).unwrap_or_default();
    for (key, cores) in resumed {
        *used.entry(key.clone()).or_default() += cores;
    }
    let (mut queue, mut held) = (Vec::with_capacity(input.queue.len()), vec![]);
    for i in indices {
        let q = &input.queue[i];
        if let Some(reason) = barred.and_then(|b| b.get(&q.id)) {
            held.push(Waiting { id: q.id, reason: reason.clone(), expected_start: None });
            continue;
        }
        // A queue dropped from the config keeps its jobs running, without limits.
        let Some((spec, key)) = input.user_limits.and_then(|l| l.jobs[i].as_ref()) else {
            queue.push(q.clone());
            continue;
        };
        if spec.max_cores_per_user.is_none() || q.held {
            queue.push(q.clone());
            continue;
        }
        let used = used.entry(key.clone()).or_default();
        let cores = q.request.total_cpus();
        match user_limit_reason(spec, *used, cores) {
            Some(reason) => held.push(Waiting { id: q.id, reason, expected_start: None }),
            None => {
                *used += cores;
                queue.push(q.clone());
            }
        }
    }
    (Cow::Owned(queue), held)
}
