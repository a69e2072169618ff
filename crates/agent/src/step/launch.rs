//! Admitting a step launch on this node: the grant is the controller's, for this node, used
//! once (crate::auth), and its job is set up here with the CPUs the grant names
//! (crate::step::ranks); and starting the step a job's launch order carried
//! (crate::ports::attach: its `berth run` attaches later).

use crate::auth::Refused;
use crate::ports::JobContext;
use crate::step::shepherd::Upstream;
use berth_protocol::auth::{now_ms, LinkKey};
use berth_protocol::error::Refusal;
use berth_protocol::step::StepGrant;
use std::sync::Arc;
use std::time::Duration;

/// How long a step may wait for its job to be set up on this node (as the shepherd does).
const JOB_WAIT: Duration = Duration::from_secs(10);

/// Everything a step launch must pass before anything starts here. Refused without an agent
/// key (`ctx.auth` None: tests).
pub async fn check(ctx: &JobContext, grant: &StepGrant, subtree: &[u32]) -> Result<(), Refused> {
    let launch = |m: String| (Refusal::Launch, m);
    let (job, step) = (grant.job, grant.step);
    let Some(auth) = ctx.auth.as_deref() else {
        return Err((Refusal::Auth, "this agent has no cluster key to check the grant with".into()));
    };
    let now = now_ms();
    auth.check_grant_here(grant, subtree, now)?;
    auth.record_launch(grant, now)?;
    let Some(handle) = ctx.registry.wait_for(job, JOB_WAIT).await else {
        return Err(launch(format!("step {job}.{step}: job {job} is not running on node {}", auth.name)));
    };
    let node = &grant.nodes[subtree[0] as usize];
    crate::step::ranks::check(&handle, grant, node).map_err(|e| launch(format!("step {job}.{step}: {e}")))?;
    Ok(())
}

/// Start the step a job's launch order carried, now that the job is set up here: checked as
/// `run`'s launch would be, then served with its upstream awaited.
pub fn start_from_order(ctx: Arc<JobContext>, grant: StepGrant) {
    tokio::spawn(async move {
        let (job, step) = (grant.job, grant.step);
        berth_protocol::probe::mark("agent prestart begin");
        let Some(auth) = ctx.auth.clone() else {
            ctx.registry.attach.job_ended(job, step, "this agent has no cluster key to check the grant with".into());
            return;
        };
        let subtree: Vec<u32> = (0..grant.nodes.len() as u32).collect();
        if let Err((what, why)) = check(&ctx, &grant, &subtree).await {
            auth.refuse(what, Some(job), &format!("{why} (carried by the job's launch order)"));
            ctx.registry.attach.job_ended(job, step, why);
            return;
        }
        berth_protocol::probe::mark("agent prestart checked");
        let attached = ctx.registry.attach.expect(job, step);
        let link = LinkKey::of_grant(&auth.key, &grant);
        crate::step::shepherd::serve(ctx, grant, subtree, link, Upstream::Awaited(attached)).await;
    });
}
