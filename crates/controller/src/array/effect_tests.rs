//! An array's submission decided without a store: its tasks and rows are plain values.

use super::*;
use crate::model::array::write_array_rows;
use crate::testkit::{ann, running_job};

#[test]
fn an_array_is_its_tasks_rows_the_first_with_the_script_then_one_submit_event() {
    let mut template = running_job(0, &ann(), &[]);
    (template.state, template.start_time) = (JobState::Queued, None);
    template.stdout = "out/%A_%a.out".into();
    template.options.array = Some(berth_core::directives::ArraySpec::parse_slurm("1-3%2").unwrap());
    let mut jobs = Vec::new();
    let effects = array_submitted(template, JobId(20), &[1, 2, 3], Some(2), |t| jobs.push(t));
    let ids: Vec<_> = jobs.iter().map(|j| j.id).collect();
    assert_eq!(ids, [JobId(20), JobId(21), JobId(22)]);
    assert!(jobs.iter().all(|j| j.options.array.is_none()));
    let tasks: Vec<_> = jobs.iter().filter_map(|j| j.options.array_task).map(|t| (t.job, t.index, t.limit)).collect();
    assert_eq!(tasks, [(20, 1, Some(2)), (20, 2, Some(2)), (20, 3, Some(2))]);
    assert_eq!(jobs[2].stdout, "out/20_3.out");
    // One effect for all the rows (the template and the tasks, not a record per task), then
    // the event.
    let [Effect::InsertArray { template, first, tasks }, event] = &effects[..] else {
        panic!("the rows, then the event: {effects:?}")
    };
    assert_eq!(*first, JobId(20));
    assert!(template.options.array.is_none() && template.options.array_task.is_none());
    assert_eq!(template.stdout, "out/%A_%a.out", "the template's paths are expanded per task");
    assert_eq!(tasks.len(), 3);
    assert_eq!(event, &Effect::job_event("submit", JobId(20), None, "ann: array 20, 3 tasks, indexes 1-3"));
    // The rows written are the tasks kept in memory, the first with the script, the others
    // sharing the array's.
    let mut rows = Vec::new();
    write_array_rows(template, *first, tasks, |row, script_of| {
        rows.push((row.clone(), script_of));
        Ok::<_, ()>(())
    })
    .unwrap();
    assert_eq!(rows, jobs.iter().cloned().zip([None, Some(JobId(20)), Some(JobId(20))]).collect::<Vec<_>>());
    // A store error stops the writing at that row.
    let mut written = 0;
    let stopped = write_array_rows(template, *first, tasks, |_, _| {
        written += 1;
        if written == 2 {
            Err("disk full")
        } else {
            Ok(())
        }
    });
    assert_eq!((stopped, written), (Err("disk full"), 2));
    // Indexes not consecutive are folded in the event.
    let mut sparse = running_job(0, &ann(), &[]);
    sparse.state = JobState::Queued;
    let mut jobs = Vec::new();
    let effects = array_submitted(sparse, JobId(30), &[0, 4, 8], None, |t| jobs.push(t));
    assert_eq!(jobs.len(), 3);
    let Some(Effect::Event { detail, .. }) = effects.last() else {
        panic!("the last effect is the event: {effects:?}")
    };
    assert_eq!(detail, &format!("ann: array 30, 3 tasks, indexes {}", berth_core::directives::array::fold(&[0, 4, 8])));
}
