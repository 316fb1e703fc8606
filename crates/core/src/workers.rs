//! The data workers: a fixed set of threads per process (one per online
//! core unless `--threads`/`--cpus` say otherwise, see [`crate::cpus`]),
//! each running many [`Task`]s (data streams) over non-blocking sockets
//! with epoll.
//!
//! The pool is shared by every session of the process: a server running 16
//! sessions of 35 streams has the same few workers as one running a single
//! stream, so threads never grow with streams or sessions, and the
//! round-robin below is fair across sessions too.
//!
//! A task runs in turns. Each turn moves at most [`TURN_BYTES`] and says
//! how it ended ([`Progress`]): it waits for its socket (readable,
//! writable) and/or an instant, or for a [`Waker`] (a disk block, a free
//! buffer), or it yields because its allowance is spent, or it is done.
//! Yielded tasks run again in the next round, after every task that became
//! ready meanwhile: each round gives every ready task at most one turn, so
//! with 1024 streams on two workers every stream moves within a few rounds
//! and none starves. Readiness comes from the `polling` crate's poller
//! (epoll on Linux), level-triggered, so a task that stops before its
//! socket would block is reported again; a task that waits only for a
//! waker or a timer is taken out of the poller meanwhile. The admission
//! lobby (`longhaul-admission`) waits on the same kind of poller.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::num::NonZeroUsize;
use std::os::fd::{BorrowedFd, RawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use polling::{Event, Events, PollMode, Poller};

use crate::cpus::{self, Affinity, Topology};
use crate::error::{Error, Result};

/// Most bytes one turn moves before the task yields to the others. As large
/// as a 2 MiB socket buffer's usable space, so a ready socket is usually
/// filled or emptied in one turn; 1024 streams x 4 MiB is still a round of
/// well under a second per worker at loopback speeds.
pub(crate) const TURN_BYTES: usize = 4 << 20;

/// Keys pack a slot's generation above its index (`key`): 64 bits.
const _: () = assert!(
    usize::BITS == 64,
    "the workers' poller keys need a 64-bit usize"
);

/// Once the poller has failed a wait, a worker waits at most this long, so
/// its inbox is still seen should the poller's notifications stop.
const WAIT_AFTER_ERROR: Duration = Duration::from_millis(10);

/// Events one wait returns at most.
const MAX_EVENTS: NonZeroUsize = NonZeroUsize::new(256).expect("not zero");

/// What a task waits for on its socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interest {
    read: bool,
    write: bool,
}

impl Interest {
    /// Nothing on the socket (a waker or a timer).
    pub(crate) const NONE: Interest = Interest {
        read: false,
        write: false,
    };
    pub(crate) const READ: Interest = Interest {
        read: true,
        write: false,
    };
    pub(crate) const WRITE: Interest = Interest {
        read: false,
        write: true,
    };
}

/// How a turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Run again when the socket is ready for `on`, at `until`, or when
    /// the task's waker fires, whichever comes first.
    Wait {
        on: Interest,
        until: Option<Instant>,
    },
    /// The turn's allowance is spent and there is more to do right away.
    Yield,
    /// Nothing more to do; the task is dropped.
    Done,
}

impl Progress {
    pub fn readable() -> Progress {
        Progress::Wait {
            on: Interest::READ,
            until: None,
        }
    }

    pub fn writable() -> Progress {
        Progress::Wait {
            on: Interest::WRITE,
            until: None,
        }
    }

    /// Until the waker fires.
    pub fn woken() -> Progress {
        Progress::Wait {
            on: Interest::NONE,
            until: None,
        }
    }

    /// At `t` (or when woken).
    pub fn at(t: Instant) -> Progress {
        Progress::Wait {
            on: Interest::NONE,
            until: Some(t),
        }
    }
}

