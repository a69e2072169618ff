//! MPMD steps (several programs in one step: `berth run -n 2 a : -n 4 b`, `--multi-prog`):
//! their checks, the shape of their interactive allocation, and their plan. The layout itself
//! is `berth_core::step::mpmd`'s.

use super::{api, MAX_STEP_COUNT};
use berth_core::job::NodeAllocation;
use berth_core::step::mpmd::{self, App, MAX_APPS};
use berth_core::step::{plan_step_gpus, RankBinding, StepError, StepGpus, StepPlan, StepRequest};
use berth_core::topology::Topology;
use berth_core::CpuSet;
use berth_protocol::client::{ApiError, ErrorCode};
use berth_protocol::step::StepCreate;

/// A colon line's parts carry their own layout; a multi-prog file's lines their ranks.
fn colon_parts(apps: &[App]) -> bool {
    apps.first().is_some_and(|a| a.request.is_some())
}

/// The parts of an MPMD request that need no state.
pub(super) fn check(req: &StepCreate) -> Result<(), ApiError> {
    let bad = |m: String| Err(api(ErrorCode::BadRequest, m));
    let apps = &req.apps;
    if apps.is_empty() {
        return Ok(());
    }
    if apps.len() > MAX_APPS {
        return bad(format!("{} programs in one step; at most {MAX_APPS}", apps.len()));
    }
    let colon = colon_parts(apps);
    for (i, app) in apps.iter().enumerate() {
        let n = i + 1;
        if app.argv.first().is_none_or(String::is_empty) {
            return bad(format!("program {n} of the MPMD command is empty: give a program in every part"));
        }
        if app.argv.iter().any(|a| a.contains('\0')) {
            return bad(format!("an argument of program {n} contains a NUL byte"));
        }
        if app.env.iter().any(|(k, v)| k.is_empty() || k.contains(['=', '\0']) || v.contains('\0')) {
            return bad(format!(
                "program {n} sets a variable that cannot be passed to a process (empty name, '=' or NUL)"
            ));
        }
        if app.cwd.as_ref().is_some_and(|d| !d.starts_with('/') || d.contains('\0')) {
            return bad(format!(
                "program {n}'s working directory {:?} is not absolute",
                app.cwd.as_deref().unwrap_or("")
            ));
        }
        if app.request.is_some() != colon {
            return bad("an MPMD step is either colon parts (each with its own layout) or multi-prog lines (each with its ranks), not both".into());
        }
        if let Some(r) = &app.request {
            if r.ntasks == Some(0) || r.tasks_per_node == Some(0) || r.cpus_per_task == Some(0) || r.nodes == Some(0) {
                return bad(format!("part {n}: -n, -N, --ntasks-per-node and --cpus-per-task must be at least 1"));
            }
            for (flag, v) in
                [("-n", r.ntasks), ("-N", r.nodes), ("--ntasks-per-node", r.tasks_per_node), ("-d", r.cpus_per_task)]
            {
                if let Some(v) = v.filter(|&v| v > MAX_STEP_COUNT) {
                    return bad(format!("part {n}: {flag} {v} is out of range: at most {MAX_STEP_COUNT}"));
                }
            }
        } else {
            if app.rest != app.ranks.is_empty() {
                return bad(format!("line {n} of the multi-prog file names no ranks (or both ranks and `*`)"));
            }
            if app.ranks.iter().any(|&(a, b)| a > b || b >= MAX_STEP_COUNT) {
                return bad(format!("line {n} of the multi-prog file names ranks beyond {MAX_STEP_COUNT}"));
            }
        }
    }
    Ok(())
}

/// Outside a job, a colon line's allocation holds every part's cores (`-n` × `-d` each, one
/// node set for all): its parts must say how many ranks they run and leave the nodes to it.
pub(super) fn interactive_shape(req: &mut StepCreate) -> Result<(), ApiError> {
    if !colon_parts(&req.apps) {
        return Ok(());
    }
    let mut cores: u32 = 0;
    for (i, app) in req.apps.iter().enumerate() {
        let r = app.request.clone().unwrap_or_default();
        let Some(n) = r.ntasks else {
            return Err(api(
                ErrorCode::BadRequest,
                format!(
                    "part {} of the MPMD command has no -n: outside a job every part says how many ranks it runs",
                    i + 1
                ),
            ));
        };
        if r.nodes.is_some() || r.tasks_per_node.is_some() || r.gpus_per_task.is_some() {
            return Err(api(
                ErrorCode::BadRequest,
                format!(
                    "part {}: -N, --ntasks-per-node and --gpus-per-task per part need a job; submit one (or `berth alloc`) and run the MPMD command in it",
                    i + 1
                ),
            ));
        }
        let c = n.checked_mul(r.cpus_per_task.unwrap_or(1)).and_then(|c| cores.checked_add(c));
        cores =
            c.filter(|&c| c <= MAX_STEP_COUNT).ok_or_else(|| api(ErrorCode::BadRequest, "the request is too large"))?;
    }
    req.request = StepRequest {
        ntasks: Some(cores),
        nodes: None,
        tasks_per_node: None,
        cpus_per_task: Some(1),
        gpus_per_task: None,
        ..req.request.clone()
    };
    req.interactive.nodes = None;
    Ok(())
}

/// Where the ranks go and what each runs: a colon line's parts planned one after another
/// (`mpmd::plan_mpmd`), a multi-prog file's lines over the step's layout; the apps of the
/// grant (ranks resolved, layouts dropped, each part's binding). No apps: the one program.
/// With `gpus` (the step's `--gpus-per-task`/`--gpu-bind`) each rank's cores are placed next
/// to its GPUs (`plan_step_gpus`), for one program and a multi-prog file's lines; a colon
/// line's parts are laid out in plain core order (each part's own GPU flags are dealt by the
/// agent, docs/launcher.md; their cores are not yet placed next to those GPUs).
pub(super) fn plan(
    alloc: &[NodeAllocation],
    topos: &[&Topology],
    in_use: &[CpuSet],
    req: &StepCreate,
    gpus: Option<&StepGpus>,
) -> Result<(StepPlan, Vec<App>), ApiError> {
    let step_error = super::step_error;
    if req.apps.is_empty() {
        return plan_step_gpus(alloc, topos, in_use, &req.request, gpus).map(|p| (p, vec![])).map_err(step_error);
    }
    if colon_parts(&req.apps) {
        let parts: Vec<StepRequest> = req.apps.iter().map(|a| a.request.clone().unwrap_or_default()).collect();
        let (plan, ranges) = mpmd::plan_mpmd(alloc, topos, in_use, &parts).map_err(step_error)?;
        let apps = req
            .apps
            .iter()
            .zip(ranges)
            .map(|(a, range)| App {
                ranks: vec![range],
                rest: false,
                request: None,
                bind: Some(a.request.as_ref().map_or(RankBinding::Linear, |r| r.binding) != RankBinding::None),
                ..a.clone()
            })
            .collect();
        return Ok((plan, apps));
    }
    let plan = plan_step_gpus(alloc, topos, in_use, &req.request, gpus).map_err(step_error)?;
    let apps = mpmd::resolve_ranks(&req.apps, plan.size)
        .map_err(|e| step_error(StepError::Invalid(format!("--multi-prog: {e}"))))?;
    Ok((plan, apps))
}
