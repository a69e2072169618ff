//! `berth update`: change a pending job (or lower a running job's walltime); the request
//! `scontrol update` and `qalter` make too (`send`). The controller checks the change as a
//! submission (crates/controller/src/update.rs, docs/protocol/01-client.md "Changing jobs").

use crate::client::request;
use anyhow::{anyhow, bail, Result};
use berth_core::directives::SubmitOptions;
use berth_core::JobId;
use berth_protocol::client::{ClientRequest, ClientResponse, IdResult, JobChange};
use clap::Args;
use std::path::Path;

#[derive(Args, Debug, Default, Clone)]
pub struct UpdateArgs {
    /// The job: an array's id changes each of its pending tasks, `A_i` one task.
    pub id: String,
    /// SECONDS, HH:MM:SS, D-HH:MM:SS, or 10m / 2h (a running job's: lowered, or raised by an admin).
    #[arg(long)]
    pub walltime: Option<String>,
    /// Total cores (replaces --tasks-per-node unless it is given too).
    #[arg(long)]
    pub cores: Option<String>,
    #[arg(long)]
    pub nodes: Option<String>,
    /// Tasks per node (replaces --cores unless it is given too).
    #[arg(long = "tasks-per-node")]
    pub tasks_per_node: Option<String>,
    #[arg(long = "cpus-per-task")]
    pub cpus_per_task: Option<String>,
    /// Tasks in all, as Slurm's -n: per node when the job has a node count, else cores.
    #[arg(long)]
    pub tasks: Option<String>,
    #[arg(long, short = 'q')]
    pub queue: Option<String>,
    #[arg(long)]
    pub name: Option<String>,
    /// As at submission (afterok:ID, ...); "" removes it.
    #[arg(long, short = 'd')]
    pub dependency: Option<String>,
    /// Admins: the job's priority, instead of the computed one.
    #[arg(long)]
    pub priority: Option<u32>,
    /// Generic resources on each node, NAME[:TYPE]:COUNT[,...] as at submission ("" removes
    /// them); a gpu[:TYPE]:N item is --gpus-per-node N --gpu-type TYPE.
    #[arg(long)]
    pub gres: Option<String>,
    /// Licenses, NAME[:COUNT][,...] as at submission; "" removes them.
    #[arg(long, short = 'L')]
    pub licenses: Option<String>,
    /// GPUs of the whole job (replaces its GPU counts); 0 removes its GPUs.
    #[arg(long)]
    pub gpus: Option<String>,
    /// GPUs on each node (replaces its GPU counts); 0 removes its GPUs.
    #[arg(long = "gpus-per-node")]
    pub gpus_per_node: Option<String>,
    /// Only GPUs of this type; "" any type.
    #[arg(long = "gpu-type")]
    pub gpu_type: Option<String>,
}

/// A GPU count of `berth update`: 0 (no GPUs any more) to `max`.
fn gpu_count(flag: &str, v: &Option<String>, max: u32) -> Result<Option<u32>> {
    match v.as_deref().map(str::trim) {
        None => Ok(None),
        Some(t) => match t.parse::<u32>() {
            Ok(n) if n <= max => Ok(Some(n)),
            _ => bail!("{flag} needs a whole number from 0 (no GPUs) to {max}, got {:?}", t.escape_debug().to_string()),
        },
    }
}

impl UpdateArgs {
    /// The change asked for, each value read as `berth submit` reads it.
    pub fn change(&self) -> Result<JobChange> {
        let mut o = SubmitOptions::default();
        for (name, value) in [
            ("walltime", &self.walltime),
            ("cores", &self.cores),
            ("nodes", &self.nodes),
            ("tasks-per-node", &self.tasks_per_node),
            ("cpus-per-task", &self.cpus_per_task),
            ("queue", &self.queue),
            ("name", &self.name),
        ] {
            if let Some(v) = value {
                o.set(name, v).map_err(|e| anyhow!(e))?;
            }
        }
        let tasks = match &self.tasks {
            Some(t) => Some(
                t.trim()
                    .parse::<u32>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| anyhow!("--tasks needs a positive whole number, got {t:?}"))?,
            ),
            None => None,
        };
        // Read as at submission; "" is none any more. `--gres gpu[:TYPE]:N` items are GPUs per
        // node (and their type), as at submission.
        let mut gres_gpus: (Option<u32>, Option<String>) = (None, None);
        let mut counts = |what: &str, v: &Option<String>| -> Result<Option<berth_core::gres::Counts>> {
            match v.as_deref().map(str::trim) {
                None => Ok(None),
                Some("") => Ok(Some(Default::default())),
                Some(t) => {
                    let mut o = SubmitOptions::default();
                    o.set(what, t).map_err(|e| anyhow!(e))?;
                    gres_gpus = (o.gpus_per_node, o.gpu_type);
                    let rest = if what == "gres" { o.gres } else { o.licenses };
                    // Only GPU items: the job's other resources stay as they are.
                    Ok(if rest.is_none() && gres_gpus.0.is_some() { None } else { Some(rest.unwrap_or_default()) })
                }
            }
        };
        let gres = counts("gres", &self.gres)?;
        let licenses = counts("licenses", &self.licenses)?;
        let mut gpus_per_node = gpu_count("--gpus-per-node", &self.gpus_per_node, berth_core::job::MAX_GPUS_PER_NODE)?;
        let mut gpu_type = self.gpu_type.as_ref().map(|t| t.trim().to_string());
        if let Some(n) = gres_gpus.0 {
            if gpus_per_node.is_some_and(|p| p != n) || gres_gpus.1.is_some() && gpu_type.is_some() {
                bail!("--gres gpu:... and --gpus-per-node/--gpu-type say the same; give one of them");
            }
            gpus_per_node = Some(n);
            gpu_type = gpu_type.or(gres_gpus.1);
        }
        let change = JobChange {
            walltime: o.walltime,
            cores: o.cores,
            nodes: o.nodes,
            tasks_per_node: o.tasks_per_node,
            cpus_per_task: o.cpus_per_task,
            tasks,
            queue: o.queue,
            name: o.name,
            dependency: self.dependency.clone(),
            priority: self.priority,
            gres,
            licenses,
            gpus: gpu_count("--gpus", &self.gpus, berth_core::job::MAX_GPUS_PER_JOB)?,
            gpus_per_node,
            gpu_type,
        };
        if change.is_empty() {
            bail!("nothing to change: give --walltime, --cores, --nodes, --tasks-per-node, --cpus-per-task, --tasks, --queue, --name, --dependency, --priority, --gres, --licenses, --gpus, --gpus-per-node or --gpu-type");
        }
        Ok(change)
    }
}

