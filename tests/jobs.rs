//! Jobs and users end to end, over real processes: the fake NVML reports real pids (a
//! `pids_file` per GPU), gpuwatch reads their `/proc` entries, the job mapping directory names a
//! GPU no process holds, and a job-scoped rule warns and then runs its command with the job, its
//! user and its GPUs in the environment. A job whose process ends loses its series at the next
//! refresh.

mod common;

use std::process::{Child, Command};
use std::time::Duration;

use common::{events, metric, Daemon};

const LIMIT: Duration = Duration::from_secs(60);

/// A process that looks like a Slurm job's to gpuwatch: `SLURM_JOB_ID` in its environment.
fn job_process(job: &str) -> Child {
    Command::new("sleep")
        .arg("600")
        .env("SLURM_JOB_ID", job)
        .spawn()
        .unwrap()
}

fn me() -> String {
    // SAFETY: getuid has no preconditions and cannot fail; std has no call for it.
    let uid = unsafe { libc::getuid() };
    gpuwatch::slurm::users::Users::default().name(uid)
}

#[test]
fn jobs_and_users_are_attributed_priced_and_judged() {
    let dir = tempfile::tempdir().unwrap();
    let mut job = job_process("4242");
    // A process outside any job, owned by this user, that claims job 777 in its environment
    // (anyone can): the prolog gave job 777 GPU 1, not this process's GPU 2, so it is no job's.
    let mut plain = job_process("777");
    std::fs::write(dir.path().join("gpu0.pids"), job.id().to_string()).unwrap();
    std::fs::write(dir.path().join("gpu2.pids"), plain.id().to_string()).unwrap();
    // The prolog's record: job 777 holds GPU 1, which runs nothing.
    let mapping = dir.path().join("jobs");
    std::fs::create_dir(&mapping).unwrap();
    std::fs::write(mapping.join("1"), "777\n").unwrap();
    // And job 4242 GPU 0: its process's environment, which alone anyone could claim, is
    // believed for a GPU the prolog gave the job.
    std::fs::write(mapping.join("0"), "4242\n").unwrap();
    let scenario = "[[gpu]]\nutilization = 0\nmemory_used_mib = 1024\npids_file = \"gpu0.pids\"\n\
         [[gpu]]\nutilization = 0\n\
         [[gpu]]\nutilization = 90\nmemory_used_mib = 2048\npids_file = \"gpu2.pids\"\n";
    let out = dir.path().join("exec.env");
    let job_out = dir.path().join("exec.env.4242");
    let config = format!(
        r#"[nvml]
library = "{lib}"
[sampling]
interval = "200ms"
per_process_memory = true
process_owners = true
[cost]
hourly_price_usd = 36.0
[actions]
mode = "enforce"
boot_grace = "0s"
wall = false
state_dir = "{state}"
warning = "1s"
[exposition]
names = "both"
[slurm]
enabled = true
job_mapping_dir = "{mapping}"
job_label = true
[[rules]]
name = "idle-job"
scope = "job"
metric = "gpu_utilization"
comparison = "less_than"
threshold = 0.05
period = "1s"
evaluation_periods = 2
action = "exec"
command = ["sh", "-c", "env | grep ^GPUWATCH_ > {out}.$GPUWATCH_JOB.tmp; mv {out}.$GPUWATCH_JOB.tmp {out}.$GPUWATCH_JOB"]
"#,
        lib = common::fake_library().display(),
        state = dir.path().join("state").display(),
        mapping = mapping.display(),
        out = out.display(),
    );
    let d = Daemon::start_scenario(dir, scenario, &config);
    let user = me();
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_job_gpu_allocated")
            .label("job", "4242")
            .get(s)
            .is_some()
            && metric("gpuwatch_job_gpu_allocated")
                .label("job", "777")
                .get(s)
                .is_some()
    });
    metric("gpuwatch_job_gpu_allocated")
        .label("job", "4242")
        .label("user", &user)
        .gpu(0)
        .value(1.0)
        .assert_in(&s);
    // Allocated by the prolog with no process on it: the job holds it, its user unknown.
    let unowned = s
        .named("gpuwatch_job_gpu_allocated")
        .into_iter()
        .find(|x| x.labels.get("job").map(String::as_str) == Some("777"))
        .unwrap();
    assert_eq!(unowned.labels.get("gpu").map(String::as_str), Some("1"));
    assert!(!unowned.labels.contains_key("user"), "{unowned:?}");
    // The busy GPU's process is no job's.
    assert_eq!(s.named("gpuwatch_job_gpu_allocated").len(), 2);
    // `job_label`: the GPU series carry the job holding the GPU, in both naming modes, and a
    // GPU of no job carries none.
    for (name, want) in [
        ("gpu_utilization_ratio", 0.0),
        ("DCGM_FI_DEV_GPU_UTIL", 0.0),
    ] {
        metric(name)
            .gpu(0)
            .label("hpc_job", "4242")
            .value(want)
            .assert_in(&s);
        metric(name)
            .gpu(1)
            .label("hpc_job", "777")
            .value(want)
            .assert_in(&s);
        let busy: Vec<_> = s
            .named(name)
            .into_iter()
            .filter(|x| x.labels.get("gpu").map(String::as_str) == Some("2"))
            .collect();
        assert_eq!(busy.len(), 1, "{busy:?}");
        assert!(!busy[0].labels.contains_key("hpc_job"), "{busy:?}");
    }
    // Per-process series name the user, and each user's memory is summed.
    let pid = job.id();
    metric("gpu_process_memory_used_bytes")
        .label("pid", pid)
        .label("user", &user)
        .value(1024.0 * 1024.0 * 1024.0)
        .assert_in(&s);
    metric("gpuwatch_user_gpu_memory_bytes")
        .label("user", &user)
        .value(3.0 * 1024.0 * 1024.0 * 1024.0)
        .assert_in(&s);

    // The job's rule warns, then runs its command with the job, its user and its GPU.
    d.await_action(LIMIT, "idle-job job 4242");
    let env = std::fs::read_to_string(&job_out).unwrap();
    for want in [
        "GPUWATCH_RULE=idle-job job 4242".to_string(),
        "GPUWATCH_JOB=4242".to_string(),
        format!("GPUWATCH_USER={user}"),
        "GPUWATCH_GPUS=0".to_string(),
    ] {
        assert!(env.lines().any(|l| l == want), "{want} not in:\n{env}");
    }
    let audit = d.audit();
    let warned: Vec<_> = events(&audit, "warning")
        .into_iter()
        .filter(|w| w["rule"] == "idle-job job 4242")
        .collect();
    assert_eq!(warned.len(), 1, "{audit:?}");
    assert_eq!(warned[0]["evidence"]["gpus"][0], "0");
    assert_eq!(warned[0]["evidence"]["user"], user.as_str());

    // Idle time and money go to the job; the busy GPU's user pays nothing for it.
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_job_idle_dollars_total")
            .label("job", "4242")
            .get(s)
            .is_some_and(|v| v > 0.0)
    });
    // The user's idle money: alice's job's GPUs (0 idle; 1 is job 777's, no user known).
    let user_dollars = metric("gpuwatch_user_idle_dollars_total")
        .label("user", &user)
        .get(&s)
        .unwrap();
    assert!(user_dollars > 0.0, "{user_dollars}");
    let seconds = metric("gpuwatch_job_gpu_idle_seconds")
        .label("job", "4242")
        .get(&s)
        .unwrap();
    assert!(seconds > 0.0, "{seconds}");
    // The status lists the jobs, with their user, GPUs, idle time and money.
    let status = d.get("/api/v1/status").json();
    let jobs = status["jobs"].as_array().unwrap();
    let j = jobs.iter().find(|j| j["job"] == "4242").unwrap();
    assert_eq!(j["user"], user.as_str());
    assert_eq!(j["gpus"], serde_json::json!(["0"]));
    assert!(j["idle_dollars"].as_f64().unwrap() > 0.0, "{j}");
    let page = d.get("/").body;
    assert!(page.contains("<h2>Jobs</h2>"), "{page}");
    let text = Command::new(common::BIN)
        .args(["status", "--url", &format!("http://{}", d.addr)])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(
        text.lines()
            .any(|l| l.starts_with(&format!("Job 4242 of {user} on GPU 0: idle "))),
        "{text}"
    );

    // The job's process ends: its series go at the next refresh (its cost with the step
    // after it).
    job.kill().unwrap();
    job.wait().unwrap();
    std::fs::remove_file(mapping.join("0")).unwrap(); // as its epilog does
    let s = d.await_scrape(LIMIT, |s| {
        [
            "gpuwatch_job_gpu_allocated",
            "gpuwatch_job_idle_dollars_total",
        ]
        .iter()
        .all(|m| metric(m).label("job", "4242").get(s).is_none())
    });
    metric("gpuwatch_job_gpu_idle_seconds")
        .label("job", "4242")
        .absent()
        .assert_in(&s);
    metric("gpuwatch_job_gpu_allocated")
        .label("job", "777")
        .value(1.0)
        .assert_in(&s);
    plain.kill().unwrap();
    plain.wait().unwrap();
}

