//! Each cgroup layout Slurm uses, as `/proc/PID/cgroup` shows it, and the environment fallback.

use super::*;

fn holder(job: &str, uid: Option<u32>) -> Option<Holder> {
    Some(Holder {
        job: job.into(),
        uid,
    })
}

#[test]
fn cgroup_v1_names_the_job_and_its_user() {
    let text = "12:memory:/slurm/uid_1000/job_4242/step_0/task_0\n\
                11:devices:/slurm/uid_1000/job_4242/step_0/task_0\n\
                3:cpuset:/slurm/uid_1000/job_4242/step_0\n\
                1:name=systemd:/system.slice/slurmd.service\n";
    assert_eq!(from_cgroup(text), holder("4242", Some(1000)));
    // A uid that does not read leaves the user unknown, not the job.
    assert_eq!(
        from_cgroup("12:memory:/slurm/uid_x/job_1/step_0\n"),
        holder("1", None)
    );
    // The batch step, and several slurmd on one host (`/slurm_<node>`).
    assert_eq!(
        from_cgroup("4:freezer:/slurm_node7/uid_0/job_9/step_batch\n"),
        holder("9", Some(0))
    );
}

#[test]
fn cgroup_v2_before_26_05_names_the_job() {
    for text in [
        "0::/system.slice/slurmstepd.scope/job_77/step_0/user/task_0\n",
        "0::/system.slice/slurmstepd.scope/job_77/step_extern/user/task_special\n",
        // Several slurmd on one host, a CgroupSlice of its own, and a container's prefix.
        "0::/system.slice/node3_slurmstepd.scope/job_77/step_interactive/user/task_1\n",
        "0::/docker.slice/docker-ab12.scope/slurm.slice/slurmstepd.scope/job_77/step_3/user/task_0\n",
    ] {
        assert_eq!(from_cgroup(text), holder("77", None), "{text}");
    }
}

#[test]
fn cgroup_v2_from_26_05_names_the_job_by_its_sluid() {
    let text = "0::/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_0/user/task_0\n";
    assert_eq!(from_cgroup(text), holder("sEKNKTV3WPV500", None));
    // CgroupJobIdPaths=yes keeps the numeric id.
    let text = "0::/system.slice/slurmstepd.scope/job_12/step_0/user/task_0\n";
    assert_eq!(from_cgroup(text), holder("12", None));
}

#[test]
fn slurms_own_processes_and_other_cgroups_are_no_job() {
    for text in [
        "0::/system.slice/slurmstepd.scope/system\n",
        "0::/system.slice/slurmstepd.scope/slurmd\n",
        // A SLUID-looking directory with no step under it, and one with a letter Crockford
        // leaves out.
        "0::/system.slice/slurmstepd.scope/sEKNKTV3WPV500\n",
        "0::/system.slice/slurmstepd.scope/sEKNKTV3WPVI00/step_0\n",
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        "0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-1.scope\n",
        "12:memory:/slurm/uid_1/job_/step_0\n",
        "0::/system.slice/slurmstepd.scope/job_123456789012345678901/step_0\n",
        "",
        "garbage without colons",
    ] {
        assert_eq!(from_cgroup(text), None, "{text}");
    }
}

