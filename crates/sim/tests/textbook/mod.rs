//! Textbook EASY backfill (Lifka 1995; as stated by Mu'alem and Feitelson, "Utilization,
//! predictability, workloads, and user runtime estimates in scheduling the IBM SP2 with
//! backfilling", IEEE TPDS 2001) on P interchangeable processors: an oracle written apart from
//! berth's scheduler, sharing nothing with it but the job list. Used by `tests/textbook_easy.rs`
//! and by `berth-bench easy-oracle` (which includes this file).
//!
//! At every event time (every job ending then has left, every job submitted then has joined):
//! 1. jobs start in submit order while the first one fits the free processors;
//! 2. the first job that does not fit gets the *shadow time*: the earliest estimated end of a
//!    running job at which, with every job ending by then gone, enough processors are free;
//!    the *extra* processors are those free then beyond what it needs;
//! 3. every later job, in order, starts if it fits the free processors now and either ends
//!    (by its estimate) by the shadow time, or needs no more than the extra processors (which
//!    it then uses up).

/// One job: submit time, run time, the estimate the scheduler plans with (a job running past
/// it counts as ending any moment now), processors.
#[derive(Debug, Clone, Copy)]
pub struct Job {
    pub submit: f64,
    pub run: f64,
    pub estimate: f64,
    pub procs: u64,
}

/// A running job: when it ends, when it is estimated to end, its processors.
struct Running {
    end: f64,
    estimated: f64,
    procs: u64,
}

/// Start time of each job of `jobs` (sorted by submit time; ties in the given order) on `p`
/// processors. Every job must need at most `p`.
pub fn easy(jobs: &[Job], p: u64) -> Vec<f64> {
    let mut start = vec![f64::NAN; jobs.len()];
    let (mut queue, mut running): (Vec<usize>, Vec<Running>) = (vec![], vec![]);
    let (mut free, mut next) = (p, 0);
    loop {
        let next_end = running.iter().map(|r| r.end).fold(f64::INFINITY, f64::min);
        let t = jobs.get(next).map_or(next_end, |j| j.submit.min(next_end));
        if t == f64::INFINITY {
            return start;
        }
        free += running.iter().filter(|r| r.end <= t).map(|r| r.procs).sum::<u64>();
        running.retain(|r| r.end > t);
        while next < jobs.len() && jobs[next].submit <= t {
            queue.push(next);
            next += 1;
        }
        let mut run = |i: usize, free: &mut u64, running: &mut Vec<Running>| {
            start[i] = t;
            *free -= jobs[i].procs;
            running.push(Running { end: t + jobs[i].run, estimated: t + jobs[i].estimate, procs: jobs[i].procs });
        };
        while let Some(&i) = queue.first().filter(|&&i| jobs[i].procs <= free) {
            run(i, &mut free, &mut running);
            queue.remove(0);
        }
        let Some(&head) = queue.first() else { continue };
        // Shadow time and extra processors, from the estimated ends (overdue ones: now).
        let mut ends: Vec<(f64, u64)> = running.iter().map(|r| (r.estimated.max(t), r.procs)).collect();
        ends.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (mut avail, mut shadow, mut k) = (free, t, 0);
        while avail < jobs[head].procs {
            shadow = ends[k].0;
            while k < ends.len() && ends[k].0 == shadow {
                avail += ends[k].1;
                k += 1;
            }
        }
        let mut extra = avail - jobs[head].procs;
        let mut later = vec![head];
        for &i in &queue[1..] {
            let (procs, short) = (jobs[i].procs, t + jobs[i].estimate <= shadow);
            if procs <= free && (short || procs <= extra) {
                run(i, &mut free, &mut running);
                if !short {
                    extra -= procs;
                }
            } else {
                later.push(i);
            }
        }
        queue = later;
    }
}

/// xorshift64*: deterministic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A random SWF trace: `p` processors, `n` jobs of mostly small sizes (some near the machine),
/// run times 1 s - 3 h, requested times from half to 3 times the run time (some jobs run past
/// theirs), submissions bunched (many at the same second) so queues form.
pub fn random_trace(seed: u64, p: u64, n: usize) -> String {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut text = format!("; MaxProcs: {p}\n");
    let mut submit = 0;
    for id in 1..=n {
        let gap = [0, 0, 1, 30, 600][rng.below(5) as usize];
        submit += gap * rng.below(3);
        let procs = match rng.below(10) {
            0..=5 => 1 + rng.below(p.div_ceil(8)),
            6..=8 => 1 + rng.below(p / 2),
            _ => p / 2 + rng.below(p / 2 + 1),
        };
        let longest = [60, 3_600, 10_800][rng.below(3) as usize];
        let run = 1 + rng.below(longest);
        let requested = run * [2, 2, 2, 3, 4, 6, 1][rng.below(7) as usize] / 2;
        text += &format!("{id} {submit} -1 {run} {procs} -1 -1 {procs} {requested} -1 1 1 1 -1 1 -1 -1 -1\n");
    }
    text
}
