//! Completions: how an operation posted to libfabric reports back to the
//! task (or thread) waiting for it.
//!
//! Posting creates a [`Completer`] (kept in the operation's context until
//! the progress thread reads the completion) and a [`Completion`], a future
//! the caller awaits. A caller whose buffer the operation uses must not let
//! the buffer go before the operation ends; [`Completion::wait_blocking`]
//! lets a drop guard wait for that.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use parking_lot::{Condvar, Mutex};

use crate::OfiError;

#[derive(Default)]
struct State {
    result: Option<Result<usize, OfiError>>,
    waker: Option<Waker>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    done: Condvar,
}

/// The progress side of a completion: fills it in exactly once.
pub(crate) struct Completer(Arc<Shared>);

/// The waiting side: resolves to the operation's length or error.
pub struct Completion {
    shared: Arc<Shared>,
    taken: bool,
}

/// A fresh completion pair.
pub(crate) fn pair() -> (Completer, Completion) {
    let shared = Arc::new(Shared::default());
    (
        Completer(shared.clone()),
        Completion {
            shared,
            taken: false,
        },
    )
}

impl Completer {
    pub(crate) fn complete(self, result: Result<usize, OfiError>) {
        let waker = {
            let mut s = self.0.state.lock();
            s.result = Some(result);
            s.waker.take()
        };
        self.0.done.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl Completion {
    /// Whether the operation has ended (its result may already be taken).
    pub fn is_done(&self) -> bool {
        self.taken || self.shared.state.lock().result.is_some()
    }

    /// Blocks the calling thread until the operation ends.
    pub fn wait_blocking(&mut self) -> Result<usize, OfiError> {
        if self.taken {
            return Err(OfiError::Invalid("completion already taken".into()));
        }
        let mut s = self.shared.state.lock();
        loop {
            if let Some(r) = s.result.take() {
                self.taken = true;
                return r;
            }
            self.shared.done.wait(&mut s);
        }
    }
}

impl Future for Completion {
    type Output = Result<usize, OfiError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.taken {
            return Poll::Ready(Err(OfiError::Invalid("completion already taken".into())));
        }
        let mut s = self.shared.state.lock();
        match s.result.take() {
            Some(r) => {
                drop(s);
                self.taken = true;
                Poll::Ready(r)
            }
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Awaits a completion whose operation uses a caller's buffer; if the
/// future is dropped early, blocks until the operation ends so the buffer
/// outlives it.
pub(crate) struct BufferGuard(pub(crate) Completion);

impl BufferGuard {
    /// The completion, for an operation that owns its buffer (no need to
    /// wait on drop).
    pub(crate) fn into_inner(self) -> Completion {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never dropped, so the completion is moved out once.
        unsafe { std::ptr::read(&this.0) }
    }

    pub(crate) async fn wait(mut self) -> Result<usize, OfiError> {
        (&mut self.0).await
    }
}

impl Drop for BufferGuard {
    fn drop(&mut self) {
        if !self.0.taken {
            let _ = self.0.wait_blocking();
        }
    }
}
