//! Steps this agent starts from a job's launch order (an interactive allocation's one step, on
//! its first node: `LaunchSpec::step`) and the `berth run` that attaches to them.
//!
//! The controller sends the launch order as soon as the allocation's commit is written, and
//! replies to `run` only once it is synced; `run` then connects here. Starting the ranks
//! from the order takes that wait, and `run`'s connection, off the launch: the step's upward
//! frames (started, output, exits) queue until `run` attaches its control-tree connection
//! (docs/protocol/01-client.md, "An interactive step starts from its launch order"). A step
//! nobody attaches to within [`ATTACH_WAIT`] is killed, as if its upstream connection broke.
//! Such a step is started by [`crate::step::launch::start_from_order`].

use berth_core::JobId;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{oneshot, Notify};

/// `run`'s control-tree connection.
pub type Connection = (OwnedReadHalf, OwnedWriteHalf);

/// How long a step started from its launch order waits for `run`, and how long `run` waits
/// for that order to arrive here (it is sent before `run`'s grant, on another connection).
/// Long enough for a controller whose disk syncs slowly (`run` has its grant only after the
/// sync); a `run` that dies before attaching closes its controller connection, which ends the
/// allocation, and so the ranks, at once.
pub const ATTACH_WAIT: Duration = Duration::from_secs(30);

/// How long the end of a step nobody attached to is remembered (to tell a late `run` why).
const KEEP_ENDED: Duration = Duration::from_secs(60);

enum Slot {
    /// Started (or starting): its shepherd waits on the other end.
    Waiting(oneshot::Sender<Connection>),
    /// It could not start, or its job ended, before `run` attached: why.
    Ended(String),
    /// `run` attached.
    Taken,
}

/// Steps started here from launch orders, by (job, step).
#[derive(Default)]
pub struct Attachments {
    slots: Mutex<HashMap<(JobId, u32), (Instant, Slot)>>,
    changed: Notify,
}

/// Why an attach was refused, with the connection back (to answer on it).
pub struct Refused {
    pub up: Connection,
    pub reason: String,
}

impl Attachments {
    fn put(&self, key: (JobId, u32), slot: Slot) {
        if let Ok(mut slots) = self.slots.lock() {
            slots.retain(|_, (at, s)| !matches!(s, Slot::Ended(_) | Slot::Taken) || at.elapsed() < KEEP_ENDED);
            slots.insert(key, (Instant::now(), slot));
        }
        self.changed.notify_waiters();
    }

    /// A step starting here from its launch order: where its shepherd receives `run`'s
    /// connection.
    pub fn expect(&self, job: JobId, step: u32) -> oneshot::Receiver<Connection> {
        let (tx, rx) = oneshot::channel();
        self.put((job, step), Slot::Waiting(tx));
        rx
    }

    /// The step's job ended here (or never started: `reason`). A `run` that has not attached
    /// yet is told why; an attached step is not affected.
    pub fn job_ended(&self, job: JobId, step: u32, reason: String) {
        let attached = self.slots.lock().ok().is_some_and(|s| matches!(s.get(&(job, step)), Some((_, Slot::Taken))));
        if !attached {
            self.put((job, step), Slot::Ended(reason));
        }
    }

    /// Give `run`'s connection to the step's shepherd, waiting up to `wait` for the step to be
    /// started here. Once only: a second attach (a replayed grant) is refused.
    pub async fn attach(&self, job: JobId, step: u32, up: Connection, wait: Duration) -> Result<(), Refused> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.changed.notified();
            let taken = self.slots.lock().ok().and_then(|mut slots| {
                let (_, slot) = slots.get_mut(&(job, step))?;
                match std::mem::replace(slot, Slot::Taken) {
                    Slot::Waiting(tx) => Some(Ok(tx)),
                    Slot::Ended(reason) => Some(Err(reason)),
                    Slot::Taken => {
                        Some(Err(format!("step {job}.{step} already has its `berth run` (a replayed grant?)")))
                    }
                }
            });
            match taken {
                Some(Ok(tx)) => {
                    return tx.send(up).map_err(|up| Refused {
                        up,
                        reason: format!("step {job}.{step} has ended here: nobody attached to it in time"),
                    })
                }
                Some(Err(reason)) => return Err(Refused { up, reason }),
                None => {}
            }
            let timed_out = tokio::time::timeout_at(deadline, notified).await.is_err();
            // One last look after the deadline: the order may have come with it.
            if timed_out && !self.slots.lock().ok().is_some_and(|s| s.contains_key(&(job, step))) {
                let reason = format!("step {job}.{step} was not started on this node (no launch order for it arrived)");
                return Err(Refused { up, reason });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::{TcpListener, TcpStream};

    async fn connection() -> (Connection, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (a, b) = tokio::join!(TcpStream::connect(addr), l.accept());
        (a.unwrap().into_split(), b.unwrap().0)
    }

    #[tokio::test]
    async fn run_attaches_once_whether_it_comes_before_or_after_the_order() {
        let a = std::sync::Arc::new(Attachments::default());
        // After: the shepherd gets the connection.
        let rx = a.expect(JobId(1), 1);
        let (up, _peer) = connection().await;
        assert!(a.attach(JobId(1), 1, up, Duration::from_secs(1)).await.is_ok());
        assert!(rx.await.is_ok(), "the shepherd received run's connection");
        // A second attach with the same grant is refused.
        let (up, _peer2) = connection().await;
        let r = a.attach(JobId(1), 1, up, Duration::from_secs(1)).await.expect_err("refused");
        assert!(r.reason.contains("already has its `berth run`"), "{}", r.reason);
        // Before: the attach waits for the order.
        let (up, _peer3) = connection().await;
        let waiting = tokio::spawn({
            let a = a.clone();
            async move { a.attach(JobId(2), 1, up, Duration::from_secs(5)).await.is_ok() }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let rx = a.expect(JobId(2), 1);
        assert!(waiting.await.unwrap(), "the early attach waited for the order");
        assert!(rx.await.is_ok());
    }

    #[tokio::test]
    async fn a_step_that_never_started_or_ended_unattached_says_why() {
        let a = Attachments::default();
        a.job_ended(JobId(3), 1, "cannot create the job's cgroup: EBUSY".into());
        let (up, _peer) = connection().await;
        let r = a.attach(JobId(3), 1, up, Duration::from_secs(1)).await.expect_err("refused");
        assert!(r.reason.contains("EBUSY"), "{}", r.reason);
        // A shepherd that gave up waiting (receiver dropped): a late attach is refused.
        drop(a.expect(JobId(4), 1));
        let (up, _peer) = connection().await;
        let r = a.attach(JobId(4), 1, up, Duration::from_secs(1)).await.expect_err("refused");
        assert!(r.reason.contains("has ended"), "{}", r.reason);
        // No order at all: refused after the wait.
        let (up, _peer) = connection().await;
        let r = a.attach(JobId(5), 1, up, Duration::from_millis(30)).await.expect_err("refused");
        assert!(r.reason.contains("was not started"), "{}", r.reason);
        // An attached step is not marked ended by its job's end.
        let _rx = a.expect(JobId(6), 1);
        let (up, _peer) = connection().await;
        assert!(a.attach(JobId(6), 1, up, Duration::from_secs(1)).await.is_ok());
        a.job_ended(JobId(6), 1, "job ended".into());
        let (up, _peer) = connection().await;
        let r = a.attach(JobId(6), 1, up, Duration::from_secs(1)).await.expect_err("refused");
        assert!(r.reason.contains("already has"), "{}", r.reason);
    }
}
