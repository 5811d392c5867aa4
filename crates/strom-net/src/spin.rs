//! Busy-polling for latency: keep a task polling a future for a short
//! window before it lets its worker thread park.
//!
//! A parked thread costs a wake-up when the next frame arrives, and on a
//! virtual machine an idle CPU that halted costs an exit to the host as
//! well: tens of microseconds per hop. [`busy_poll`] polls the future, and
//! while it is pending and the window lasts, yields to the runtime instead
//! of parking. A yield lets every other task on the worker run and the I/O
//! driver poll its sockets, so nothing starves; only the worker's thread
//! stays awake. Once the window ends the future is awaited as usual, so an
//! idle connection costs at most one window of CPU.

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::{Duration, Instant};

/// Awaits `fut`, busy-polling for up to `window` first (zero: plain await).
pub async fn busy_poll<F: Future>(fut: F, window: Duration) -> F::Output {
    let mut fut = pin!(fut);
    if window.is_zero() {
        return fut.await;
    }
    let until = Instant::now() + window;
    loop {
        let polled = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await;
        if let Poll::Ready(out) = polled {
            return out;
        }
        if Instant::now() >= until {
            return fut.await;
        }
        tokio::task::yield_now().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_future_ready_during_the_window_is_returned() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(2)).await;
            tx.send(7u32).unwrap();
        });
        let got = busy_poll(rx, Duration::from_secs(5)).await.unwrap();
        assert_eq!(got, 7);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_spinning_task_lets_others_on_its_worker_run() {
        // One worker thread: the sender can only run if the spin yields.
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move { tx.send(1u8).unwrap() });
        let t = Instant::now();
        assert_eq!(busy_poll(rx, Duration::from_secs(2)).await.unwrap(), 1);
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "the spin starved the sender"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_future_not_ready_within_the_window_is_still_awaited() {
        let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let waiter = tokio::spawn(busy_poll(rx, Duration::from_millis(1)));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        tx.send(3).unwrap();
        assert_eq!(waiter.await.unwrap().unwrap(), 3);
    }
}
