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

/// A daemon over real processes with one job rule (`idle-job`, or `idle-user` of user scope)
/// that runs `true` after 2 idle periods of 1 s and a 1 s warning.
fn judge_config(dir: &std::path::Path, mapping: &std::path::Path, scope: &str) -> String {
    format!(
        "[nvml]\nlibrary = \"{}\"\n[sampling]\ninterval = \"200ms\"\nprocess_owners = true\n\
         [actions]\nmode = \"enforce\"\nboot_grace = \"0s\"\nwall = false\nstate_dir = \"{}\"\nwarning = \"1s\"\n\
         [slurm]\nenabled = true\njob_mapping_dir = \"{}\"\n\
         [[rules]]\nname = \"idle-{scope}\"\nscope = \"{scope}\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\nthreshold = 0.05\nperiod = \"1s\"\nevaluation_periods = 2\naction = \"exec\"\ncommand = [\"true\"]\n",
        common::fake_library().display(),
        dir.join("state").display(),
        mapping.display()
    )
}

/// What a warning or an action of `rule` the audit log holds.
fn judged<'a>(audit: &'a [serde_json::Value], rule: &str) -> Vec<&'a serde_json::Value> {
    audit
        .iter()
        .filter(|r| {
            ["warning", "action_attempt"].contains(&r["event"].as_str().unwrap_or_default())
                && r["rule"] == rule
        })
        .collect()
}

/// Job 42 holds GPU 0 (idle) and GPU 1 (busy; its process names the job only through its
/// environment). GPU 1's mapping file lists job 42 65th, as a prolog that appends leaves a
/// shared GPU's: it is read, and the job is busy. Then the file grows past what is read: the
/// mapping is unknown, and the job keeps its state and is not judged. Once the file names
/// other jobs only, the job holds GPU 0 alone and its rule acts.
#[test]
fn a_mapping_entry_not_read_never_drops_a_busy_gpu_from_its_job() {
    let dir = tempfile::tempdir().unwrap();
    let mut busy = job_process("42");
    std::fs::write(dir.path().join("gpu1.pids"), busy.id().to_string()).unwrap();
    let mapping = dir.path().join("jobs");
    std::fs::create_dir(&mapping).unwrap();
    std::fs::write(mapping.join("0"), "42\n").unwrap();
    let others: String = (1000..1064).map(|j| format!("{j}\n")).collect();
    std::fs::write(mapping.join("1"), format!("{others}42\n")).unwrap();
    // Lock and temporary files left by prologs: not device files, and not counted as such.
    for i in 0..1100 {
        std::fs::write(mapping.join(format!(".tmp.{i}")), "").unwrap();
    }
    let scenario = "[[gpu]]\nutilization = 0\n\
                    [[gpu]]\nutilization = 90\npids_file = \"gpu1.pids\"\n";
    let config = judge_config(dir.path(), &mapping, "job");
    let d = Daemon::start_scenario(dir, scenario, &config);
    let job42 = |gpu: u32| {
        metric("gpuwatch_job_gpu_allocated")
            .label("job", "42")
            .gpu(gpu)
    };
    let s = d.await_scrape(LIMIT, |s| job42(0).get(s).is_some());
    job42(1).value(1.0).assert_in(&s);
    metric("gpuwatch_slurm_mapping_skipped")
        .value(0.0)
        .assert_in(&s);
    metric("gpuwatch_slurm_mapping_unknown")
        .value(0.0)
        .assert_in(&s);

    // Past 64 KiB: not read, so it may name job 42, and the job may be busy.
    let huge: String = (0..5000).map(|j| format!("{:020}\n", 10_000 + j)).collect();
    let tmp = mapping.join(".1.tmp");
    std::fs::write(&tmp, format!("{huge}42\n")).unwrap();
    std::fs::rename(&tmp, mapping.join("1")).unwrap();
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_slurm_mapping_unknown").get(s) == Some(1.0)
    });
    assert!(metric("gpuwatch_slurm_mapping_skipped").get(&s).unwrap() >= 1.0);
    d.await_log(LIMIT, "not read whole");
    let now = d.await_sample(LIMIT, |_| true)["timestamp"]
        .as_f64()
        .unwrap();
    // Two idle periods and the warning would have passed by now.
    d.await_time(now + 4.0);
    let audit = d.audit();
    assert!(judged(&audit, "idle-job job 42").is_empty(), "{audit:?}");

    // Read whole again, without job 42 on GPU 1: its claim there is not believed, and the
    // job is judged on GPU 0 alone.
    std::fs::write(&tmp, others).unwrap();
    std::fs::rename(&tmp, mapping.join("1")).unwrap();
    d.await_action(LIMIT, "idle-job job 42");
    busy.kill().unwrap();
    busy.wait().unwrap();
}

/// Whether this test process may make cgroups and run processes as other users.
fn root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipped: needs root, to make cgroups and run processes as other users");
    }
    root
}

/// A cgroup v1 directory made for one test under the `pids` hierarchy, removed (its
/// processes killed first) when dropped.
struct Cgroup {
    top: std::path::PathBuf,
    leaf: std::path::PathBuf,
    children: Vec<Child>,
}