/// Ask the controller to make `change` to job `id`: the ids of the jobs changed (an array's
/// pending tasks, or the job). `task_only`: `id` was given as `A_i` (that task alone).
pub async fn send(dir: &Path, id: JobId, task_only: bool, change: JobChange) -> Result<Vec<IdResult>> {
    match request(dir, ClientRequest::Update { id, change: Box::new(change), task_only }).await? {
        ClientResponse::Done { results } => Ok(results),
        _ => bail!("unexpected answer"),
    }
}

/// `berth update`: `job N updated` for each job changed (the results with --json).
pub async fn update(dir: &Path, json: bool, (id, task_only): (JobId, bool), args: &UpdateArgs) -> Result<i32> {
    let results = send(dir, id, task_only, args.change()?).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        for r in &results {
            println!("job {} updated", r.id);
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_read_as_at_submission() {
        let args = UpdateArgs {
            id: "5".into(),
            walltime: Some("1:30:00".into()),
            cores: Some("4".into()),
            name: Some("x".into()),
            dependency: Some(String::new()),
            ..Default::default()
        };
        let c = args.change().unwrap();
        assert_eq!((c.walltime, c.cores, c.name.as_deref()), (Some(5400), Some(4), Some("x")));
        assert_eq!(c.dependency.as_deref(), Some(""), "removes the dependency");
        let bad = UpdateArgs { id: "5".into(), cores: Some("0".into()), ..Default::default() };
        assert!(bad.change().unwrap_err().to_string().contains("--cores"));
        let lic = UpdateArgs {
            id: "5".into(),
            licenses: Some("matlab:2".into()),
            gres: Some("".into()),
            ..Default::default()
        };
        let c = lic.change().unwrap();
        assert_eq!(c.licenses.unwrap().get("matlab"), Some(&2));
        assert_eq!(c.gres, Some(Default::default()), "\"\" removes them");
        // GPUs (issue 20): counts, 0 removes them, gres gpu items are GPUs per node.
        let gpu = UpdateArgs { id: "5".into(), gres: Some("gpu:a100:2".into()), ..Default::default() };
        let c = gpu.change().unwrap();
        assert_eq!((c.gpus_per_node, c.gpu_type.as_deref(), c.gres), (Some(2), Some("a100"), None));
        let mixed = UpdateArgs { id: "5".into(), gres: Some("gpu:1,nvme:10".into()), ..Default::default() };
        let c = mixed.change().unwrap();
        assert_eq!((c.gpus_per_node, c.gres.unwrap().get("nvme")), (Some(1), Some(&10)));
        let gpus =
            UpdateArgs { id: "5".into(), gpus: Some("0".into()), gpu_type: Some("".into()), ..Default::default() };
        let c = gpus.change().unwrap();
        assert_eq!((c.gpus, c.gpu_type.as_deref()), (Some(0), Some("")));
        let bad = UpdateArgs { id: "5".into(), gpus_per_node: Some("x".into()), ..Default::default() };
        assert!(bad.change().unwrap_err().to_string().contains("--gpus-per-node"));
        let both = UpdateArgs {
            id: "5".into(),
            gres: Some("gpu:2".into()),
            gpus_per_node: Some("3".into()),
            ..Default::default()
        };
        assert!(both.change().unwrap_err().to_string().contains("give one of them"));
        let none = UpdateArgs { id: "5".into(), ..Default::default() };
        assert!(none.change().unwrap_err().to_string().contains("nothing to change"));
    }
}
