//! Background tasks with an owner. [`Tasks`] spawns tasks on the current (actix)
//! runtime and ends them when its owner stops ([`Tasks::stop`]) or is dropped: a task
//! either runs until then and is dropped where it waits ([`Tasks::spawn`]), or is handed
//! the [`Stop`] signal and ends by itself, finishing the work it holds
//! ([`Tasks::spawn_with_stop`]); what has not ended within the stop's wait is aborted.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Tasks that end with their owner.
pub struct Tasks {
    stop: watch::Sender<bool>,
    running: Vec<JoinHandle<()>>,
}

/// A task's stop signal: resolves once its owner stops or is gone.
#[derive(Clone)]
pub struct Stop(watch::Receiver<bool>);

impl Stop {
    pub async fn requested(mut self) {
        // An error is the owner gone without a stop: a stop too.
        let _ = self.0.wait_for(|stopped| *stopped).await;
    }
}

impl Default for Tasks {
    fn default() -> Tasks {
        Tasks { stop: watch::channel(false).0, running: Vec::new() }
    }
}

impl Tasks {
    /// Run `task` until the owner stops; it is then dropped at the point where it waits.
    pub fn spawn(&mut self, task: impl Future<Output = ()> + 'static) {
        self.spawn_with_stop(|stop| async move {
            tokio::select! {
                () = task => {}
                () = stop.requested() => {}
            }
        });
    }

    /// Run the task `start(stop)` returns; it ends by itself once `stop` resolves (taking
    /// no new work, finishing what it holds), or is aborted when the owner's wait is over.
    pub fn spawn_with_stop<F: Future<Output = ()> + 'static>(
        &mut self,
        start: impl FnOnce(Stop) -> F,
    ) {
        let stop = Stop(self.stop.subscribe());
        self.running.push(actix::spawn(start(stop)));
    }

    /// Tell every task to stop, wait up to `wait` for them to end, abort the rest.
    /// Returns how many were aborted.
    pub async fn stop(&mut self, wait: Duration) -> usize {
        self.stop.send_replace(true);
        let deadline = tokio::time::Instant::now() + wait;
        let mut aborted = 0;
        for mut task in std::mem::take(&mut self.running) {
            if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
                task.abort();
                aborted += 1;
            }
        }
        aborted
    }
}

/// An owner gone without a stop (a start that failed later) leaves nothing running.
impl Drop for Tasks {
    fn drop(&mut self) {
        self.stop.send_replace(true);
        self.running.iter().for_each(JoinHandle::abort);
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;

    fn on_actix(test: impl Future<Output = ()>) {
        actix::System::new().block_on(test);
    }

    #[test]
    fn a_spawned_loop_is_dropped_at_stop_and_one_with_the_signal_finishes_its_work() {
        on_actix(async {
            let mut tasks = Tasks::default();
            let finished = Rc::new(Cell::new(false));
            tasks.spawn(std::future::pending());
            let done = finished.clone();
            tasks.spawn_with_stop(|stop| async move {
                stop.requested().await;
                tokio::task::yield_now().await;
                done.set(true);
            });
            assert_eq!(tasks.stop(Duration::from_secs(5)).await, 0);
            assert!(finished.get(), "the task saw the signal and finished");
        });
    }

    #[test]
    fn a_task_that_ignores_the_signal_is_aborted_after_the_wait() {
        on_actix(async {
            let mut tasks = Tasks::default();
            tasks.spawn_with_stop(|_| std::future::pending());
            assert_eq!(tasks.stop(Duration::from_millis(10)).await, 1);
        });
    }

    #[test]
    fn dropping_the_owner_stops_its_tasks() {
        on_actix(async {
            let alive = Rc::new(());
            let mut tasks = Tasks::default();
            let held = alive.clone();
            tasks.spawn(async move {
                let _held = held;
                std::future::pending::<()>().await;
            });
            tokio::task::yield_now().await;
            drop(tasks);
            tokio::task::yield_now().await;
            assert_eq!(Rc::strong_count(&alive), 1, "the task and what it held are gone");
        });
    }
}
