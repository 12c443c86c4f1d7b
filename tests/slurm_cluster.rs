//! gpuwatch against a real Slurm: munge, a controller and one node on loopback (Debian's
//! `munge`, `slurmctld` and `slurmd`, which `scripts/test` installs), with four GPUs as a gres
//! (character devices made in the test, one per fake GPU) and the shipped prolog and epilog.
//! Real jobs are submitted with `sbatch`; the fake NVML reports one job's real processes (from
//! `scontrol listpids`) on the GPU Slurm gave it, and the other job runs nothing on its GPU.
//!
//! Needs root (Slurm's daemons run as root here, and the test makes device nodes), and the three
//! daemons on the `PATH` or in `/usr/sbin`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{events, metric, Daemon};

const LIMIT: Duration = Duration::from_secs(60);
const GPUS: u32 = 4;

/// Finds a program on the `PATH` or in `/usr/sbin`, or says what to install.
fn program(name: &str) -> PathBuf {
    let dirs = std::env::var("PATH").unwrap_or_default();
    std::env::split_paths(&dirs)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("{name} is not installed: this test needs Debian's munge, slurmctld, slurmd and slurm-client (scripts/test installs them)")
        })
}

/// A Slurm cluster of one node, stopped (jobs cancelled, daemons killed) when dropped.
struct Cluster {
    dir: tempfile::TempDir,
    daemons: Vec<Child>,
    mapping: PathBuf,
}

