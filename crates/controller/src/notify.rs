//! Job notifications (`--mail-type`/`--mail-user`, PBS `-m`/`-M`) through a hook command.
//!
//! berth sends no mail itself: the controller's `[notify] command` (an absolute path) is run
//! for each event a job asked for, as `COMMAND EVENT JOB_ID MAIL_USER`, never through a
//! shell, with the details in its environment (`BERTH_NOTIFY_*`, below). It runs in its own
//! thread with its standard streams on /dev/null and is killed after `timeout_secs`; a hook
//! that cannot start, fails or times out is logged and never holds up scheduling. With no
//! command configured the events are recorded with the job only (`berth show`).

use crate::config::NotifyConfig;
use crate::model::job::JobRecord;
use berth_core::job::JobState;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// An event a job may be notified of (Slurm's `--mail-type` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Begin,
    End,
    Fail,
    Requeue,
}

impl Event {
    pub fn as_str(self) -> &'static str {
        match self {
            Event::Begin => "BEGIN",
            Event::End => "END",
            Event::Fail => "FAIL",
            Event::Requeue => "REQUEUE",
        }
    }
}

/// The event a job's end is notified as, if it asked for one: `FAIL` for a job that did not
/// complete when it asked for FAIL, else `END` when it asked for END.
pub fn end_event(job: &JobRecord) -> Option<Event> {
    let m = job.options.mail_type?;
    if !job.state.is_finished() {
        return None;
    }
    let failed = job.state != JobState::Completed;
    if failed && m.fail {
        Some(Event::Fail)
    } else if m.end {
        Some(Event::End)
    } else {
        None
    }
}

/// Whether `job` asked to be notified of `event`.
pub fn wants(job: &JobRecord, event: Event) -> bool {
    job.options.mail_type.is_some_and(|m| match event {
        Event::Begin => m.begin,
        Event::End => m.end,
        Event::Fail => m.fail,
        Event::Requeue => m.requeue,
    })
}