impl Cgroup {
    fn new(path: &str) -> Cgroup {
        let top = std::path::PathBuf::from(format!(
            "/sys/fs/cgroup/pids/gpuwatch-test-{}",
            std::process::id()
        ));
        let leaf = top.join(path);
        std::fs::create_dir_all(&leaf)
            .unwrap_or_else(|e| panic!("cannot make {}: {e}", leaf.display()));
        Cgroup {
            top,
            leaf,
            children: Vec::new(),
        }
    }

    /// Moves `child` into the leaf.
    fn adopt(&mut self, child: Child) -> u32 {
        let pid = child.id();
        std::fs::write(self.leaf.join("cgroup.procs"), pid.to_string()).unwrap();
        self.children.push(child);
        pid
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Innermost first: cgroup directories are removed one by one.
        let mut dir = self.leaf.clone();
        while dir.starts_with(&self.top) {
            let _ = std::fs::remove_dir(&dir);
            if !dir.pop() {
                break;
            }
        }
    }
}

/// A process run as `uid` that sets `SLURM_JOB_ID`.
fn job_process_of(job: &str, uid: u32) -> Child {
    use std::os::unix::process::CommandExt;
    Command::new("sleep")
        .arg("600")
        .env("SLURM_JOB_ID", job)
        .uid(uid)
        .gid(uid)
        .spawn()
        .unwrap()
}

/// Alice (uid 4000002002) runs job 77 in a cgroup she made under her delegated systemd
/// subtree, `.../user@.../slurm/uid_4000002003/job_77/step_0`. The prolog gives job 77 her GPU,
/// so the claim counts, but the uid in the path she wrote names nobody: the job is hers, and a
/// user rule acts for her, never for the user her path names.
#[test]
fn a_cgroup_its_user_made_names_no_other_user() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut cgroup = Cgroup::new("user@4000002002.service/slurm/uid_4000002003/job_77/step_0");
    let delegated = cgroup.top.join("user@4000002002.service/slurm");
    std::os::unix::fs::chown(&delegated, Some(4_000_002_002), Some(4_000_002_002)).unwrap();
    let alice = cgroup.adopt(job_process_of("none", 4_000_002_002));
    std::fs::write(dir.path().join("gpu0.pids"), alice.to_string()).unwrap();
    let mapping = dir.path().join("jobs");
    std::fs::create_dir(&mapping).unwrap();
    std::fs::write(mapping.join("0"), "77\n").unwrap();
    let scenario = "[[gpu]]\nutilization = 0\npids_file = \"gpu0.pids\"\n";
    let config = judge_config(dir.path(), &mapping, "user");
    let d = Daemon::start_scenario(dir, scenario, &config);
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_job_gpu_allocated")
            .label("job", "77")
            .get(s)
            .is_some()
    });
    metric("gpuwatch_job_gpu_allocated")
        .label("job", "77")
        .label("user", "4000002002")
        .gpu(0)
        .value(1.0)
        .assert_in(&s);
    d.await_action(LIMIT, "idle-user user 4000002002");
    let audit = d.audit();
    assert!(
        judged(&audit, "idle-user user 4000002003").is_empty(),
        "{audit:?}"
    );
    drop(d);
    drop(cgroup);
}

/// Job 42 is alice's (uid 4000002001): her process on GPU 1 names it in its environment. A
/// process of uid 4000002002 on GPU 0, which the prolog also gives job 42, claims the job too,
/// and is read first. Neither claim can say whose the job is: its user is unknown, not the
/// first claimant's, and its command is not handed a user.
#[test]
fn another_users_claim_does_not_name_a_jobs_user() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut intruder = job_process_of("42", 4_000_002_002);
    let mut alice = job_process_of("42", 4_000_002_001);
    std::fs::write(dir.path().join("gpu0.pids"), intruder.id().to_string()).unwrap();
    std::fs::write(dir.path().join("gpu1.pids"), alice.id().to_string()).unwrap();
    let mapping = dir.path().join("jobs");
    std::fs::create_dir(&mapping).unwrap();
    std::fs::write(mapping.join("0"), "42\n").unwrap();
    std::fs::write(mapping.join("1"), "42\n").unwrap();
    let scenario = "[[gpu]]\nutilization = 0\npids_file = \"gpu0.pids\"\n\
                    [[gpu]]\nutilization = 0\npids_file = \"gpu1.pids\"\n";
    let config = judge_config(dir.path(), &mapping, "job");
    let d = Daemon::start_scenario(dir, scenario, &config);
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_job_gpu_allocated")
            .label("job", "42")
            .gpu(1)
            .get(s)
            .is_some()
    });
    for series in s.named("gpuwatch_job_gpu_allocated") {
        assert!(!series.labels.contains_key("user"), "{series:?}");
    }
    d.await_action(LIMIT, "idle-job job 42");
    let audit = d.audit();
    let warned = judged(&audit, "idle-job job 42");
    assert_eq!(warned[0]["evidence"].get("user"), None, "{audit:?}");
    for c in [&mut intruder, &mut alice] {
        c.kill().unwrap();
        c.wait().unwrap();
    }
}
