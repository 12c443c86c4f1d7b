//! Holds of one Slurm job or one user (`gpuwatch hold 4h --job 1234`): a file each in the
//! state directory, `hold-job-1234.json` or `hold-user-alice.json`, in `hold.json`'s format.
//! They postpone that job's (or user's) rules only.

use std::collections::BTreeMap;
use std::fs;
use std::io;

use super::{HoldFile, HoldStatus, StateDir};

/// The most subject holds read (the first by name); beyond it, the rest are not seen.
const MAX_SUBJECT_HOLDS: usize = 1024;

/// What a hold may name besides the node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Subject {
    Job(String),
    User(String),
}

/// A Slurm job id as holders name it: digits or a SLUID, with `_` and `+` for array and
/// heterogeneous jobs; at most 64 bytes.
pub fn is_job_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'+')
}

impl Subject {
    /// A job id or a user name as holders name them; `None` for anything else.
    pub fn job(id: &str) -> Option<Subject> {
        is_job_id(id).then(|| Subject::Job(id.to_string()))
    }

    pub fn user(name: &str) -> Option<Subject> {
        crate::metrics::plain_name(name).then(|| Subject::User(name.to_string()))
    }

    /// What the step keys the hold by: `job 1234`, `user alice`.
    pub fn key(&self) -> String {
        match self {
            Subject::Job(j) => format!("job {j}"),
            Subject::User(u) => format!("user {u}"),
        }
    }

    fn file(&self) -> String {
        match self {
            Subject::Job(j) => format!("hold-job-{j}.json"),
            Subject::User(u) => format!("hold-user-{u}.json"),
        }
    }

    /// The subject a file in the state directory holds, if it is a subject's hold file.
    fn of_file(name: &str) -> Option<Subject> {
        let stem = name.strip_prefix("hold-")?.strip_suffix(".json")?;
        if let Some(j) = stem.strip_prefix("job-") {
            Subject::job(j)
        } else {
            Subject::user(stem.strip_prefix("user-")?)
        }
    }
}

impl StateDir {
    /// Writes the hold of one job or user.
    pub fn set_subject_hold(&self, subject: &Subject, hold: &HoldFile) -> io::Result<()> {
        self.set_hold_at(&subject.file(), hold)
    }

    /// Removes the hold of one job or user; `Ok(false)` when there was none.
    pub fn release_subject(&self, subject: &Subject) -> io::Result<bool> {
        self.release_at(&subject.file())
    }

    /// Every job's and user's hold in the directory, by subject. One whose expiry cannot be
    /// read holds without end, as the node's does. `Err` says why they cannot all be known (the
    /// directory cannot be listed, or holds more than are read): any job or user may be held.
    pub fn subject_holds(&self) -> Result<BTreeMap<Subject, HoldStatus>, String> {
        let mut out = BTreeMap::new();
        let entries = fs::read_dir(self.path()).map_err(|e| {
            format!(
                "the job and user holds in {} cannot be listed: {e}",
                self.path().display()
            )
        })?;
        let found: Vec<(Subject, std::path::PathBuf)> = entries
            .flatten()
            .filter_map(|e| {
                let s = e.file_name().to_str().and_then(Subject::of_file)?;
                Some((s, e.path()))
            })
            .collect();
        if found.len() > MAX_SUBJECT_HOLDS {
            return Err(format!(
                "{} job and user holds, more than the {MAX_SUBJECT_HOLDS} that are read",
                found.len()
            ));
        }
        for (subject, path) in found {
            match self.hold_at(&path) {
                HoldStatus::None => {}
                h => {
                    out.insert(subject, h);
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subject_hold_is_written_read_and_released() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::new(tmp.path().join("state"));
        let job = Subject::job("1234").unwrap();
        let hold = HoldFile {
            until: "2030-01-01T00:00:00Z".into(),
            reason: "training resumes".into(),
        };
        dir.set_subject_hold(&job, &hold).unwrap();
        dir.set_subject_hold(&Subject::user("alice").unwrap(), &hold)
            .unwrap();
        let holds = dir.subject_holds().unwrap();
        assert_eq!(holds.len(), 2);
        assert!(matches!(&holds[&job], HoldStatus::Until(_, r) if r == "training resumes"));
        assert_eq!(job.key(), "job 1234");
        // The node's hold is not a subject's.
        dir.set_hold(&hold).unwrap();
        assert_eq!(dir.subject_holds().unwrap().len(), 2);
        assert!(dir.release_subject(&job).unwrap());
        assert!(!dir.release_subject(&job).unwrap());
        assert_eq!(dir.subject_holds().unwrap().len(), 1);
        // A file that cannot be read as a hold holds without end.
        std::fs::write(dir.path().join("hold-job-9.json"), "{").unwrap();
        let holds = dir.subject_holds().unwrap();
        assert_eq!(
            holds[&Subject::Job("9".into())].until(),
            Some(f64::INFINITY)
        );
    }

    #[test]
    fn holds_that_cannot_all_be_known_are_an_error_not_none() {
        // A state directory that cannot be listed (here a file in its place) may hold any job.
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("state"), "").unwrap();
        let err = StateDir::new(tmp.path().join("state"))
            .subject_holds()
            .unwrap_err();
        assert!(err.contains("cannot be listed"), "{err}");
        // More holds than are read: the ones past the cap would go unread.
        let dir = StateDir::new(tmp.path().join("many"));
        std::fs::create_dir(dir.path()).unwrap();
        for j in 0..=MAX_SUBJECT_HOLDS {
            std::fs::write(dir.path().join(format!("hold-job-{j}.json")), "{").unwrap();
        }
        let err = dir.subject_holds().unwrap_err();
        assert!(err.contains("more than the 1024"), "{err}");
    }

    #[test]
    fn only_plain_ids_and_names_are_subjects() {
        assert!(Subject::job("12_3+0").is_some());
        assert!(Subject::user("alice@corp").is_some());
        for bad in ["", "../x", "1 2", "a/b", &"9".repeat(65)] {
            assert_eq!(Subject::job(bad), None, "{bad:?}");
            assert_eq!(Subject::user(bad), None, "{bad:?}");
        }
        assert_eq!(Subject::of_file("hold-job-../x.json"), None);
        assert_eq!(Subject::of_file("hold.json"), None);
    }
}