/// What a worker runs: a data stream, in practice.
pub(crate) trait Task: Send {
    /// The socket whose readiness the task waits for, open while the task
    /// waits on it; -1 once the task has none (it is then run again to meet
    /// that, not waited for).
    fn fd(&self) -> RawFd;
    /// One turn; never blocks.
    fn turn(&mut self, turn: &Turn<'_>) -> Progress;
}

/// What a task is given for one turn.
pub(crate) struct Turn<'a> {
    /// Bytes the turn may move before yielding.
    pub(crate) allowance: usize,
    waker: &'a Waker,
}

impl Turn<'_> {
    /// Wakes this task; hand it to whatever the task waits for.
    pub(crate) fn waker(&self) -> &Waker {
        self.waker
    }
}

/// Makes a waiting task run again (cheap, callable from any thread; a wake
/// for a finished task is ignored).
#[derive(Clone)]
pub struct Waker {
    worker: Arc<Shared>,
    id: u64,
}

impl std::fmt::Debug for Waker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Waker({})", self.id)
    }
}

impl Waker {
    pub(crate) fn wake(&self) {
        self.worker.send(Message::Wake(self.id));
    }
}

/// Tasks waiting for something (a block, a buffer, room in a queue): the
/// producer wakes one per item it makes available, or all at the end.
/// Each task is listed once however often it registers.
#[derive(Debug, Default)]
pub struct WaitList {
    waiting: Mutex<VecDeque<Waker>>,
}

impl WaitList {
    pub fn add(&self, waker: &Waker) {
        let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if !w.iter().any(|x| x.id == waker.id) {
            w.push_back(waker.clone());
        }
    }

    pub fn wake_one(&self) {
        let first = {
            let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
            w.pop_front()
        };
        if let Some(w) = first {
            w.wake();
        }
    }

    pub fn wake_all(&self) {
        let all = std::mem::take(&mut *self.waiting.lock().unwrap_or_else(|e| e.into_inner()));
        for w in all {
            w.wake();
        }
    }
}

enum Message {
    Add(u64, Box<dyn Task>),
    Wake(u64),
}

/// The part of a worker other threads see.
struct Shared {
    /// The worker's sockets; notified when the inbox gets a message.
    poller: Poller,
    inbox: Mutex<Vec<Message>>,
    /// Whether the inbox has messages the worker has not taken yet (saves a
    /// notification per message while the worker is busy).
    signalled: AtomicBool,
    /// Tasks on this worker (for placing new ones).
    load: AtomicUsize,
}

impl Shared {
    fn send(&self, m: Message) {
        self.inbox.lock().unwrap_or_else(|e| e.into_inner()).push(m);
        self.signal();
    }

    fn signal(&self) {
        // SeqCst, as the poller's own flag behind `notify`: the two flags
        // are ordered alike on every side.
        if !self.signalled.swap(true, Ordering::SeqCst) {
            // The poller does not report a failed eventfd write; should one
            // fail, the worker still looks at the inbox within
            // WAIT_AFTER_ERROR (see `Worker::run`).
            let _ = self.poller.notify();
        }
    }
}

/// The process's data workers.
pub(crate) struct Pool {
    workers: Vec<Arc<Shared>>,
}

static PLACEMENT: OnceLock<Vec<Affinity>> = OnceLock::new();
static POOL: OnceLock<std::result::Result<Pool, String>> = OnceLock::new();
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Sets the workers of this process (`--threads`, `--cpus`) before the
/// first stream starts. An error names the bad value, or says the pool
/// already runs with another placement.
pub fn configure(threads: Option<usize>, cpus: Option<&[usize]>) -> Result<()> {
    let placement = cpus::place(threads, cpus, &Topology::here())?;
    let set = PLACEMENT.get_or_init(|| placement.clone());
    if *set != placement {
        return Err(Error::Usage(
            "the data workers are already configured differently in this process".into(),
        ));
    }
    Ok(())
}

