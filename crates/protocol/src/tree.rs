//! The control tree's shape and timing, shared by `berth run` and the agents' shepherds:
//! how a subtree is split among children, how long a subtree may stay silent after the
//! launch, and the TCP keepalive every tree connection uses (docs/protocol/03-control-tree.md).

use crate::auth::{read_sealed, Opener};
use crate::step::TreeUp;
use crate::ProtocolError;
use std::time::Duration;
use tokio::io::AsyncRead;
use tokio::net::TcpStream;

/// Per level of the tree, how long a subtree may take after the launch to say anything (a node
/// waits up to JOB_WAIT for its part of the job): a subtree silent longer is hung (a stopped
/// agent, a frozen node: its TCP stack still acks), and is lost.
pub const LAUNCH_STEP: Duration = Duration::from_secs(12);

/// How many levels a subtree of `n` nodes spans with `fanout` (0: flat), as `groups` splits it.
pub fn tree_depth(n: usize, fanout: u32) -> u32 {
    if n <= 1 {
        return n as u32;
    }
    let rest = n - 1;
    let k = if fanout == 0 { rest } else { (fanout as usize).min(rest) };
    1 + tree_depth(rest.div_ceil(k), fanout)
}

/// How long the shepherd (or `run`) above a subtree of `n` nodes waits for its first message:
/// one step more than any shepherd inside it waits, so a hung node is reported by its parent.
pub fn launch_deadline(n: usize, fanout: u32) -> Duration {
    LAUNCH_STEP * tree_depth(n, fanout)
}

/// The next message from a subtree, checked with `opener`; while it has `answered` nothing,
/// it must within `deadline` (else `None`: the subtree is hung).
pub async fn read_up<R: AsyncRead + Unpin>(
    rd: &mut R,
    opener: &mut Opener,
    answered: bool,
    deadline: Duration,
) -> Option<Result<Option<TreeUp>, ProtocolError>> {
    if answered {
        return Some(read_sealed(rd, opener).await);
    }
    tokio::time::timeout(deadline, read_sealed(rd, opener)).await.ok()
}

/// Tree connections carry no traffic while ranks compute: TCP keepalive (probe after 2 s
/// idle, every 1 s, 3 misses) notices a dead peer or a cut link within ~5 s.
pub fn keepalive(stream: &TcpStream) {
    use std::os::fd::AsRawFd;
    let fd = stream.as_raw_fd();
    for (level, opt, value) in [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 2),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3),
        // Unacknowledged data (output going up a cut link) gives up after 5 s too.
        (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, 5000),
    ] {
        let v: libc::c_int = value;
        // SAFETY: setsockopt on a socket we own with a properly sized int.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                opt,
                &v as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
}

/// Split `rest` into at most `fanout` contiguous groups of near-equal size (0 = flat).
pub fn groups(rest: &[u32], fanout: u32) -> Vec<Vec<u32>> {
    if rest.is_empty() {
        return vec![];
    }
    let k = if fanout == 0 { rest.len() } else { (fanout as usize).min(rest.len()) };
    let (base, extra) = (rest.len() / k, rest.len() % k);
    let mut out = Vec::with_capacity(k);
    let mut at = 0;
    for i in 0..k {
        let len = base + usize::from(i < extra);
        out.push(rest[at..at + len].to_vec());
        at += len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::groups;

    #[test]
    fn a_parent_waits_one_launch_step_more_than_anything_below_it() {
        use super::{launch_deadline, tree_depth, LAUNCH_STEP};
        assert_eq!(tree_depth(0, 8), 0);
        assert_eq!(tree_depth(1, 8), 1);
        assert_eq!(tree_depth(9, 8), 2);
        assert_eq!(tree_depth(10, 8), 3);
        assert_eq!(tree_depth(64, 0), 2, "flat");
        assert_eq!(tree_depth(64, 2), 7, "64, 32, 16, 8, 4, 2, 1 nodes per level");
        assert_eq!(launch_deadline(3, 8), LAUNCH_STEP * 2);
        // For every split, the deadline of a group exceeds those of the groups inside it.
        for fanout in [0u32, 2, 3, 8, 32] {
            for n in 2..200usize {
                let rest: Vec<u32> = (1..n as u32).collect();
                for g in groups(&rest, fanout) {
                    assert!(launch_deadline(n, fanout) > launch_deadline(g.len(), fanout), "{n} {fanout}");
                }
            }
        }
    }

    #[test]
    fn groups_split_evenly_and_flat_is_one_per_node() {
        let rest: Vec<u32> = (1..=10).collect();
        assert_eq!(groups(&rest, 3), vec![vec![1, 2, 3, 4], vec![5, 6, 7], vec![8, 9, 10]]);
        assert_eq!(groups(&rest, 0).len(), 10);
        assert_eq!(groups(&rest, 32).len(), 10);
        assert_eq!(groups(&[], 8), Vec::<Vec<u32>>::new());
        assert_eq!(groups(&[4, 5], 2), vec![vec![4], vec![5]]);
    }
}