#[test]
fn a_hold_of_the_job_postpones_its_rule_only() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = job_process("501");
    let mut b = job_process("502");
    std::fs::write(dir.path().join("gpu0.pids"), a.id().to_string()).unwrap();
    std::fs::write(dir.path().join("gpu1.pids"), b.id().to_string()).unwrap();
    let mapping = dir.path().join("jobs");
    std::fs::create_dir(&mapping).unwrap();
    std::fs::write(mapping.join("0"), "501\n").unwrap();
    std::fs::write(mapping.join("1"), "502\n").unwrap();
    let scenario = "[[gpu]]\nutilization = 0\npids_file = \"gpu0.pids\"\n\
                    [[gpu]]\nutilization = 0\npids_file = \"gpu1.pids\"\n";
    let state = dir.path().join("state");
    let config = format!(
        "[nvml]\nlibrary = \"{}\"\n[sampling]\ninterval = \"200ms\"\n[actions]\nboot_grace = \"0s\"\nwall = false\nstate_dir = \"{}\"\nwarning = \"1s\"\n[slurm]\nenabled = true\njob_mapping_dir = \"{}\"\n\
         [[rules]]\nname = \"idle\"\nscope = \"job\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\nthreshold = 0.05\nperiod = \"1s\"\nevaluation_periods = 1\naction = \"alert\"\n",
        common::fake_library().display(),
        state.display(),
        mapping.display()
    );
    let config_path = dir.path().join("hold.toml");
    std::fs::write(&config_path, &config).unwrap();
    let hold = Command::new(common::BIN)
        .args([
            "hold",
            "1h",
            "--job",
            "501",
            "--reason",
            "checkpointing",
            "--config",
        ])
        .arg(&config_path)
        .output()
        .unwrap();
    assert!(hold.status.success(), "{hold:?}");
    assert!(String::from_utf8_lossy(&hold.stdout).contains("hold of job 501 until"));
    let bad = Command::new(common::BIN)
        .args(["hold", "1h", "--job", "../x", "--config"])
        .arg(&config_path)
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(64), "{bad:?}");
    let d = Daemon::start_scenario(dir, scenario, &config);
    d.await_action(LIMIT, "idle job 502");
    let audit = d.audit();
    assert!(
        !events(&audit, "warning")
            .iter()
            .any(|w| w["rule"] == "idle job 501"),
        "the held job was warned: {audit:?}"
    );
    for c in [&mut a, &mut b] {
        c.kill().unwrap();
        c.wait().unwrap();
    }
}