impl Cluster {
    fn start() -> Cluster {
        assert_eq!(
            // SAFETY: geteuid has no preconditions and cannot fail.
            unsafe { libc::geteuid() },
            0,
            "this test runs Slurm's daemons as root"
        );
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let mapping = d.join("job-mapping");
        for sub in ["munge", "state", "spool", "dev", "log"] {
            std::fs::create_dir(d.join(sub)).unwrap();
        }
        use std::os::unix::fs::PermissionsExt;
        let perms = |p: &Path, mode| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        perms(d, 0o711);
        perms(&d.join("munge"), 0o711);
        let key: Vec<u8> = (0..1024).map(|i| (i * 7 + 13) as u8).collect();
        std::fs::write(d.join("munge/munge.key"), key).unwrap();
        perms(&d.join("munge/munge.key"), 0o400);
        // One character device per fake GPU, as gres.conf wants (a copy of /dev/null's numbers).
        for i in 0..GPUS {
            let path = std::ffi::CString::new(format!("{}/dev/nvidia{i}", d.display())).unwrap();
            // SAFETY: `path` is a NUL-terminated string that outlives the call.
            let rc =
                unsafe { libc::mknod(path.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
            assert_eq!(rc, 0, "mknod: {}", std::io::Error::last_os_error());
        }
        // The shipped prolog and epilog, told where the mapping directory is.
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        for script in ["prolog", "epilog"] {
            let wrapper = d.join(format!("{script}.sh"));
            std::fs::write(
                &wrapper,
                format!(
                    "#!/bin/sh\nGPUWATCH_JOB_MAPPING_DIR={} exec sh {}\n",
                    mapping.display(),
                    root.join(format!("deploy/slurm/{script}.sh")).display()
                ),
            )
            .unwrap();
            perms(&wrapper, 0o755);
        }
        let host = String::from_utf8(Command::new("hostname").arg("-s").output().unwrap().stdout)
            .unwrap()
            .trim()
            .to_string();
        let socket = d.join("munge/munge.socket");
        let conf = format!(
            "ClusterName=gpuwatch\nSlurmctldHost={host}(127.0.0.1)\nSlurmUser=root\nSlurmdUser=root\n\
             AuthType=auth/munge\nAuthInfo=socket={socket}\nCredType=cred/munge\n\
             SlurmctldPort={ctld}\nSlurmdPort={slurmd}\n\
             StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool\n\
             SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd.pid\n\
             SlurmctldLogFile={d}/log/slurmctld.log\nSlurmdLogFile={d}/log/slurmd.log\n\
             ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n\
             SchedulerType=sched/builtin\nSelectType=select/cons_tres\nSelectTypeParameters=CR_Core\nReturnToService=2\nMpiDefault=none\n\
             Prolog={d}/prolog.sh\nEpilog={d}/epilog.sh\n\
             GresTypes=gpu\nNodeName=gw0 NodeHostname={host} NodeAddr=127.0.0.1 CPUs=2 Gres=gpu:{GPUS} State=UNKNOWN\n\
             PartitionName=main Nodes=gw0 Default=YES MaxTime=INFINITE State=UP\n",
            socket = socket.display(),
            ctld = common::free_port(),
            slurmd = common::free_port(),
            d = d.display(),
        );
        std::fs::write(d.join("slurm.conf"), conf).unwrap();
        std::fs::write(
            d.join("gres.conf"),
            format!(
                "NodeName=gw0 Name=gpu File={}/dev/nvidia[0-{}]\n",
                d.display(),
                GPUS - 1
            ),
        )
        .unwrap();
        let mut cluster = Cluster {
            dir,
            daemons: Vec::new(),
            mapping,
        };
        let d = cluster.dir.path().to_path_buf();
        let spawn = |cmd: &mut Command| {
            cmd.env("SLURM_CONF", d.join("slurm.conf"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .unwrap()
        };
        use std::os::unix::process::CommandExt;
        cluster.daemons.push(spawn(
            Command::new(program("munged"))
                .args(["-F", "--force", "--key-file"])
                .arg(d.join("munge/munge.key"))
                .arg("--socket")
                .arg(&socket)
                .arg("--pid-file")
                .arg(d.join("munge/munged.pid"))
                .arg("--seed-file")
                .arg(d.join("munge/seed")),
        ));
        cluster.wait("munge's socket", || socket.exists());
        cluster.daemons.push(spawn(
            Command::new(program("slurmctld"))
                .args(["-D", "-f"])
                .arg(d.join("slurm.conf")),
        ));
        cluster.daemons.push(spawn(
            Command::new(program("slurmd"))
                .args(["-D", "-N", "gw0", "-f"])
                .arg(d.join("slurm.conf")),
        ));
        cluster.wait("the node to be idle", || {
            cluster
                .run("sinfo", &["-h", "-n", "gw0", "-o", "%T"])
                .trim()
                == "idle"
        });
        cluster
    }

    /// Runs a Slurm command against this cluster; its stdout.
    fn run(&self, cmd: &str, args: &[&str]) -> String {
        let out = Command::new(program(cmd))
            .args(args)
            .env("SLURM_CONF", self.dir.path().join("slurm.conf"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn wait(&self, what: &str, cond: impl Fn() -> bool) {
        let start = Instant::now();
        while !cond() {
            if start.elapsed() > LIMIT {
                let log = |f: &str| {
                    std::fs::read_to_string(self.dir.path().join("log").join(f)).unwrap_or_default()
                };
                panic!(
                    "Slurm: no {what} within {LIMIT:?}\nslurmctld:\n{}\nslurmd:\n{}",
                    log("slurmctld.log"),
                    log("slurmd.log")
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Submits a job holding one GPU; its id, once it runs.
    fn submit(&self) -> String {
        let out = self.run(
            "sbatch",
            &["--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 300"],
        );
        let id = out
            .trim()
            .strip_prefix("Submitted batch job ")
            .unwrap_or_else(|| panic!("sbatch said {out:?}"))
            .to_string();
        self.wait("running job", || {
            self.run("squeue", &["-h", "-j", &id, "-o", "%T"]).trim() == "RUNNING"
        });
        id
    }

    /// The GPU Slurm gave a job, from `scontrol show job -d`'s `GRES=gpu:1(IDX:N)`.
    fn gpu_of(&self, job: &str) -> u32 {
        let text = self.run("scontrol", &["show", "job", "-d", job]);
        let idx = text
            .split("IDX:")
            .nth(1)
            .unwrap_or_else(|| panic!("no GPU index in {text}"));
        idx.split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }

    /// The job's processes, from `scontrol listpids`.
    fn pids_of(&self, job: &str) -> Vec<u32> {
        self.run("scontrol", &["listpids", job])
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next()?.parse().ok())
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.run("scancel", &["--full", "-u", "root"]);
        let start = Instant::now();
        while !self.run("squeue", &["-h"]).trim().is_empty() && start.elapsed() < LIMIT / 2 {
            std::thread::sleep(Duration::from_millis(200));
        }
        for d in self.daemons.iter_mut().rev() {
            // SAFETY: kill takes plain integers; the group is the daemon's own (process_group(0)).
            unsafe { libc::kill(-(d.id() as i32), libc::SIGKILL) };
            let _ = d.wait();
        }
    }
}

#[test]
fn a_real_slurm_jobs_gpus_are_attributed_judged_and_let_go() {
    let cluster = Cluster::start();
    let dir = tempfile::tempdir().unwrap();
    let mut scenario = String::new();
    for i in 0..GPUS {
        std::fs::write(dir.path().join(format!("gpu{i}.pids")), "").unwrap();
        scenario.push_str(&format!(
            "[[gpu]]\nutilization = 0\npids_file = \"gpu{i}.pids\"\n"
        ));
    }
    let out = dir.path().join("exec");
    let config = format!(
        r#"[nvml]
library = "{lib}"
[sampling]
interval = "200ms"
[actions]
mode = "enforce"
boot_grace = "0s"
wall = false
warning = "1s"
state_dir = "{state}"
[slurm]
enabled = true
job_mapping_dir = "{mapping}"
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
        mapping = cluster.mapping.display(),
        out = out.display(),
    );
    let work = cluster.submit();
    let idle = cluster.submit();
    let (work_gpu, idle_gpu) = (cluster.gpu_of(&work), cluster.gpu_of(&idle));
    assert_ne!(work_gpu, idle_gpu);
    // The fake NVML shows the first job's real processes on the GPU Slurm gave it; the second
    // job runs nothing on its GPU, which only the prolog's mapping tells.
    let pids = cluster.pids_of(&work);
    assert!(!pids.is_empty(), "scontrol listpids {work} listed nothing");
    let list: Vec<String> = pids.iter().map(u32::to_string).collect();
    std::fs::write(
        dir.path().join(format!("gpu{work_gpu}.pids")),
        list.join("\n"),
    )
    .unwrap();

    let d = Daemon::start_scenario(dir, &scenario, &config);
    let s = d.await_scrape(LIMIT, |s| {
        [&work, &idle].iter().all(|j| {
            metric("gpuwatch_job_gpu_allocated")
                .label("job", j)
                .get(s)
                .is_some()
        }) && metric("gpuwatch_job_gpu_allocated")
            .label("job", &work)
            .label("user", "root")
            .get(s)
            .is_some()
    });
    metric("gpuwatch_job_gpu_allocated")
        .label("job", &work)
        .label("user", "root")
        .gpu(work_gpu)
        .value(1.0)
        .assert_in(&s);
    metric("gpuwatch_job_gpu_allocated")
        .label("job", &idle)
        .gpu(idle_gpu)
        .value(1.0)
        .assert_in(&s);

    // The job rule warns, then runs its command with the job, its user and its GPU.
    let file = d.dir.path().join(format!("exec.{work}"));
    d.await_action(LIMIT, &format!("idle-job job {work}"));
    let env = std::fs::read_to_string(&file).unwrap();
    for want in [
        format!("GPUWATCH_JOB={work}"),
        "GPUWATCH_USER=root".to_string(),
        format!("GPUWATCH_GPUS={work_gpu}"),
    ] {
        assert!(env.lines().any(|l| l == want), "{want} not in:\n{env}");
    }
    let audit = d.audit();
    assert!(events(&audit, "warning")
        .iter()
        .any(|w| w["rule"] == format!("idle-job job {work}").as_str()));

    // Cancelled: its processes end and the epilog takes its GPU off the mapping, so its series
    // go.
    cluster.run("scancel", &[&work]);
    d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_job_gpu_allocated")
            .label("job", &work)
            .get(s)
            .is_none()
    });
    assert!(!cluster.mapping.join(work_gpu.to_string()).exists());
    let s = d.scrape();
    metric("gpuwatch_job_gpu_allocated")
        .label("job", &idle)
        .value(1.0)
        .assert_in(&s);
}
