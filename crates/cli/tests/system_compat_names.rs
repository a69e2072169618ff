//! System test: berth under Slurm's and PBS's command names (issue 19, "Under their own
//! names"; docs/compat.md, "Command names"). `berth compat install DIR` makes the links; the
//! commands run through them against a live cluster, and their outputs are read the way
//! scripts written for Slurm and PBS read them.

mod common;

use common::*;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

struct Names<'a> {
    c: &'a Cluster,
    bin: PathBuf,
}

impl Names<'_> {
    /// Run `name` (a link in the installed directory) with `args`, optionally feeding `stdin`.
    fn run(&self, name: &str, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = Command::new(self.bin.join(name));
        cmd.args(args).env("BERTH_DIR", &self.c.dir).current_dir(self.c.root());
        cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("run {name}: {e}"));
        if let Some(text) = stdin {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        }
        child.wait_with_output().unwrap()
    }

    /// Run and expect success; its standard output.
    fn ok(&self, name: &str, args: &[&str], stdin: Option<&str>) -> String {
        let o = self.run(name, args, stdin);
        assert!(o.status.success(), "{name} {args:?}: {:?}\n{}{}", o.status, text(&o.stdout), text(&o.stderr));
        text(&o.stdout)
    }
}

fn install(c: &Cluster) -> Names<'_> {
    let bin = c.root().join("bin");
    let v = c.json(&["compat", "install", &bin.display().to_string()]);
    let links = v["links"].as_array().expect("links");
    let names: Vec<&str> = links.iter().map(|l| l["name"].as_str().unwrap()).collect();
    for n in [
        "sbatch", "squeue", "scancel", "sinfo", "scontrol", "sacct", "qsub", "qstat", "qdel", "qhold", "qrls",
        "pbsnodes",
    ] {
        assert!(names.contains(&n), "{n} not installed: {v:#}");
        assert!(bin.join(n).is_symlink(), "{n} is not a link");
    }
    assert!(links.iter().all(|l| l["action"] == "created"), "{v:#}");
    // Idempotent: a second run keeps every link.
    let again = c.json(&["compat", "install", &bin.display().to_string()]);
    assert!(again["links"].as_array().unwrap().iter().all(|l| l["action"] == "kept"), "{again:#}");
    Names { c, bin }
}