/// The hook's command line and environment for `event` of `job`.
pub fn invocation(job: &JobRecord, event: Event) -> (Vec<String>, Vec<(String, String)>) {
    let mail_user = job.options.mail_user.clone().unwrap_or_else(|| job.user.name.clone());
    let args = vec![event.as_str().to_string(), job.id.to_string(), mail_user.clone()];
    let env = [
        ("BERTH_NOTIFY_EVENT", event.as_str().to_string()),
        ("BERTH_NOTIFY_JOB_ID", job.id.to_string()),
        ("BERTH_NOTIFY_JOB_NAME", job.name.clone()),
        ("BERTH_NOTIFY_USER", job.user.name.clone()),
        ("BERTH_NOTIFY_STATE", job.state.as_str().to_string()),
        ("BERTH_NOTIFY_EXIT_CODE", job.exit_code.map(|c| c.to_string()).unwrap_or_default()),
        ("BERTH_NOTIFY_MAIL_USER", mail_user),
    ];
    (args, env.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

static RUNNING: AtomicUsize = AtomicUsize::new(0);

/// Run the hook for `event` of `job` if the job asked for it and a hook is configured; returns
/// at once (the hook runs in a thread of its own).
pub fn notify(cfg: &NotifyConfig, job: &JobRecord, event: Event) {
    if !wants(job, event) {
        return;
    }
    let Some(command) = cfg.command.clone() else { return };
    let (args, env) = invocation(job, event);
    let id = job.id;
    if RUNNING.fetch_add(1, Ordering::SeqCst) >= cfg.max_running {
        RUNNING.fetch_sub(1, Ordering::SeqCst);
        tracing::warn!(job = %id, event = event.as_str(), "notify hook not run: {} already running", cfg.max_running);
        return;
    }
    let timeout = Duration::from_secs_f64(cfg.timeout_secs);
    let spawned = std::thread::Builder::new().name("notify".into()).spawn(move || {
        if let Err(e) = run(&command, &args, &env, timeout) {
            tracing::warn!(job = %id, event = args[0].as_str(), "notify hook {}: {e}", command.display());
        }
        RUNNING.fetch_sub(1, Ordering::SeqCst);
    });
    if let Err(e) = spawned {
        RUNNING.fetch_sub(1, Ordering::SeqCst);
        tracing::warn!(job = %id, "notify hook not run: cannot start a thread: {e}");
    }
}

/// Run `command args` with `env` added, no shell, no input or output; killed after `timeout`.
pub fn run(
    command: &std::path::Path,
    args: &[String],
    env: &[(String, String)],
    timeout: Duration,
) -> Result<(), String> {
    use std::process::{Command, Stdio};
    let mut child = Command::new(command)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start: {e}"))?;
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => return Err(format!("ended with {status}")),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("killed after {} s", timeout.as_secs_f64()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("lost track of it: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::testkit::*;
    use berth_core::directives::{Export, MailTypes, SignalSpec, SubmitOptions};
    use berth_core::job::{JobOutcome, JobState};
    use berth_core::JobId;
    use berth_protocol::agent::{AgentMessage, ControllerMessage};
    use berth_protocol::client::{ClientRequest, ClientResponse, ErrorCode, SubmitRequest};
    use std::os::unix::fs::PermissionsExt;

    fn opts() -> SubmitOptions {
        SubmitOptions { cores: Some(1), walltime: Some(600), mem: Some(1 << 20), ..Default::default() }
    }

    fn submit(h: &mut Harness, options: SubmitOptions, env: Vec<(String, String)>) -> ClientResponse {
        h.call(
            ClientRequest::Submit(Box::new(SubmitRequest {
                script: "#!/bin/sh\ntrue\n".into(),
                script_name: "job.sh".into(),
                options,
                env,
                cwd: "/home/ann/run".into(),
                hold: false,
                ignore_unsupported: false,
            })),
            &ann(),
        )
    }

    fn id_of(r: ClientResponse) -> JobId {
        match r {
            ClientResponse::Submitted { id } => id,
            other => panic!("not submitted: {other:?}"),
        }
    }

    fn end(h: &mut Harness, id: JobId, exit_code: i32) {
        let node = h.ctl.jobs[&id].allocation[0].node_id.0 as usize;
        h.agent(
            node,
            AgentMessage::JobEnded { id, outcome: JobOutcome { exit_code: Some(exit_code), ..Default::default() } },
        );
        h.ctl.schedule(h.now).unwrap();
    }

    #[test]
    fn comment_workdir_export_signal_are_kept_and_sent() {
        let mut h = Harness::new(1);
        let o = SubmitOptions {
            comment: Some("run 3 of 5".into()),
            chdir: Some("sub/dir".into()),
            output: Some("o-%j.txt".into()),
            export: Some(Export::parse_slurm("NONE,FOO=bar").unwrap()),
            signal: Some(SignalSpec { signal: 10, secs: 3, batch_only: false }),
            mail_type: Some(MailTypes { end: true, ..Default::default() }),
            mail_user: Some("ann@x.org".into()),
            ..opts()
        };
        let env = vec![("PATH".to_string(), "/bin".to_string()), ("FOO".to_string(), "old".to_string())];
        let id = id_of(submit(&mut h, o, env));
        let job = &h.ctl.jobs[&id];
        assert_eq!(*job.env, vec![("FOO".to_string(), "bar".to_string())], "--export=NONE,FOO=bar");
        assert_eq!(job.options.chdir.as_deref(), Some("/home/ann/run/sub/dir"));
        assert_eq!(job.stdout, format!("/home/ann/run/sub/dir/o-{id}.txt"), "outputs from the working directory");
        assert_eq!(job.cwd, "/home/ann/run", "the submit directory stays");
        h.ctl.schedule(h.now).unwrap();
        let launch = h.sent().into_iter().find_map(|(_, m)| match m {
            ControllerMessage::Launch(spec) => Some(spec),
            _ => None,
        });
        let spec = launch.expect("a launch");
        assert_eq!(spec.workdir.as_deref(), Some("/home/ann/run/sub/dir"));
        assert_eq!(spec.cwd, "/home/ann/run");
        assert_eq!(spec.early_signal, Some(SignalSpec { signal: 10, secs: 3, batch_only: false }));
        // Persisted: a restarted controller shows them.
        let mut h = h.restart();
        let ClientResponse::Job { job } = h.call(ClientRequest::ShowJob { id }, &ann()) else { panic!() };
        assert_eq!(job.comment.as_deref(), Some("run 3 of 5"));
        assert_eq!(job.work_dir.as_deref(), Some("/home/ann/run/sub/dir"));
        assert_eq!(job.mail_type.as_deref(), Some("END"));
        assert_eq!(job.mail_user.as_deref(), Some("ann@x.org"));
        assert_eq!(job.early_signal.as_deref(), Some("10@3"));
    }

    #[test]
    fn qos_maps_onto_a_queue_of_that_name() {
        let mut h = Harness::with_config(1, |c| {
            let mut high = c.queues[0].clone();
            high.name = "high".into();
            c.queues.push(high);
        });
        let id = id_of(submit(&mut h, SubmitOptions { qos: Some("high".into()), ..opts() }, vec![]));
        assert_eq!(h.ctl.jobs[&id].queue, "high");
        let id = id_of(submit(&mut h, SubmitOptions { qos: Some("normal".into()), ..opts() }, vec![]));
        assert_eq!(h.ctl.jobs[&id].queue, h.ctl.cfg.default_queue());
        let ClientResponse::Error(error) = submit(&mut h, SubmitOptions { qos: Some("gold".into()), ..opts() }, vec![])
        else {
            panic!("a QOS that is no queue is refused")
        };
        assert_eq!(error.code, ErrorCode::BadRequest);
        assert!(
            error.message.contains("QOS gold does not exist") && error.message.contains("high"),
            "{}",
            error.message
        );
        let both = SubmitOptions { qos: Some("high".into()), queue: Some("batch".into()), ..opts() };
        let ClientResponse::Error(error) = submit(&mut h, both, vec![]) else { panic!("qos and queue disagree") };
        assert!(error.message.contains("give one of them"), "{}", error.message);
    }

    fn read_until(path: &std::path::Path, lines: usize) -> Vec<String> {
        for _ in 0..250 {
            let got: Vec<String> =
                std::fs::read_to_string(path).unwrap_or_default().lines().map(String::from).collect();
            if got.len() >= lines {
                return got;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::fs::read_to_string(path).unwrap_or_default().lines().map(String::from).collect()
    }

    #[test]
    fn the_hook_is_called_on_begin_end_and_fail() {
        let tmp = tempfile::tempdir().unwrap();
        let log = tmp.path().join("log");
        let hook = tmp.path().join("hook.sh");
        std::fs::write(
            &hook,
            format!(
                "#!/bin/sh\necho \"$1 $2 $3 $BERTH_NOTIFY_JOB_NAME $BERTH_NOTIFY_USER $BERTH_NOTIFY_STATE [$BERTH_NOTIFY_EXIT_CODE]\" >> {}\n",
                log.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut h = Harness::with_config(2, |c| c.notify.command = Some(hook.clone()));
        let all = SubmitOptions { mail_type: Some(MailTypes::parse_slurm("ALL").unwrap()), ..opts() };
        let a = h.batch(all, &ann());
        assert_eq!(read_until(&log, 1), vec![format!("BEGIN {a} ann job.sh ann running []")]);
        end(&mut h, a, 3);
        let got = read_until(&log, 2);
        assert_eq!(got[1], format!("FAIL {a} ann job.sh ann failed [3]"));
        let only_end = SubmitOptions {
            mail_type: Some(MailTypes::parse_slurm("END").unwrap()),
            mail_user: Some("ops@x.org".into()),
            ..opts()
        };
        let b = h.batch(only_end, &ann());
        end(&mut h, b, 0);
        let got = read_until(&log, 3);
        assert_eq!(got.len(), 3, "no BEGIN for an END-only job: {got:?}");
        assert_eq!(got[2], format!("END {b} ops@x.org job.sh ann completed [0]"));
        // No mail type: no call.
        let c = h.batch(opts(), &ann());
        end(&mut h, c, 0);
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert_eq!(read_until(&log, 3).len(), 3);
        assert_eq!(h.ctl.store.job_state(c).unwrap().map(|s| s.0), Some(JobState::Completed));
    }

    #[test]
    fn a_failing_or_hanging_hook_is_bounded() {
        let tmp = tempfile::tempdir().unwrap();
        let hang = tmp.path().join("hang.sh");
        std::fs::write(&hang, "#!/bin/sh\nsleep 30\n").unwrap();
        std::fs::set_permissions(&hang, std::fs::Permissions::from_mode(0o755)).unwrap();
        let t = std::time::Instant::now();
        let e = super::run(&hang, &[], &[], std::time::Duration::from_millis(200)).unwrap_err();
        assert!(e.contains("killed"), "{e}");
        assert!(t.elapsed() < std::time::Duration::from_secs(5));
        let e =
            super::run(std::path::Path::new("/bin/false"), &[], &[], std::time::Duration::from_secs(5)).unwrap_err();
        assert!(e.contains("ended with"), "{e}");
        assert!(
            super::run(std::path::Path::new("/nonexistent/hook"), &[], &[], std::time::Duration::from_secs(1)).is_err()
        );
        let rel = crate::config::NotifyConfig { command: Some("hook.sh".into()), ..Default::default() };
        assert!(rel.validate().is_err());
    }
}
