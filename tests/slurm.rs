//! The shipped Slurm prolog and epilog write and clean dcgm-exporter's job mapping directory,
//! and gpuwatch reads what they wrote: jobs sharing a GPU are all listed, an epilog takes only
//! its own job off, and input that is not an id is ignored.

use std::path::Path;
use std::process::Command;

use gpuwatch::slurm::mapping::{read, Device};

fn run(script: &str, dir: &Path, job: &str, gpus: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let status = Command::new("sh")
        .arg(root.join("deploy/slurm").join(script))
        .env("GPUWATCH_JOB_MAPPING_DIR", dir)
        .env("SLURM_JOB_ID", job)
        .env("SLURM_JOB_GPUS", gpus)
        .status()
        .unwrap();
    assert!(status.success(), "{script} {job} {gpus}");
}

fn jobs(dir: &Path, gpu: u32) -> Vec<String> {
    read(dir)
        .jobs
        .get(&Device::Index(gpu))
        .cloned()
        .unwrap_or_default()
}

#[test]
fn the_prolog_and_epilog_keep_the_mapping_that_gpuwatch_reads() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("job-mapping");
    run("prolog.sh", &dir, "42", "0,2");
    run("prolog.sh", &dir, "43", "2");
    // A prolog run twice records its job once.
    run("prolog.sh", &dir, "43", "2");
    assert_eq!(jobs(&dir, 0), ["42"]);
    assert_eq!(jobs(&dir, 2), ["42", "43"]);
    // Not ids: nothing is written, and nothing breaks.
    run("prolog.sh", &dir, "4;rm -rf /", "1");
    run("prolog.sh", &dir, "44", "1;x,../3");
    assert_eq!(jobs(&dir, 1), Vec::<String>::new());
    assert!(!tmp.path().join("3").exists());
    let m = read(&dir);
    assert_eq!(
        m.skipped, 0,
        "the scripts' own files are not read as GPUs: {m:?}"
    );

    run("epilog.sh", &dir, "42", "0,2");
    assert!(!dir.join("0").exists(), "a file with no job left goes");
    assert_eq!(jobs(&dir, 2), ["43"]);
    run("epilog.sh", &dir, "43", "2");
    assert!(read(&dir).jobs.is_empty());
}