#[test]
fn slurm_commands_under_their_names() {
    let c = Cluster::up(2, "package:1 core:4 pu:1");
    let n = install(&c);

    // sbatch --parsable: the id alone; --wrap builds the script.
    let id = n.ok("sbatch", &["--parsable", "-J", "sleeper", "-t", "5:00", "--wrap", "sleep 60"], None);
    let sleeper: u64 = id.trim().parse().unwrap_or_else(|_| panic!("--parsable printed {id:?}"));
    let j = c.wait_state(sleeper, &["running"], Duration::from_secs(30));
    assert_eq!(j["name"], "sleeper");
    assert_eq!(j["walltime_seconds"], 300);

    // sbatch with a script: `Submitted batch job N`, #SBATCH read, options override it,
    // stdout and stderr in slurm-N.out.
    let script = c.root().join("job.sh");
    std::fs::write(&script, "#!/bin/sh\n#SBATCH -N 1 -n 2\n#SBATCH -J from-script\necho out; echo err >&2\n").unwrap();
    let said = n.ok("sbatch", &["-N", "2", "job.sh"], None);
    let rest = said.trim().strip_prefix("Submitted batch job ").unwrap_or_else(|| panic!("sbatch printed {said:?}"));
    let job: u64 = rest.parse().unwrap();
    let j = c.wait_finished(job, Duration::from_secs(60));
    assert_eq!(j["state"], "completed", "{j:#}");
    assert_eq!(j["name"], "from-script");
    assert_eq!(j["allocation"].as_array().unwrap().len(), 2, "-N 2 on the command line wins: {j:#}");
    let out = std::fs::read_to_string(c.root().join(format!("slurm-{job}.out"))).expect("slurm-N.out");
    assert!(out.contains("out") && out.contains("err"), "stdout and stderr together: {out:?}");

    // squeue: the default header, and `-h -o "%i %t"` as scripts parse it.
    let table = n.ok("squeue", &[], None);
    assert_eq!(
        table.lines().next().unwrap().split_whitespace().collect::<Vec<_>>(),
        ["JOBID", "PARTITION", "NAME", "USER", "ST", "TIME", "NODES", "NODELIST(REASON)"]
    );
    let lines = n.ok("squeue", &["-h", "-o", "%i %t"], None);
    assert!(lines.lines().any(|l| l == format!("{sleeper} R")), "{lines:?}");
    assert!(!lines.lines().any(|l| l.starts_with(&format!("{job} "))), "finished jobs are not listed: {lines:?}");
    let mine = n.ok("squeue", &["-h", "-n", "sleeper", "-o", "%j|%u|%D|%P"], None);
    assert_eq!(mine.trim(), "sleeper|root|1|batch");
    let done = n.ok("squeue", &["-h", "-j", &job.to_string(), "-o", "%i %t %T"], None);
    assert_eq!(done.trim(), format!("{job} CD COMPLETED"));

    // sinfo: the partition, its nodes and their states.
    let info = n.ok("sinfo", &[], None);
    assert_eq!(
        info.lines().next().unwrap().split_whitespace().collect::<Vec<_>>(),
        ["PARTITION", "AVAIL", "TIMELIMIT", "NODES", "STATE", "NODELIST"]
    );
    let per_node = n.ok("sinfo", &["-N", "-h", "-o", "%N %t"], None);
    let states: Vec<&str> = per_node.lines().map(|l| l.split_whitespace().nth(1).unwrap_or("")).collect();
    assert_eq!(states.len(), 2, "{per_node}");
    assert!(states.contains(&"mix"), "the sleeper's node is partly allocated: {per_node}");

    // scontrol show job / node: Key=Value records.
    let rec = n.ok("scontrol", &["show", "job", &sleeper.to_string()], None);
    for kv in
        [format!("JobId={sleeper}"), "JobName=sleeper".into(), "JobState=RUNNING".into(), "TimeLimit=00:05:00".into()]
    {
        assert!(rec.split_whitespace().any(|w| w == kv), "{kv} in\n{rec}");
    }
    let one = n.ok("scontrol", &["-o", "show", "node", "node1"], None);
    assert_eq!(one.lines().count(), 1, "{one}");
    assert!(one.starts_with("NodeName=node1 ") && one.contains(" CPUTot=4 "), "{one}");
    let o = n.run("scontrol", &["show", "job", "999999"], None);
    assert_eq!(o.status.code(), Some(1));

    // sacct: the finished job, parsable, and its accounting.
    let acct = n.ok(
        "sacct",
        &["-P", "-n", "-j", &job.to_string(), "-o", "JobID,JobName,State,ExitCode,NNodes,AllocCPUS"],
        None,
    );
    assert_eq!(acct, format!("{job}|from-script|COMPLETED|0:0|2|4\n"));
    let today = n.ok("sacct", &["-X", "-n", "-P", "-o", "JobID,State"], None);
    assert!(today.lines().any(|l| l == format!("{sleeper}|RUNNING")), "{today}");
    assert!(today.lines().any(|l| l == format!("{job}|COMPLETED")), "{today}");
    let o = n.run("sacct", &["-o", "JobID,Nonsense"], None);
    assert_eq!(o.status.code(), Some(1));

    // scontrol hold / release a queued job.
    let q = n.ok("sbatch", &["--parsable", "-N", "2", "-n", "8", "--wrap", "true"], None);
    let q: u64 = q.trim().parse().unwrap();
    n.ok("scontrol", &["hold", &q.to_string()], None);
    assert_eq!(c.show(q)["state"], "held");
    n.ok("scontrol", &["release", &q.to_string()], None);
    assert_ne!(c.show(q)["state"], "held");
    n.ok("scancel", &[&q.to_string()], None);

    // scancel: quiet on success, Slurm's error and exit status otherwise.
    let o = n.run("scancel", &[&sleeper.to_string()], None);
    assert!(o.status.success() && o.stdout.is_empty(), "{o:?}");
    c.wait_state(sleeper, &["cancelled"], Duration::from_secs(30));
    let o = n.run("scancel", &["999999"], None);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("Invalid job id specified"), "{}", text(&o.stderr));
    // By name: only the jobs so named.
    let a = n.ok("sbatch", &["--parsable", "-H", "-J", "victim", "--wrap", "true"], None);
    let b = n.ok("sbatch", &["--parsable", "-H", "-J", "keeper", "--wrap", "true"], None);
    let held = n.ok("squeue", &["-h", "-t", "PD", "-o", "%i %r"], None);
    assert!(held.lines().any(|l| l == format!("{} JobHeldUser", a.trim())), "{held:?}");
    n.ok("scancel", &["-n", "victim"], None);
    let (a, b): (u64, u64) = (a.trim().parse().unwrap(), b.trim().parse().unwrap());
    c.wait_state(a, &["cancelled"], Duration::from_secs(10));
    assert_eq!(c.show(b)["state"], "held");
    n.ok("scancel", &[&b.to_string()], None);

    // An unknown option is an error naming it, exit status 1.
    let o = n.run("sbatch", &["--bogus", "job.sh"], None);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("--bogus"), "{}", text(&o.stderr));
    let o = n.run("sbatch", &["--licenses=lic@db", "job.sh"], None);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("--licenses=lic@db"), "{}", text(&o.stderr));

    // A shell snippet written for Slurm: submit, poll squeue until gone, read the output.
    let snippet = format!(
        "set -e\nexport PATH={}:$PATH\njid=$(sbatch --parsable --wrap 'echo snippet-ok')\nwhile [ -n \"$(squeue -h -j $jid -t PD,R,CG -o %i)\" ]; do sleep 0.2; done\nsqueue -h -j $jid -o %T\ncat slurm-$jid.out\n",
        n.bin.display()
    );
    let o = Command::new("sh").arg("-c").arg(&snippet).env("BERTH_DIR", &c.dir).current_dir(c.root()).output().unwrap();
    assert!(o.status.success(), "{}{}", text(&o.stdout), text(&o.stderr));
    assert_eq!(text(&o.stdout), "COMPLETED\nsnippet-ok\n");
}

