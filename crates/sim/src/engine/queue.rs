//! The pending queue as the simulator keeps it: a vector whose started front is dropped by
//! moving an offset (starts are mostly at the front), compacted now and then, so a pass that
//! starts a few jobs of a long queue does not shift the whole queue.

use berth_core::sched::backfill::QueuedJob;
use std::collections::BTreeMap;

#[derive(Debug, Default)]
pub(super) struct Queue {
    jobs: Vec<QueuedJob>,
    /// Entries before this one have started.
    head: usize,
    /// Processors of the queued jobs, as a multiset: the smallest job decides whether a pass
    /// can start anything at all.
    procs: BTreeMap<u64, usize>,
}

impl Queue {
    pub fn len(&self) -> usize {
        self.jobs.len() - self.head
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The queue in submit order (the round orders it by priority when fair share is on).
    pub fn jobs(&self) -> &[QueuedJob] {
        &self.jobs[self.head..]
    }

    pub fn push(&mut self, job: QueuedJob, procs: u64) {
        *self.procs.entry(procs).or_default() += 1;
        self.jobs.push(job);
    }

    /// The fewest processors any queued job needs.
    pub fn smallest(&self) -> Option<u64> {
        self.procs.keys().next().copied()
    }

    /// The most processors any queued job needs.
    pub fn largest(&self) -> Option<u64> {
        self.procs.keys().next_back().copied()
    }

    /// Drop the `count` jobs that `started` marks; `procs` gives each job's processors.
    pub fn remove_started(&mut self, started: &[bool], count: usize, procs: impl Fn(usize) -> u64) {
        for q in self.jobs[self.head..].iter().filter(|q| started[q.id.0 as usize]).take(count) {
            let p = procs(q.id.0 as usize);
            if let Some(n) = self.procs.get_mut(&p) {
                *n -= 1;
                if *n == 0 {
                    self.procs.remove(&p);
                }
            }
        }
        let front = self.jobs[self.head..].iter().take_while(|q| started[q.id.0 as usize]).count();
        self.head += front;
        if front < count {
            // Some started further back (backfill): one pass over the queue removes them.
            self.jobs.drain(..self.head);
            self.head = 0;
            self.jobs.retain(|q| !started[q.id.0 as usize]);
        } else if self.head > 1024 && self.head * 2 > self.jobs.len() {
            self.jobs.drain(..self.head);
            self.head = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_core::job::Shape;
    use berth_core::placement::JobRequest;
    use berth_core::JobId;

    fn job(id: u64) -> QueuedJob {
        let request = JobRequest::simple(Shape::Total { cores: 1, chunk: 1 }, 0);
        QueuedJob { id: JobId(id), request, walltime: 1.0, held: false }
    }

    #[test]
    fn front_and_middle_starts() {
        let mut q = Queue::default();
        for i in 0..6 {
            q.push(job(i), i + 1);
        }
        assert_eq!((q.smallest(), q.largest()), (Some(1), Some(6)));
        let mut started = vec![false; 6];
        started[0] = true;
        started[1] = true;
        q.remove_started(&started, 2, |i| i as u64 + 1);
        assert_eq!(q.jobs().iter().map(|j| j.id.0).collect::<Vec<_>>(), vec![2, 3, 4, 5]);
        assert_eq!(q.smallest(), Some(3));
        started[4] = true;
        q.remove_started(&started, 1, |i| i as u64 + 1);
        assert_eq!(q.jobs().iter().map(|j| j.id.0).collect::<Vec<_>>(), vec![2, 3, 5]);
        assert_eq!((q.len(), q.smallest()), (3, Some(3)));
    }
}