#[test]
fn a_cgroup_is_believed_only_under_a_slurm_directory_that_root_owns() {
    use std::os::unix::fs::chown;
    let root = tempfile::tempdir().unwrap();
    let v2 = "0::/system.slice/slurmstepd.scope/job_77/step_0/user/task_0\n";
    let v1 = "12:memory:/slurm/uid_1000/job_4242/step_0\n";
    // Nothing there (another mount namespace, say): a claim.
    assert_eq!(
        of_cgroup(root.path(), v2.as_bytes()),
        Some((holder("77", None).unwrap(), Source::ForeignCgroup))
    );
    for dir in [
        "system.slice/slurmstepd.scope/job_77",
        "memory/slurm/uid_1000/job_4242",
    ] {
        std::fs::create_dir_all(root.path().join(dir)).unwrap();
    }
    let me = crate::files::effective_uid();
    let want = |source| Some(if me == 0 { Source::Cgroup } else { source });
    assert_eq!(
        of_cgroup(root.path(), v2.as_bytes()).map(|f| f.1),
        want(Source::ForeignCgroup)
    );
    assert_eq!(
        of_cgroup(root.path(), v1.as_bytes()).map(|f| f.1),
        want(Source::ForeignCgroup)
    );
    if me != 0 {
        return;
    }
    // A user's delegated subtree with a directory named like slurmstepd's: the user owns it.
    let spoof =
        "0::/user.slice/user-1000.slice/user@1000.service/x_slurmstepd.scope/job_4242/step_0\n";
    let theirs = root
        .path()
        .join("user.slice/user-1000.slice/user@1000.service/x_slurmstepd.scope");
    std::fs::create_dir_all(theirs.join("job_4242/step_0")).unwrap();
    chown(&theirs, Some(1000), Some(1000)).unwrap();
    assert_eq!(
        of_cgroup(root.path(), spoof.as_bytes()),
        Some((holder("4242", None).unwrap(), Source::ForeignCgroup))
    );
    chown(root.path().join("memory/slurm"), Some(1000), None).unwrap();
    assert_eq!(
        of_cgroup(root.path(), v1.as_bytes()).map(|f| f.1),
        Some(Source::ForeignCgroup)
    );
    // A path outside the namespace's root cannot be looked at: a claim.
    let outside = "0::/../../system.slice/slurmstepd.scope/job_77/step_0\n";
    assert_eq!(
        of_cgroup(root.path(), outside.as_bytes()).map(|f| f.1),
        Some(Source::ForeignCgroup)
    );
    assert!(
        Source::ForeignCgroup.is_claim()
            && Source::Environ.is_claim()
            && !Source::Cgroup.is_claim()
    );
}

#[test]
fn the_environment_says_the_job_where_the_cgroup_does_not() {
    let env = b"HOME=/home/a\0SLURM_JOB_ID=31337\0CUDA_VISIBLE_DEVICES=0\0";
    assert_eq!(from_environ(env).as_deref(), Some("31337"));
    assert_eq!(from_environ(b"SLURM_JOB_ID=\0"), None);
    assert_eq!(from_environ(b"SLURM_JOB_ID=12; rm -rf /\0"), None);
    assert_eq!(from_environ(b"XSLURM_JOB_ID=5\0"), None);
    assert_eq!(from_environ(b""), None);
}

/// This test's own process is in no Slurm job; one that has gone has no job and is no error.
#[test]
fn a_process_outside_slurm_or_gone_has_no_job() {
    assert_eq!(of_process(std::process::id()), None);
    assert_eq!(of_process(u32::MAX), None);
}

mod mapping {
    use super::super::mapping::*;