/// The process's pool, started on first use.
pub(crate) fn pool() -> Result<&'static Pool> {
    POOL.get_or_init(|| {
        let placement = PLACEMENT
            .get_or_init(|| cpus::place(None, None, &Topology::here()).unwrap_or(vec![None]))
            .clone();
        Pool::start(placement).map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| {
        Error::io(
            "starting the data workers",
            std::io::Error::other(e.clone()),
        )
    })
}

impl Pool {
    fn start(placement: Vec<Affinity>) -> std::io::Result<Pool> {
        let mut workers = Vec::with_capacity(placement.len());
        for (i, affinity) in placement.iter().enumerate() {
            let shared = Arc::new(Shared {
                poller: Poller::new()?,
                inbox: Mutex::new(Vec::new()),
                signalled: AtomicBool::new(false),
                load: AtomicUsize::new(0),
            });
            let s = shared.clone();
            let affinity = affinity.clone();
            std::thread::Builder::new()
                .name(format!("lh-data-{i}"))
                .spawn(move || Worker::new(s, affinity).run())?;
            workers.push(shared);
        }
        Ok(Pool { workers })
    }

    /// Tasks each worker runs right now.
    pub(crate) fn loads(&self) -> Vec<usize> {
        self.workers
            .iter()
            .map(|w| w.load.load(Ordering::Relaxed))
            .collect()
    }

    /// Hands `tasks` to the least loaded workers, all at once (one message
    /// batch and one wake-up per worker); returns each task's waker.
    pub(crate) fn spawn(&self, tasks: Vec<Box<dyn Task>>) -> Vec<Waker> {
        let mut loads: Vec<usize> = self.loads();
        let mut batches: Vec<Vec<Message>> = self.workers.iter().map(|_| Vec::new()).collect();
        let mut wakers = Vec::with_capacity(tasks.len());
        for task in tasks {
            let (w, _) = loads
                .iter()
                .enumerate()
                .min_by_key(|(_, l)| **l)
                .expect("the pool has workers");
            loads[w] += 1;
            let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
            self.workers[w].load.fetch_add(1, Ordering::Relaxed);
            batches[w].push(Message::Add(id, task));
            wakers.push(Waker {
                worker: self.workers[w].clone(),
                id,
            });
        }
        for (worker, batch) in self.workers.iter().zip(batches) {
            if !batch.is_empty() {
                worker
                    .inbox
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend(batch);
                worker.signal();
            }
        }
        wakers
    }
}

struct Slot {
    task: Option<Box<dyn Task>>,
    id: u64,
    waker: Waker,
    /// Bumped whenever the slot is reused; poller keys carry it.
    generation: u32,
    /// What the fd is registered for; `None` while out of the poller.
    registered: Option<Interest>,
    /// The instant the task asked to run at, if any.
    timer: Option<Instant>,
    /// Last round the task had its turn in.
    round: u64,
}

/// A worker thread's own state.
struct Worker {
    shared: Arc<Shared>,
    affinity: Affinity,
    slots: Vec<Slot>,
    free: Vec<usize>,
    ids: HashMap<u64, usize>,
    timers: BinaryHeap<Reverse<(Instant, usize, u32)>>,
    /// Tasks to run next round: they yielded, or were woken or added.
    next: Vec<(usize, u32)>,
    round: u64,
}

/// A task's key in the poller: its slot, and the slot's generation so that
/// an event for a finished task is not taken for its slot's next one.
fn key(slot: usize, generation: u32) -> usize {
    ((generation as usize) << 32) | slot
}

/// The slot and generation a [`key`] packed.
fn unkey(key: usize) -> (usize, u32) {
    (key & 0xffff_ffff, (key >> 32) as u32)
}

impl Worker {
    fn new(shared: Arc<Shared>, affinity: Affinity) -> Worker {
        Worker {
            shared,
            affinity,
            slots: Vec::new(),
            free: Vec::new(),
            ids: HashMap::new(),
            timers: BinaryHeap::new(),
            next: Vec::new(),
            round: 0,
        }
    }

