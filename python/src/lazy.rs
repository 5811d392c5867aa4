//! `Lazy`: a Python value built once, on first access, by the thread that
//! holds the GIL. pyo3's `PyOnceLock` lets go of the GIL around every first
//! build so that it can never deadlock with the interpreter; that release
//! and retake cost about 1,000 instructions per event for `Event.data`
//! (bench/callgrind-per-event). `Lazy` keeps the GIL on the common path and
//! lets go only when it must wait: when another thread is building the
//! value (which means that builder let go of the GIL inside its build).

use parking_lot::{Condvar, Mutex};
use pyo3::prelude::*;

enum State {
    Empty,
    Building,
    Ready(Py<PyAny>),
}

pub struct Lazy {
    state: Mutex<State>,
    built: Condvar,
}

impl Default for Lazy {
    fn default() -> Self {
        Lazy {
            state: Mutex::new(State::Empty),
            built: Condvar::new(),
        }
    }
}

impl Lazy {
    /// The value, built by `f` if no thread has built it yet. A failed build
    /// leaves it unbuilt: the next access tries again. The lock is never
    /// held while Python runs, so a build that lets go of the GIL cannot
    /// deadlock a thread waiting here.
    pub fn get_or_try_init(
        &self,
        py: Python<'_>,
        f: impl FnOnce() -> PyResult<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        loop {
            let mut s = self.state.lock();
            match &*s {
                State::Ready(v) => return Ok(v.clone_ref(py)),
                State::Empty => {
                    *s = State::Building;
                    break;
                }
                State::Building => {
                    drop(s);
                    py.detach(|| {
                        let mut s = self.state.lock();
                        while matches!(*s, State::Building) {
                            self.built.wait(&mut s);
                        }
                    });
                }
            }
        }
        // A build that panics leaves the value unbuilt and wakes the
        // waiters (one of them builds it), as a failed one does.
        let unbuilt = Unbuilt(self);
        let built = f();
        std::mem::forget(unbuilt);
        self.settle(match &built {
            Ok(v) => State::Ready(v.clone_ref(py)),
            Err(_) => State::Empty,
        });
        built
    }

    fn settle(&self, state: State) {
        *self.state.lock() = state;
        self.built.notify_all();
    }
}

/// Resets a `Lazy` being built to empty if its build unwinds.
struct Unbuilt<'a>(&'a Lazy);

impl Drop for Unbuilt<'_> {
    fn drop(&mut self) {
        self.0.settle(State::Empty);
    }
}
