//! An array's tasks made from its template: pure functions shared by the submission
//! (`crate::array`, the tasks kept in memory) and the store (`Store::insert_array`, their
//! rows), so both make the same task the same way.

use crate::model::job::JobRecord;
use berth_core::directives::array::ArrayTask;
use berth_core::JobId;

/// `job` given id `id` (the first task of an array gives the array its id) and its output paths
/// expanded (a path naming nodes, `%N`, `%n`, `%t`, waits for its start).
pub(crate) fn set_id_and_paths(job: &mut JobRecord, id: JobId) {
    job.id = id;
    if let Some(t) = job.options.array_task.as_mut().filter(|t| t.job == 0) {
        t.job = id.0;
    }
    let task = job.options.array_task;
    let expand = |p: &str| {
        if berth_core::directives::extra::has_node_patterns(p) {
            p.to_string()
        } else {
            berth_core::directives::expand_output_in(p, id.0, &job.name, &job.user.name, task.as_ref())
        }
    };
    (job.stdout, job.stderr) = (expand(&job.stdout), expand(&job.stderr));
}

/// `job`, a copy of the array's `template`, made its `k`th task (`task`, id `first + k`): of
/// the fields a task changes (its task, id and output paths) none is left from another task,
/// so one copy serves every task in turn (`write_array_rows`).
pub(crate) fn make_task(template: &JobRecord, job: &mut JobRecord, first: JobId, k: usize, task: ArrayTask) {
    job.options.array_task = Some(task);
    job.stdout.clone_from(&template.stdout);
    job.stderr.clone_from(&template.stderr);
    set_id_and_paths(job, JobId(first.0 + k as u64));
}

/// The rows of an array's tasks (`Effect::InsertArray`), in order, each given to `write` with
/// the job whose script and environment it shares: none for the first, the array's for the
/// others (one copy on disk). Each row is the task `crate::array::array_submitted` keeps in
/// memory, made in one reused copy of `template`: no row is kept after it is written.
pub(crate) fn write_array_rows<E>(
    template: &JobRecord,
    first: JobId,
    tasks: &[ArrayTask],
    mut write: impl FnMut(&JobRecord, Option<JobId>) -> Result<(), E>,
) -> Result<(), E> {
    let mut row = template.clone();
    for (k, &task) in tasks.iter().enumerate() {
        make_task(template, &mut row, first, k, task);
        write(&row, (k > 0).then_some(first))?;
    }
    Ok(())
}