    fn run(mut self) {
        if let Some(cpus) = &self.affinity {
            if let Err(e) = cpus::pin_current_thread(cpus) {
                crate::logline::server(format!(
                    "data worker: cannot pin to CPUs {}: {e}",
                    cpus::format_list(cpus)
                ));
            }
        }
        let mut events = Events::with_capacity(MAX_EVENTS);
        let mut failing = false;
        loop {
            self.round += 1;
            let mut timeout = if self.next.is_empty() {
                self.timeout()
            } else {
                Some(Duration::ZERO)
            };
            if failing {
                timeout = Some(timeout.map_or(WAIT_AFTER_ERROR, |t| t.min(WAIT_AFTER_ERROR)));
            }
            events.clear();
            if let Err(e) = self.shared.poller.wait(&mut events, timeout) {
                // Not seen on a valid poller (its timerfd, epoll and eventfd
                // calls fail only on bad descriptors). Said once; the worker
                // goes on with timers and its inbox, and never spins.
                if !failing {
                    crate::logline::server(format!(
                        "data worker: waiting for sockets failed: {e}; \
                         waking every {} ms from now on",
                        WAIT_AFTER_ERROR.as_millis()
                    ));
                }
                failing = true;
                events.clear();
                std::thread::sleep(Duration::from_millis(1));
            }
            let mut batch = std::mem::take(&mut self.next);
            if self.shared.signalled.load(Ordering::SeqCst) {
                self.inbox(&mut batch);
            }
            for ev in events.iter() {
                batch.push(unkey(ev.key));
            }
            self.due_timers(&mut batch);
            for (slot, generation) in batch {
                self.run_turn(slot, generation);
            }
        }
    }

    /// How long until the next timer, rounded up to the millisecond (the
    /// timers due within one millisecond share one wake-up, as paced streams'
    /// slots do by the thousand); `None` without one.
    fn timeout(&mut self) -> Option<Duration> {
        while let Some(Reverse((t, slot, generation))) = self.timers.peek().copied() {
            if !self.timer_is_live(t, slot, generation) {
                self.timers.pop();
                continue;
            }
            let left = t.saturating_duration_since(Instant::now());
            return Some(Duration::from_millis(
                left.as_micros().div_ceil(1000).min(u64::MAX as u128) as u64,
            ));
        }
        None
    }

    fn timer_is_live(&self, t: Instant, slot: usize, generation: u32) -> bool {
        self.slots
            .get(slot)
            .is_some_and(|s| s.generation == generation && s.timer == Some(t))
    }

    fn due_timers(&mut self, batch: &mut Vec<(usize, u32)>) {
        let now = Instant::now();
        while let Some(Reverse((t, slot, generation))) = self.timers.peek().copied() {
            if t > now {
                break;
            }
            self.timers.pop();
            if self.timer_is_live(t, slot, generation) {
                self.slots[slot].timer = None;
                batch.push((slot, generation));
            }
        }
    }

    fn inbox(&mut self, batch: &mut Vec<(usize, u32)>) {
        // Cleared before the inbox is taken: a message sent after this
        // signals again, so none is left behind.
        self.shared.signalled.store(false, Ordering::SeqCst);
        let messages =
            std::mem::take(&mut *self.shared.inbox.lock().unwrap_or_else(|e| e.into_inner()));
        for m in messages {
            match m {
                Message::Add(id, task) => batch.push(self.add(id, task)),
                Message::Wake(id) => {
                    if let Some(&slot) = self.ids.get(&id) {
                        batch.push((slot, self.slots[slot].generation));
                    }
                }
            }
        }
    }

