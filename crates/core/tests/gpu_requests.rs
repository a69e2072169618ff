//! `--cpus-per-gpu` and `--mem-per-gpu` (Slurm's semantics): a job's CPUs and memory on a node
//! scale with its GPUs there (docs/gpus.md, "Requests").

use berth_core::directives::SubmitOptions;
use berth_core::job::Shape;
use berth_core::placement::{JobRequest, MemRequest};

const GIB: u64 = 1 << 30;

fn request(o: SubmitOptions) -> Result<JobRequest, String> {
    JobRequest::from_options(&o).map_err(|e| e.to_string())
}

#[test]
fn memory_per_gpu_is_memory_per_node_times_its_gpus() {
    let r =
        request(SubmitOptions { gpus_per_node: Some(4), mem_per_gpu: Some(16 * GIB), ..Default::default() }).unwrap();
    assert_eq!(r.mem, MemRequest::PerNode(64 * GIB));
    let r =
        request(SubmitOptions { nodes: Some(2), gpus: Some(6), mem_per_gpu: Some(GIB), ..Default::default() }).unwrap();
    assert_eq!((r.gpus_per_node, r.mem), (3, MemRequest::PerNode(3 * GIB)), "per node: its 3 GPUs");
    let e = request(SubmitOptions { mem_per_gpu: Some(GIB), ..Default::default() }).unwrap_err();
    assert!(e.contains("--mem-per-gpu") && e.contains("needs --gpus"), "{e}");
    let both = SubmitOptions { gpus: Some(1), mem: Some(GIB), mem_per_gpu: Some(GIB), ..Default::default() };
    assert!(request(both).unwrap_err().contains("not several"));
    let both = SubmitOptions { gpus: Some(1), mem_per_cpu: Some(GIB), mem_per_gpu: Some(GIB), ..Default::default() };
    assert!(request(both).unwrap_err().contains("not several"));
    let huge = SubmitOptions { gpus: Some(4), mem_per_gpu: Some(u64::MAX / 2), ..Default::default() };
    assert!(request(huge).unwrap_err().contains("too large"));
}

#[test]
fn cpus_per_gpu_sets_the_cores_and_gpus_per_task_the_gpus() {
    let r = request(SubmitOptions { gpus: Some(2), cpus_per_gpu: Some(4), ..Default::default() }).unwrap();
    assert_eq!((r.shape, r.gpus_per_node), (Shape::PerNode { nodes: 1, cores_per_node: 8 }, 2));
    // 2 tasks a node, 2 GPUs each, 3 CPUs a GPU: 4 GPUs and 12 cores on each of 2 nodes.
    let o = SubmitOptions {
        nodes: Some(2),
        tasks_per_node: Some(2),
        gpus_per_task: Some(2),
        cpus_per_gpu: Some(3),
        mem_per_gpu: Some(GIB),
        ..Default::default()
    };
    let r = request(o).unwrap();
    assert_eq!(r.shape, Shape::PerNode { nodes: 2, cores_per_node: 12 });
    assert_eq!((r.gpus_per_node, r.mem), (4, MemRequest::PerNode(4 * GIB)));
    let e = request(SubmitOptions { cores: Some(4), cpus_per_gpu: Some(2), gpus: Some(1), ..Default::default() });
    assert!(e.unwrap_err().contains("not both"));
}