#[test]
fn pbs_commands_under_their_names() {
    let c = Cluster::up(1, "package:1 core:4 pu:1");
    let n = install(&c);
    let server = hostname();

    // qsub prints N.server; #PBS lines are read; outputs are NAME.oN and NAME.eN.
    let script = c.root().join("pbs.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n#PBS -N pbsjob\n#PBS -l nodes=1:ppn=2,walltime=00:01:00\necho out; echo err >&2\n",
    )
    .unwrap();
    let said = n.ok("qsub", &["pbs.sh"], None);
    let id = said.trim();
    let (num, srv) = id.split_once('.').unwrap_or_else(|| panic!("qsub printed {said:?}"));
    assert_eq!(srv, server);
    let num: u64 = num.parse().unwrap();
    let j = c.wait_finished(num, Duration::from_secs(60));
    assert_eq!(j["state"], "completed", "{j:#}");
    assert_eq!(j["walltime_seconds"], 60);
    assert_eq!(std::fs::read_to_string(c.root().join(format!("pbsjob.o{num}"))).unwrap(), "out\n");
    assert_eq!(std::fs::read_to_string(c.root().join(format!("pbsjob.e{num}"))).unwrap(), "err\n");

    // A script on standard input (no #! line needed), joined outputs.
    let said = n.ok("qsub", &["-j", "oe", "-l", "walltime=60"], Some("echo from-stdin\necho e >&2\n"));
    let stdin_job: u64 = said.trim().split('.').next().unwrap().parse().unwrap();
    c.wait_finished(stdin_job, Duration::from_secs(60));
    let out = std::fs::read_to_string(c.root().join(format!("STDIN.o{stdin_job}"))).expect("STDIN.oN");
    assert_eq!(out, "from-stdin\ne\n");
    // -S: the shell a script without #! runs under; one naming another shell is refused.
    let said = n.ok("qsub", &["-S", "/bin/bash", "-N", "bashed"], Some("echo shell=${BASH_VERSION:+bash}\n"));
    let bashed: u64 = said.trim().split('.').next().unwrap().parse().unwrap();
    c.wait_finished(bashed, Duration::from_secs(60));
    let out = std::fs::read_to_string(c.root().join(format!("bashed.o{bashed}"))).expect("bashed.oN");
    assert_eq!(out, "shell=bash\n");
    let o = n.run("qsub", &["-S", "/bin/bash", "pbs.sh"], None);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("make that line #!/bin/bash"), "{}", text(&o.stderr));

    // qstat: PBS's table with a held job; -f; qdel; finished and unknown ids.
    let held = n.ok("qsub", &["-h", "-N", "waiting", "pbs.sh"], None);
    let held = held.trim().to_string();
    let table = n.ok("qstat", &[], None);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["Job", "id", "Name", "User", "Time", "Use", "S", "Queue"]
    );
    assert!(lines[1].starts_with("----------------  "), "{table}");
    let row: Vec<&str> = lines
        .iter()
        .find(|l| l.starts_with(&held))
        .unwrap_or_else(|| panic!("{held} in\n{table}"))
        .split_whitespace()
        .collect();
    assert_eq!(row, [held.as_str(), "waiting", "root", "0", "H", "batch"]);
    assert!(!table.contains(&format!("{num}.{server} ")), "finished jobs are not listed:\n{table}");
    // qhold of a held job changes nothing; qrls lets a held job run.
    n.ok("qhold", &[&held], None);
    let o = n.run("qhold", &["999999"], None);
    assert_eq!(o.status.code(), Some(153));
    let later = n.ok("qsub", &["-h", "-N", "later", "pbs.sh"], None);
    let later: u64 = later.trim().split('.').next().unwrap().parse().unwrap();
    assert_eq!(c.show(later)["state"], "held");
    n.ok("qrls", &[&later.to_string()], None);
    assert_eq!(c.wait_finished(later, Duration::from_secs(60))["state"], "completed");
    // pbsnodes: each node's attributes.
    let nodes = n.ok("pbsnodes", &["-a"], None);
    assert!(nodes.lines().next() == Some("node1"), "{nodes}");
    assert!(nodes.lines().any(|l| l.trim() == "resources_available.ncpus = 4"), "{nodes}");
    assert!(nodes.lines().any(|l| l.trim().starts_with("state = ")), "{nodes}");
    let full = n.ok("qstat", &["-f", &held], None);
    assert!(full.starts_with(&format!("Job Id: {held}\n")), "{full}");
    assert!(full.lines().any(|l| l.trim() == "job_state = H"), "{full}");
    assert!(full.lines().any(|l| l.trim() == "Job_Name = waiting"), "{full}");
    let alt = n.ok("qstat", &["-u", "root"], None);
    assert!(alt.contains("Job ID          Username Queue"), "{alt}");
    let o = n.run("qdel", &[&held], None);
    assert!(o.status.success() && o.stdout.is_empty(), "{o:?}");
    let o = n.run("qstat", &[&held], None);
    assert_eq!(o.status.code(), Some(35), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("Job has finished"), "{}", text(&o.stderr));
    assert!(n.ok("qstat", &["-x", &held], None).lines().any(|l| l.starts_with(&held) && l.contains(" F ")));
    let o = n.run("qdel", &["999999"], None);
    assert_eq!(o.status.code(), Some(153));
    assert_eq!(text(&o.stderr).trim(), format!("qdel: Unknown Job Id 999999.{server}"));
    let o = n.run("qsub", &["-W", "depend=beforeok:1", "pbs.sh"], None);
    assert_ne!(o.status.code(), Some(0));
    assert!(text(&o.stderr).contains("-W depend=beforeok:1"), "{}", text(&o.stderr));

    // A shell snippet written for PBS: the id from qsub, polled with qstat until it is gone.
    let snippet = format!(
        "set -e\nexport PATH={}:$PATH\njid=$(qsub -N snip -j oe -- /bin/echo snippet-ok)\nwhile qstat $jid >/dev/null 2>&1; do sleep 0.2; done\ncat snip.o${{jid%%.*}}\n",
        n.bin.display()
    );
    let o = Command::new("sh").arg("-c").arg(&snippet).env("BERTH_DIR", &c.dir).current_dir(c.root()).output().unwrap();
    assert!(o.status.success(), "{}{}", text(&o.stdout), text(&o.stderr));
    assert_eq!(text(&o.stdout), "snippet-ok\n");
}

/// This host's name up to its first dot (the server part of PBS job ids).
fn hostname() -> String {
    let full = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    full.trim().split('.').next().unwrap().to_string()
}