    fn add(&mut self, id: u64, task: Box<dyn Task>) -> (usize, u32) {
        let waker = Waker {
            worker: self.shared.clone(),
            id,
        };
        let slot = match self.free.pop() {
            Some(i) => {
                let s = &mut self.slots[i];
                s.task = Some(task);
                s.id = id;
                s.waker = waker;
                s.registered = None;
                s.timer = None;
                s.round = 0;
                i
            }
            None => {
                self.slots.push(Slot {
                    task: Some(task),
                    id,
                    waker,
                    generation: 0,
                    registered: None,
                    timer: None,
                    round: 0,
                });
                self.slots.len() - 1
            }
        };
        self.ids.insert(id, slot);
        (slot, self.slots[slot].generation)
    }

    fn run_turn(&mut self, slot: usize, generation: u32) {
        let round = self.round;
        let Some(s) = self.slots.get_mut(slot) else {
            return;
        };
        if s.generation != generation || s.round == round {
            return;
        }
        let Some(task) = s.task.as_mut() else {
            return;
        };
        s.round = round;
        let turn = Turn {
            allowance: TURN_BYTES,
            waker: &s.waker,
        };
        // A task that panics is finished (its drop tells its owner).
        let progress =
            catch_unwind(AssertUnwindSafe(|| task.turn(&turn))).unwrap_or(Progress::Done);
        match progress {
            Progress::Yield => {
                s.timer = None;
                self.next.push((slot, generation));
            }
            Progress::Wait { on, until } => {
                self.register(slot, on);
                let s = &mut self.slots[slot];
                if until != s.timer {
                    s.timer = until;
                    if let Some(t) = until {
                        self.timers.push(Reverse((t, slot, generation)));
                    }
                }
            }
            Progress::Done => self.remove(slot),
        }
    }

    /// Puts the task's fd in the poller for `on`, or takes it out for NONE.
    fn register(&mut self, slot: usize, on: Interest) {
        let poller = &self.shared.poller;
        let s = &mut self.slots[slot];
        let Some(task) = &s.task else {
            return;
        };
        let fd = task.fd();
        let want = (on != Interest::NONE).then_some(on);
        // Already watched for this, on a socket it still has. (A socket
        // closed under the poller leaves it silently: asking again for the
        // same readiness on fd -1 must not wait for an event that cannot
        // come.)
        if want == s.registered && (fd >= 0 || want.is_none()) {
            return;
        }
        let event = |on: Interest| Event::new(key(slot, s.generation), on.read, on.write);
        // SAFETY (both): the task owns the fd and keeps it open while it is
        // in the poller; `remove` takes it out before the task is dropped.
        // A task without a socket (fd -1) is refused before either (the
        // poller would take -1 for a BorrowedFd, which std forbids).
        let r = match (s.registered, want) {
            (None, None) => Ok(()),
            _ if fd < 0 => Err(std::io::Error::from_raw_os_error(libc::EBADF)),
            (None, Some(on)) => unsafe { poller.add_with_mode(fd, event(on), PollMode::Level) },
            (Some(_), want) => {
                let fd = unsafe { BorrowedFd::borrow_raw(fd) };
                match want {
                    Some(on) => poller.modify_with_mode(fd, event(on), PollMode::Level),
                    None => poller.delete(fd),
                }
            }
        };
        match r {
            Ok(()) => s.registered = want,
            // The fd cannot be watched (closed under us): run the task again
            // so it meets the error itself.
            Err(_) => {
                s.registered = None;
                self.next.push((slot, s.generation));
            }
        }
    }

