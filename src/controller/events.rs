//! The controller's Events, through `kube`'s recorder, one recorder per object and reason for
//! as long as what is said of it stays the same.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, Recorder, Reporter};
use kube::Client;

/// At most this many objects' and reasons' last notes are remembered; past it, memory starts
/// afresh (the next Event of each is one of its own, not part of a series).
const MAX_SUBJECTS: usize = 4096;

/// Publishes Events. `kube`'s recorder folds an Event into the series of the last one on the
/// same object with the same reason and action (for six minutes), keeping that one's note: a
/// warning with a new due time, or a failure with a new cause, would be read in the old words.
/// So a note unlike the last one of its object and reason is an Event of its own, and the same
/// note again adds to that Event's series.
pub struct Recorders {
    client: Client,
    reporter: Reporter,
    /// For each object and reason: the last note, and the recorder that published it.
    last: Mutex<HashMap<(String, String), (String, Recorder)>>,
}

impl Recorders {
    pub fn new(client: Client, reporter: Reporter) -> Recorders {
        Recorders {
            client,
            reporter,
            last: Mutex::new(HashMap::new()),
        }
    }

    /// Publishes `event` on `regarding`.
    pub async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let field = |f: &Option<String>| f.clone().unwrap_or_default();
        let subject = (
            [
                field(&regarding.namespace),
                field(&regarding.kind),
                field(&regarding.name),
                field(&regarding.uid),
            ]
            .join("/"),
            event.reason.clone(),
        );
        let note = event.note.clone().unwrap_or_default();
        let recorder = {
            let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
            match last.get(&subject) {
                Some((said, recorder)) if *said == note => recorder.clone(),
                _ => {
                    if last.len() >= MAX_SUBJECTS {
                        last.clear();
                    }
                    let recorder = Recorder::new(self.client.clone(), self.reporter.clone());
                    last.insert(subject, (note, recorder.clone()));
                    recorder
                }
            }
        };
        recorder.publish(event, regarding).await
    }
}