#[test]
fn a_mig_device_belongs_to_the_job_the_prolog_gave_it() {
    let dir = tempfile::tempdir().unwrap();
    let mapping = dir.path().join("jobs");
    std::fs::create_dir(&mapping).unwrap();
    // GPU instance 1 of GPU 0 is job 900's; GPU instance 2 is nobody's.
    std::fs::write(mapping.join("0.1"), "900\n").unwrap();
    let scenario = "[[gpu]]\n\
         [[gpu.mig]]\nprofile = \"3g.40gb\"\nuuid = \"MIG-aaaaaaaa-0000-4000-8000-000000000001\"\ngpu_instance = 1\nmemory_used_mib = 100\n\
         [[gpu.mig]]\nprofile = \"3g.40gb\"\nuuid = \"MIG-aaaaaaaa-0000-4000-8000-000000000002\"\ngpu_instance = 2\nmemory_used_mib = 200\n";
    let config = format!(
        "[nvml]\nlibrary = \"{}\"\n[sampling]\ninterval = \"200ms\"\n[exposition]\nnames = \"both\"\n\
         [slurm]\nenabled = true\njob_label = true\njob_mapping_dir = \"{}\"\n",
        common::fake_library().display(),
        mapping.display()
    );
    let d = Daemon::start_scenario(dir, scenario, &config);
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_job_gpu_allocated")
            .label("job", "900")
            .get(s)
            .is_some()
    });
    metric("gpuwatch_job_gpu_allocated")
        .label("job", "900")
        .gpu(0)
        .label("gpu_instance", 1)
        .label("uuid", "MIG-aaaaaaaa-0000-4000-8000-000000000001")
        .value(1.0)
        .assert_in(&s);
    // The MIG device's series carry its job, in both naming modes; the other device's none.
    metric("gpu_memory_used_bytes")
        .label("gpu_instance", 1)
        .label("hpc_job", "900")
        .value(100.0 * 1024.0 * 1024.0)
        .assert_in(&s);
    metric("DCGM_FI_DEV_FB_USED")
        .label("GPU_I_ID", 1)
        .label("hpc_job", "900")
        .value(100.0)
        .assert_in(&s);
    for name in ["gpu_memory_used_bytes", "DCGM_FI_DEV_FB_USED"] {
        let other: Vec<_> = s
            .named(name)
            .into_iter()
            .filter(|x| {
                x.labels.get("gpu_instance").or(x.labels.get("GPU_I_ID")) == Some(&"2".to_string())
            })
            .collect();
        assert_eq!(other.len(), 1, "{name}: {other:?}");
        assert!(!other[0].labels.contains_key("hpc_job"), "{other:?}");
    }
}
