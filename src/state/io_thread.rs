//! Where the daemon's blocking file I/O runs, so that it never stalls the async worker.
//!
//! - What it does on every sample (the activity vetoes' `/proc` scan, the hold file, the state
//!   save) runs on one thread of its own, `gpuwatch-io`, through [`on_io_thread`]. Always the
//!   same thread: the runtime's blocking pool hands work to its idle threads in turn, so work
//!   that comes every second would keep several of them alive, each with the stack pages it
//!   has touched.
//! - What it does rarely (an audit record, startup) runs in place through [`off_async`]: the
//!   worker hands its other tasks to another thread first.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::OnceLock;

type Job = Box<dyn FnOnce() + Send>;

/// The I/O thread's queue, started on first use; `None` if the thread could not be started.
static QUEUE: OnceLock<Option<mpsc::Sender<Job>>> = OnceLock::new();

fn queue() -> Option<&'static mpsc::Sender<Job>> {
    QUEUE
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<Job>();
            let started = std::thread::Builder::new()
                .name("gpuwatch-io".into())
                .spawn(move || rx.into_iter().for_each(|job| job()));
            match started {
                Ok(_) => Some(tx),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start the I/O thread; file I/O runs on the async worker's thread, handed off");
                    None
                }
            }
        })
        .as_ref()
}

/// Runs `f` on the I/O thread and waits for it, without blocking the async worker. Calls run
/// one at a time, in order. A panic in `f` is resumed here. Where the thread could not be
/// started, `f` runs through [`off_async`].
pub async fn on_io_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let Some(queue) = queue() else {
        return off_async(f);
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        // The caller may have stopped waiting; then the result is dropped.
        let _ = tx.send(std::panic::catch_unwind(AssertUnwindSafe(f)));
    });
    // The thread never ends while the queue is held (a job's panic is caught), so a job is
    // never refused; if one were, it runs here.
    if let Err(mpsc::SendError(job)) = queue.send(job) {
        off_async(job);
    }
    match rx.await {
        Ok(Ok(t)) => t,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        // A job always sends its result: only the thread's death could drop one unsent.
        Err(_) => panic!("the I/O thread ended with a job unanswered"),
    }
}

/// Waits, at most `limit`, until every job handed to the I/O thread so far has run, and says
/// whether they all did. Jobs run in order, so an empty job's turn comes after them.
pub async fn drain(limit: std::time::Duration) -> bool {
    tokio::time::timeout(limit, on_io_thread(|| ()))
        .await
        .is_ok()
}

/// Runs blocking file I/O (fsyncs, /proc scans) in place, so that it does not stall an async
/// worker: on a multi-threaded runtime the worker hands its other tasks off first. Elsewhere it
/// just runs.
pub fn off_async<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_on_one_thread_in_order_and_a_panic_reaches_the_caller() {
        let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let job = |i: u32| {
            let order = std::sync::Arc::clone(&order);
            on_io_thread(move || {
                order.lock().unwrap().push(i);
                std::thread::current().name().map(str::to_string)
            })
        };
        let names = tokio::join!(job(0), job(1), job(2), job(3));
        assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3]);
        for name in [names.0, names.1, names.2, names.3] {
            assert_eq!(name.as_deref(), Some("gpuwatch-io"));
        }
        let caught = tokio::spawn(on_io_thread(|| -> u32 { panic!("a job's panic") })).await;
        let panic = caught
            .expect_err("the panic reaches the caller")
            .into_panic();
        assert_eq!(panic.downcast_ref::<&str>(), Some(&"a job's panic"));
        // The thread survives it.
        assert_eq!(on_io_thread(|| 7).await, 7);
    }

    /// A job the caller stopped waiting for (as a watch aborted at shutdown does) still holds
    /// back `drain` until it has run; a job that never ends holds it back only until the limit.
    #[tokio::test]
    async fn drain_waits_for_the_jobs_already_handed_over_and_no_longer() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        use std::time::{Duration, Instant};

        // Polled once: the job is handed to the I/O thread, and the caller waits for it.
        async fn hand_over<T>(
            job: impl std::future::Future<Output = T>,
        ) -> impl std::future::Future<Output = T> {
            let mut job = Box::pin(job);
            let polled = tokio::time::timeout(Duration::ZERO, &mut job).await;
            assert!(polled.is_err(), "the job is held");
            job
        }

        let (release, held) = mpsc::channel::<()>();
        let done = Arc::new(AtomicBool::new(false));
        let waiter = hand_over(on_io_thread({
            let done = Arc::clone(&done);
            move || {
                held.recv().unwrap();
                done.store(true, Ordering::SeqCst);
            }
        }))
        .await;
        // The caller stops waiting; the job stays queued.
        drop(waiter);
        let mut drained = Box::pin(drain(Duration::from_secs(60)));
        assert!(tokio::time::timeout(Duration::ZERO, &mut drained)
            .await
            .is_err());
        assert!(!done.load(Ordering::SeqCst));
        release.send(()).unwrap();
        assert!(drained.await, "drain ends once the job has run");
        assert!(done.load(Ordering::SeqCst));

        // A job that does not end within the limit.
        let (release, held) = mpsc::channel::<()>();
        let stuck = hand_over(on_io_thread(move || held.recv().unwrap())).await;
        let t0 = Instant::now();
        assert!(!drain(Duration::from_millis(50)).await);
        assert!(t0.elapsed() >= Duration::from_millis(50));
        release.send(()).unwrap();
        stuck.await;
    }
}
