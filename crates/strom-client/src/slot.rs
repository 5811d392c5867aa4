//! A one-time result shared by many waiters, usable both blocking
//! (`wait`) and from any async executor (`poll`). One slot serves a whole
//! batch, so per-event futures cost a reference count, not an allocation.

use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::error::Error;

pub(crate) struct Slot<T> {
    state: Mutex<State<T>>,
    cond: Condvar,
}

enum State<T> {
    Pending(Vec<Waker>),
    Done(Result<T, Error>),
}

impl<T: Clone> Slot<T> {
    pub fn new() -> Self {
        Slot {
            state: Mutex::new(State::Pending(Vec::new())),
            cond: Condvar::new(),
        }
    }

    pub fn complete(&self, r: Result<T, Error>) {
        let mut st = self.state.lock();
        if let State::Pending(wakers) = std::mem::replace(&mut *st, State::Done(r)) {
            drop(st);
            self.cond.notify_all();
            for w in wakers {
                w.wake();
            }
        }
    }

    fn take(st: &State<T>) -> Option<Result<T, Error>> {
        match st {
            State::Done(Ok(v)) => Some(Ok(v.clone())),
            State::Done(Err(e)) => Some(Err(e.shared())),
            State::Pending(_) => None,
        }
    }

    pub fn is_done(&self) -> bool {
        matches!(*self.state.lock(), State::Done(_))
    }

    /// Blocks until done, or until `timeout` passes (then `None`).
    pub fn wait(&self, timeout: Option<Duration>) -> Option<Result<T, Error>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut st = self.state.lock();
        loop {
            if let Some(r) = Self::take(&st) {
                return Some(r);
            }
            match deadline {
                None => self.cond.wait(&mut st),
                Some(d) => {
                    if self.cond.wait_until(&mut st, d).timed_out() {
                        return Self::take(&st);
                    }
                }
            }
        }
    }

    pub fn poll(&self, cx: &mut Context<'_>) -> Poll<Result<T, Error>> {
        let mut st = self.state.lock();
        if let Some(r) = Self::take(&st) {
            return Poll::Ready(r);
        }
        if let State::Pending(w) = &mut *st {
            if !w.iter().any(|x| x.will_wake(cx.waker())) {
                w.push(cx.waker().clone());
            }
        }
        Poll::Pending
    }
}
