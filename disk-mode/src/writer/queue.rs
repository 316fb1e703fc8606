//! The bounded queue of work between the data streams and one writer.

use super::*;

/// Work waiting for one writer worker: bounded, so a stream that finds it
/// full stops reading its socket (TCP pushes back on the sender) until the
/// writer takes something.
pub(super) struct WorkQueue {
    pub(super) items: Mutex<(VecDeque<Work>, bool)>,
    pub(super) cap: usize,
    /// Streams waiting for room.
    pub(super) space: WaitList,
    /// Ends the writer's wait for IO completions: work arrived.
    pub(super) kicker: Kicker,
}

/// What [`WorkQueue::push`] did.
pub(super) enum Push {
    Queued,
    /// Full: the waker runs when there is room; the work comes back.
    Full(Work),
    Closed,
}

impl WorkQueue {
    pub(super) fn new(cap: usize, kicker: Kicker) -> WorkQueue {
        WorkQueue {
            items: Mutex::new((VecDeque::new(), false)),
            cap,
            space: WaitList::default(),
            kicker,
        }
    }

    pub(super) fn push(&self, work: Work, waker: &Waker) -> Push {
        {
            let mut q = lock(&self.items);
            if q.1 {
                return Push::Closed;
            }
            if q.0.len() >= self.cap {
                // Registered under the lock: a pop after it wakes us.
                self.space.add(waker);
                return Push::Full(work);
            }
            q.0.push_back(work);
        }
        self.kicker.kick();
        Push::Queued
    }

    pub(super) fn pop(&self) -> Option<Work> {
        let w = lock(&self.items).0.pop_front();
        if w.is_some() {
            self.space.wake_one();
        }
        w
    }

    /// Closed and empty: the writer may stop once its IO settled.
    pub(super) fn finished(&self) -> bool {
        let q = lock(&self.items);
        q.1 && q.0.is_empty()
    }

    pub(super) fn close(&self) {
        lock(&self.items).1 = true;
        self.kicker.kick();
        self.space.wake_all();
    }
}