    fn remove(&mut self, slot: usize) {
        self.register(slot, Interest::NONE);
        let s = &mut self.slots[slot];
        s.task = None;
        s.timer = None;
        s.generation = s.generation.wrapping_add(1);
        self.ids.remove(&s.id);
        self.free.push(slot);
        self.shared.load.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Counts its turns; done after `turns`, waiting for a timer in between.
    struct Ticker {
        sock: TcpStream,
        turns: u32,
        done: Option<mpsc::Sender<u32>>,
        seen: u32,
    }

    impl Task for Ticker {
        fn fd(&self) -> RawFd {
            self.sock.as_raw_fd()
        }
        fn turn(&mut self, _turn: &Turn<'_>) -> Progress {
            self.seen += 1;
            if self.seen == self.turns {
                let _ = self.done.take().unwrap().send(self.seen);
                return Progress::Done;
            }
            if self.seen.is_multiple_of(2) {
                Progress::Yield
            } else {
                Progress::at(Instant::now() + Duration::from_millis(1))
            }
        }
    }

    #[test]
    fn tasks_run_to_the_end_on_timers_and_yields() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let (tx, rx) = mpsc::channel();
        let tasks: Vec<Box<dyn Task>> = (0..50)
            .map(|_| {
                Box::new(Ticker {
                    sock: TcpStream::connect(l.local_addr().unwrap()).unwrap(),
                    turns: 10,
                    done: Some(tx.clone()),
                    seen: 0,
                }) as Box<dyn Task>
            })
            .collect();
        let pool = pool().unwrap();
        pool.spawn(tasks);
        for _ in 0..50 {
            assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 10);
        }
    }

    /// Waits for its waker only.
    struct Sleeper {
        sock: TcpStream,
        done: Option<mpsc::Sender<()>>,
        turns: u32,
    }

    impl Task for Sleeper {
        fn fd(&self) -> RawFd {
            self.sock.as_raw_fd()
        }
        fn turn(&mut self, _turn: &Turn<'_>) -> Progress {
            self.turns += 1;
            if self.turns == 1 {
                return Progress::woken();
            }
            let _ = self.done.take().unwrap().send(());
            Progress::Done
        }
    }

    #[test]
    fn a_waker_runs_a_waiting_task() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let (tx, rx) = mpsc::channel();
        let task = Sleeper {
            sock: TcpStream::connect(l.local_addr().unwrap()).unwrap(),
            done: Some(tx),
            turns: 0,
        };
        let wakers = pool().unwrap().spawn(vec![Box::new(task)]);
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "ran without a wake"
        );
        wakers[0].wake();
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
        wakers[0].wake(); // finished: ignored
    }

    #[test]
    fn keys_give_back_their_slot_and_generation() {
        for (slot, generation) in [(0, 0), (1, 1), (0xffff_ffff, u32::MAX), (7, 1 << 31)] {
            assert_eq!(unkey(key(slot, generation)), (slot, generation));
        }
    }

    /// Waits to read on a socket, then loses it (its fd becomes -1) and
    /// asks to read twice more: once still registered for reading, once
    /// not registered at all.
    struct Loser {
        sock: Option<TcpStream>,
        done: Option<mpsc::Sender<u32>>,
        turns: u32,
    }

    impl Task for Loser {
        fn fd(&self) -> RawFd {
            self.sock.as_ref().map_or(-1, |s| s.as_raw_fd())
        }
        fn turn(&mut self, _turn: &Turn<'_>) -> Progress {
            self.turns += 1;
            match self.turns {
                1 | 3 => Progress::readable(),
                2 => {
                    self.sock = None;
                    Progress::readable()
                }
                _ => {
                    let _ = self.done.take().unwrap().send(self.turns);
                    Progress::Done
                }
            }
        }
    }

    #[test]
    fn a_task_whose_socket_is_gone_runs_again_to_meet_it() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let (tx, rx) = mpsc::channel();
        let task = Loser {
            sock: Some(TcpStream::connect(l.local_addr().unwrap()).unwrap()),
            done: Some(tx),
            turns: 0,
        };
        pool().unwrap().spawn(vec![Box::new(task)]);
        let (mut peer, _) = l.accept().unwrap();
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "ran on without its socket readable"
        );
        std::io::Write::write_all(&mut peer, b"x").unwrap();
        // Readable: turn 2 drops the socket and asks to read on fd -1; the
        // poller is not asked about it, and turns 3 and 4 follow at once.
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 4);
    }
}
