//! Hostile local users (issue 16, items 3 and 4): connections past the per-user cap are refused
//! with a message while root still gets in, and peers announcing 16 MiB frames they never send
//! do not grow the controller. Real daemons, real sockets; docs/protocol/00-framing.md "Limits".

mod common;
use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Opens N connections to the socket one after the other, each asking `ping`; prints `ok` (the
/// connection is kept) or `refused BODY` per connection, then `held`, and keeps the kept ones
/// open until its stdin closes. Perl: Debian's perl-base is always there, and any user runs it.
const HOLDER: &str = r#"
use strict; use IO::Socket::UNIX; use Socket;
$SIG{PIPE} = 'IGNORE'; $| = 1;
my ($path, $n) = @ARGV;
my $req = '{"v":3,"op":"ping"}';
my @held;
sub take { my ($s, $n) = @_; my $b = '';
  while (length($b) < $n) { my $r = sysread($s, $b, $n - length($b), length($b)); return undef unless $r; }
  return $b; }
for my $i (1..$n) {
  my $s = IO::Socket::UNIX->new(Type => SOCK_STREAM(), Peer => $path) or die "connect: $!";
  syswrite($s, pack("N", length $req) . $req);
  my $hdr = take($s, 4);
  if (!defined $hdr) { print "closed\n"; next; }
  my $body = take($s, unpack("N", $hdr));
  if (defined $body && $body =~ /"pong"/) { print "ok\n"; push @held, $s; } else { print "refused $body\n"; }
}
print "held\n";
<STDIN>;
"#;

fn uid_of(user: &str) -> u32 {
    let out = Command::new("id").args(["-u", user]).output().expect("id");
    String::from_utf8_lossy(&out.stdout).trim().parse().expect("the test user berthtest (scripts/test.sh creates it)")
}

fn timed_jobs(c: &Cluster) -> Duration {
    let t0 = Instant::now();
    let out = c.berth(&["jobs"]);
    let took = t0.elapsed();
    assert!(out.status.success(), "root's `berth jobs` failed: {}", String::from_utf8_lossy(&out.stderr));
    took
}

#[test]
fn a_user_past_the_per_uid_cap_is_refused_with_why_and_root_still_gets_in() {
    let c = Cluster::up_configured(1, "package:1 numa:1 core:2 pu:1", "[connections]\nmax_per_uid = 20\n");
    let uid = uid_of("berthtest");
    let socket = c.dir.join("controller.sock");
    let mut holder = Command::new("runuser")
        .args(["-u", "berthtest", "--", "perl", "-e", HOLDER])
        .arg(&socket)
        .arg("30")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("runuser perl");
    let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    let mut answers = Vec::new();
    for line in lines.by_ref() {
        let line = line.expect("the holder's output");
        if line == "held" {
            break;
        }
        answers.push(line);
    }
    let ok = answers.iter().filter(|l| *l == "ok").count();
    let refused: Vec<&String> = answers.iter().filter(|l| l.starts_with("refused")).collect();
    assert_eq!(ok, 20, "the first 20 connections are served: {answers:?}\n{}", c.logs());
    assert_eq!(refused.len(), 10, "{answers:?}");
    let why = format!("too many connections from uid {uid} (limit 20); close some");
    assert!(refused.iter().all(|l| l.contains(&why)), "{refused:?}");

    // While they are held: root gets in at once, and so does its every command.
    let slowest = (0..5).map(|_| timed_jobs(&c)).max().unwrap();
    assert!(slowest < Duration::from_secs(5), "root's `berth jobs` took {slowest:?}");
    // The user's own commands say why they cannot get in.
    let out = c.berth_as("berthtest", &["jobs"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&why), "berthtest's `berth jobs`: {err}");
    let log = std::fs::read_to_string(c.dir.join("logs").join("controller.log")).unwrap_or_else(|_| c.logs());
    assert!(log.contains("client connection refused") && log.contains(&why), "a log line: {}", c.logs());

    // Let go: the places are free again.
    drop(holder.stdin.take());
    let _ = holder.wait();
    let t0 = Instant::now();
    loop {
        let out = c.berth_as("berthtest", &["jobs"]);
        if out.status.success() {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{}", String::from_utf8_lossy(&out.stderr));
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn vm_rss_kb(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn open_fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

#[test]
fn peers_announcing_16_mib_and_sending_little_do_not_grow_the_controller() {
    // Idle local clients are closed after idle_timeout_secs: longer than a loaded machine may
    // need to open them all, so the count below sees every one at once.
    let c = Cluster::up_configured(1, "package:1 numa:1 core:2 pu:1", "[connections]\nidle_timeout_secs = 600\n");
    let pid = c.pid_of("server");
    let toml = std::fs::read_to_string(c.dir.join("berth.toml")).unwrap();
    let listen = toml
        .lines()
        .find_map(|l| l.trim().strip_prefix("listen").map(|v| v.trim_start_matches([' ', '=']).trim_matches('"')))
        .expect("listen in berth.toml")
        .to_string();
    for _ in 0..3 {
        timed_jobs(&c);
    }
    let (rss0, fds0) = (vm_rss_kb(pid), open_fds(pid));
    const UNIX: usize = 200;
    const TCP: usize = 50;
    let mut socks: Vec<Box<dyn Write>> = Vec::new();
    // Every connection accepted (a descriptor each): `want` open descriptors within a minute.
    let wait_fds = |want: usize| {
        let t0 = Instant::now();
        while open_fds(pid) < want {
            assert!(t0.elapsed() < Duration::from_secs(60), "{} of {want} fds\n{}", open_fds(pid), c.logs());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    for _ in 0..UNIX {
        let mut s = UnixStream::connect(c.dir.join("controller.sock")).unwrap();
        s.write_all(&(16u32 << 20).to_be_bytes()).unwrap();
        s.write_all(&[b'{'; 1000]).unwrap();
        socks.push(Box::new(s));
    }
    wait_fds(fds0 + UNIX);
    // Agent-port peers last: an unregistered peer is closed after the 10 s handshake limit.
    for _ in 0..TCP {
        // Under the registration limit (1 MiB), so the read goes on, waiting for the rest.
        let mut s = std::net::TcpStream::connect(&listen).unwrap();
        s.write_all(&((1u32 << 20) - 1).to_be_bytes()).unwrap();
        s.write_all(&[b'{'; 1000]).unwrap();
        socks.push(Box::new(s));
    }
    wait_fds(fds0 + UNIX + TCP);
    // Then a request through the state thread.
    let took = timed_jobs(&c);
    assert!(took < Duration::from_secs(5), "`berth jobs` took {took:?} among hostile peers");
    let rss1 = vm_rss_kb(pid);
    let grown = rss1.saturating_sub(rss0);
    eprintln!("controller VmRSS {rss0} kB -> {rss1} kB with {UNIX}+{TCP} peers announcing 16 MiB / 1 MiB");
    assert!(
        grown < 12 * 1024,
        "the controller grew by {grown} kB for {} peers that sent 1 KB each (16 MiB announced)",
        UNIX + TCP
    );
    // A frame over the unidentified agent's limit is refused at once, with why.
    let mut s = std::net::TcpStream::connect(&listen).unwrap();
    s.write_all(&(16u32 << 20).to_be_bytes()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(
        c.logs().contains("larger than the 1048576-byte limit before authentication"),
        "refused and logged: {}",
        c.logs()
    );
    drop(socks);
}

#[test]
fn idle_clients_are_closed_but_a_running_step_keeps_its_connection() {
    let c = Cluster::up_configured(1, "package:1 numa:1 core:2 pu:1", "[connections]\nidle_timeout_secs = 2\n");
    // Silent: answered why, then closed.
    let mut s = UnixStream::connect(c.dir.join("controller.sock")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got);
    assert!(text.contains("closed after 2 s without a request"), "{text:?}");
    // `berth run` holds its connection, silent, for the whole step: not cut.
    let out = c.berth(&["run", "-n", "1", "sh", "-c", "sleep 5; echo done"]);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("done"),
        "{}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        c.logs()
    );
}