    #[test]
    fn file_names_are_a_gpu_a_mig_device_or_a_uuid() {
        assert_eq!(device("0"), Some(Device::Index(0)));
        assert_eq!(device("7.2"), Some(Device::Mig(7, 2)));
        assert_eq!(
            device("GPU-11111111-2222-4333-8444-555555555555"),
            Some(Device::Uuid(
                "GPU-11111111-2222-4333-8444-555555555555".into()
            ))
        );
        for bad in [
            "",
            "x",
            "1.",
            ".1",
            "1.2.3",
            "-1",
            "GPU-zz",
            "..",
            "1234567890",
        ] {
            assert_eq!(device(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_file_holds_job_ids_one_per_line() {
        let ids = |j: Jobs| (j.ids, j.skipped, j.beyond);
        assert_eq!(
            ids(jobs("42\n43\n")),
            (vec!["42".into(), "43".into()], 0, 0)
        );
        // Blank lines, `0` (an epilog's "none") and repeats are no jobs; a line that is no id
        // is skipped.
        assert_eq!(
            ids(jobs("\n42\n0\n42\n1,2\n  7_3  \n")),
            (vec!["42".into(), "7_3".into()], 1, 0)
        );
        // A busy shared GPU's file, as a prolog that appends leaves it: every job is read.
        let shared: String = (1..=100).map(|i| format!("{}\n", 1_000_000 + i)).collect();
        let j = jobs(&shared);
        assert_eq!((j.ids.len(), j.skipped, j.beyond), (100, 0, 0));
        assert_eq!(j.ids[64], "1000065");
        // Beyond the cap, job ids are not read: they are counted apart from bad lines.
        let many: String = (1..=1030).map(|i| format!("{i}\n")).collect();
        let j = jobs(&many);
        assert_eq!((j.ids.len(), j.skipped, j.beyond), (1024, 0, 6));
    }

    #[test]
    fn the_directory_is_read_bounded_and_a_missing_one_maps_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::write(p.join("0"), "101\n").unwrap();
        std::fs::write(p.join("1.3"), "102\n103\n").unwrap();
        // No device, no job: skipped, and the mapping is still known whole.
        std::fs::write(p.join("README"), "not a GPU").unwrap();
        std::fs::write(p.join("4"), "not-a-job\n").unwrap();
        let m = read(p);
        assert_eq!(
            m.jobs.get(&Device::Index(0)),
            Some(&vec!["101".to_string()])
        );
        assert_eq!(
            m.jobs.get(&Device::Mig(1, 3)),
            Some(&vec!["102".to_string(), "103".to_string()])
        );
        assert_eq!(m.jobs.len(), 2);
        assert_eq!(m.skipped, 2);
        assert_eq!(m.unknown, None);
        assert_eq!(read(&p.join("missing")), Mapping::default());
    }

    #[test]
    fn a_device_file_not_read_whole_makes_the_mapping_unknown() {
        let unknown = |setup: &dyn Fn(&std::path::Path)| {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("0"), "101\n").unwrap();
            setup(dir.path());
            let m = read(dir.path());
            // What was read is still there.
            assert_eq!(m.jobs.get(&Device::Index(0)), Some(&vec!["101".into()]));
            assert!(m.skipped > 0, "{m:?}");
            m.unknown.expect("unknown")
        };
        // Larger than the cap: it may name any job.
        let why = unknown(&|p| std::fs::write(p.join("2"), vec![b'9'; 70_000]).unwrap());
        assert!(why.contains("larger than 64 KiB"), "{why}");
        // A directory where a device file should be.
        let why = unknown(&|p| std::fs::create_dir(p.join("3")).unwrap());
        assert!(why.contains("/3"), "{why}");
        // More job ids than are read.
        let why = unknown(&|p| {
            let many: String = (1..=1100).map(|i| format!("{i}\n")).collect();
            std::fs::write(p.join("1"), many).unwrap()
        });
        assert!(why.contains("more than 1024 jobs"), "{why}");
        // A link, which is not followed.
        let why = unknown(&|p| std::os::unix::fs::symlink(p.join("0"), p.join("5")).unwrap());
        assert!(why.contains("/5"), "{why}");
    }

    /// While the prolog holds its lock, nothing is read: the mapping is unknown, not read
    /// mid-append; once it lets go, it is read. A file mid-append (no final newline) is
    /// unknown too.
    #[test]
    fn the_scripts_lock_is_waited_for_and_a_line_being_written_is_unknown() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::write(p.join("0"), "101\n").unwrap();
        let lock = std::fs::File::create(p.join(".lock")).unwrap();
        // SAFETY: flock on a descriptor this test owns.
        assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
        let m = std::thread::scope(|s| s.spawn(|| read(p)).join().unwrap());
        assert!(m.jobs.is_empty());
        assert!(m.unknown.unwrap().contains("was held"));
        drop(lock);
        assert_eq!(read(p).unknown, None);
        std::fs::write(p.join("1"), "102\n10").unwrap();
        let m = read(p);
        assert!(m.unknown.unwrap().contains("does not end with a newline"));
    }

    #[test]
    fn lock_and_temporary_files_do_not_count_as_device_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        for i in 0..1500 {
            std::fs::write(p.join(format!(".tmp.{i}")), "").unwrap();
        }
        std::fs::write(p.join("1"), "42\n").unwrap();
        let m = read(p);
        assert_eq!(m.jobs.get(&Device::Index(1)), Some(&vec!["42".into()]));
        assert_eq!((m.skipped, m.unknown), (0, None));
        // Device files beyond the cap: unknown.
        for i in 0..1030 {
            std::fs::write(p.join(format!("GPU-{i:08x}")), "").unwrap();
        }
        let m = read(p);
        assert!(m.unknown.unwrap().contains("more than 1024 device files"));
    }

    #[test]
    fn a_directory_others_can_write_is_not_read() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("jobs");
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join("0"), "101\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(read(&p).jobs.len(), 1);
        // Anyone could name any job on any GPU: nothing is read.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777)).unwrap();
        let m = read(&p);
        assert!(m.jobs.is_empty());
        assert!(m.unknown.unwrap().contains("not trusted"));
        assert!(m
            .refused
            .unwrap()
            .contains("can be written by others (mode 777)"));
        // Nor through a link.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert!(read(&link).refused.unwrap().contains("is not a directory"));
    }
}
