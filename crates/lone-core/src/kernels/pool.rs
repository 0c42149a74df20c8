//! A persistent thread pool for the hot path.
//!
//! `threads() - 1` workers help the calling thread with one job at a time. A job is a closure
//! that pulls work items from a shared counter until none are left ([`parallel_for`]), so it
//! does not matter which threads take part: the caller always runs it, and a worker runs it
//! only if it *joins* before the caller has finished. Publishing a job bumps a generation in
//! one atomic state word; workers spin on it for a short while (decode issues a new matmul
//! every few microseconds), then park on a condvar so an idle process does not burn CPU.
//! When the caller runs out of work it *closes* the job (freezing the join count) and waits
//! only for the workers that joined. A worker that was descheduled (an oversubscribed
//! machine) is therefore never waited for; the caller just does more of the work.
//!
//! Jobs that arrive while the pool is busy (another thread is running one) or from inside a
//! job run on the calling thread alone.

use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle worker spins for the next job before parking.
const SPIN: Duration = Duration::from_micros(500);
/// Busy-wait iterations before a waiting thread starts yielding its core.
const SPIN_BEFORE_YIELD: u32 = 2_000;

/// State word: generation << 32 | CLOSED | joined workers.
const CLOSED: u64 = 1 << 31;
const JOINED: u64 = CLOSED - 1;

/// The job, type-erased: a pointer to a `&(dyn Fn() + Sync)` on the caller's stack.
type JobRef = *const (dyn Fn() + Sync);

struct Shared {
    state: AtomicU64,
    /// Joined workers that have finished the current job.
    finished: AtomicUsize,
    /// Written by the caller before it publishes a generation (SeqCst store of `state`), read
    /// by a worker only after it joined that generation (a successful CAS on `state`); the
    /// caller does not touch it again until every joined worker has finished.
    job: UnsafeCell<Option<JobRef>>,
    /// Most workers that may join the current job (written before it is published).
    cap: AtomicUsize,
    sleepers: AtomicUsize,
    park: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is only accessed under the publish/join/finish protocol described above; the
// closure it points to is `Sync`.
unsafe impl Sync for Shared {}
// SAFETY: as above.
unsafe impl Send for Shared {}

pub struct Pool {
    n: usize,
    shared: Arc<Shared>,
    /// Held while a job is in flight: concurrent callers run alone instead.
    busy: Mutex<()>,
}

thread_local! {
    static IN_JOB: Cell<bool> = const { Cell::new(false) };
}

impl Pool {
    fn new(n: usize) -> Pool {
        let n = n.max(1);
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            finished: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            cap: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            park: Mutex::new(()),
            wake: Condvar::new(),
        });
        for tid in 1..n {
            let s = shared.clone();
            std::thread::Builder::new()
                .name(format!("lone-worker-{tid}"))
                .spawn(move || worker(s))
                .expect("spawning a worker thread");
        }
        Pool {
            n,
            shared,
            busy: Mutex::new(()),
        }
    }

    pub fn threads(&self) -> usize {
        self.n
    }

    /// Run `f` on the calling thread and on every worker that joins in time; return when all
    /// of those calls have returned. `f` must share out its work itself (each call keeps
    /// taking items until none are left): any subset of the threads may run it.
    #[cfg(test)]
    pub fn run(&self, f: &(dyn Fn() + Sync)) {
        self.run_with(self.n, f)
    }

    /// [`Pool::run`] on at most `threads` threads (the caller included).
    pub fn run_with(&self, threads: usize, f: &(dyn Fn() + Sync)) {
        let nested = IN_JOB.with(|c| c.get());
        let guard = if self.n > 1 && threads > 1 && !nested {
            self.busy.try_lock().ok()
        } else {
            None
        };
        let Some(_guard) = guard else {
            f();
            return;
        };
        let s = &*self.shared;
        // SAFETY: only the lifetime is erased. `f` outlives this call: the job is closed
        // below and every worker that joined has finished before we return; workers that did
        // not join never dereference it.
        let ptr: JobRef = unsafe { std::mem::transmute::<&(dyn Fn() + Sync), JobRef>(f) };
        // SAFETY: no worker reads `job` now: the previous job is closed and all its joined
        // workers have finished, and the next generation is not yet published.
        unsafe { *s.job.get() = Some(ptr) };
        s.finished.store(0, Ordering::SeqCst);
        s.cap.store(threads - 1, Ordering::SeqCst);
        let gen = (s.state.load(Ordering::SeqCst) >> 32) + 1;
        s.state.store(gen << 32, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.park.lock().unwrap();
            s.wake.notify_all();
        }
        IN_JOB.with(|c| c.set(true));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        IN_JOB.with(|c| c.set(false));
        let joined = (s.state.fetch_or(CLOSED, Ordering::SeqCst) & JOINED) as usize;
        let mut spins = 0u32;
        while s.finished.load(Ordering::Acquire) < joined {
            spins = spins.saturating_add(1);
            if spins < SPIN_BEFORE_YIELD {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        if let Err(p) = r {
            std::panic::resume_unwind(p);
        }
    }
}

fn worker(s: Arc<Shared>) {
    IN_JOB.with(|c| c.set(true));
    // The pool starts at generation 0; a job may be published before this thread runs.
    let mut seen = 0u64;
    loop {
        // Wait (spin, then yield, then park) for a new generation.
        let start = Instant::now();
        let mut spins = 0u32;
        let mut st = s.state.load(Ordering::SeqCst);
        while st >> 32 == seen {
            spins = spins.wrapping_add(1);
            if spins < SPIN_BEFORE_YIELD {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            if spins.is_multiple_of(64) && start.elapsed() > SPIN {
                let mut guard = s.park.lock().unwrap();
                s.sleepers.fetch_add(1, Ordering::SeqCst);
                while s.state.load(Ordering::SeqCst) >> 32 == seen {
                    guard = s.wake.wait(guard).unwrap();
                }
                s.sleepers.fetch_sub(1, Ordering::SeqCst);
            }
            st = s.state.load(Ordering::SeqCst);
        }
        seen = st >> 32;
        // Join unless the caller has already closed this generation.
        let joined = loop {
            if st & CLOSED != 0
                || st >> 32 != seen
                || (st & JOINED) as usize >= s.cap.load(Ordering::SeqCst)
            {
                break false;
            }
            match s
                .state
                .compare_exchange_weak(st, st + 1, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => break true,
                Err(cur) => st = cur,
            }
        };
        if !joined {
            continue;
        }
        // SAFETY: we joined generation `seen`, so the caller wrote `job` before publishing it
        // and keeps the closure alive until we increment `finished`.
        let f = unsafe { (*s.job.get()).expect("a published job") };
        // SAFETY: as above.
        let f = unsafe { &*f };
        // A panicking job aborts the process rather than leaving the caller waiting.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
            eprintln!("lone: a kernel panicked on a worker thread");
            std::process::abort();
        }
        s.finished.fetch_add(1, Ordering::Release);
    }
}

static THREADS: AtomicUsize = AtomicUsize::new(0);
static POOL: OnceLock<Pool> = OnceLock::new();

/// Set the number of threads (including the caller) before the pool is first used. Returns
/// false if the pool already exists (the earlier setting stays).
pub fn set_threads(n: usize) -> bool {
    if POOL.get().is_some() {
        return false;
    }
    THREADS.store(n.max(1), Ordering::SeqCst);
    true
}

/// The global pool, created on first use with `set_threads`' value, else `LONE_THREADS` (a
/// positive number), else the number of CPUs.
pub fn global() -> &'static Pool {
    POOL.get_or_init(|| {
        let from_env = || {
            std::env::var("LONE_THREADS")
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .filter(|&n| n > 0)
        };
        let n = match THREADS.load(Ordering::SeqCst) {
            0 => from_env()
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
            n => n,
        };
        Pool::new(n)
    })
}

/// Split `0..n` into chunks of `chunk` and run `f(range)` for each on the pool, handing out
/// chunks dynamically (an atomic counter), so a slow or preempted thread does not hold up the
/// op. Runs inline when there is a single chunk.
pub fn parallel_for(n: usize, chunk: usize, f: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
    let chunk = chunk.max(1);
    if n == 0 {
        return;
    }
    let pool = global();
    let threads = super::threads();
    if n <= chunk || threads == 1 {
        f(0..n);
        return;
    }
    let next = AtomicUsize::new(0);
    pool.run_with(threads, &|| loop {
        let start = next.fetch_add(chunk, Ordering::Relaxed);
        if start >= n {
            break;
        }
        f(start..(start + chunk).min(n));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_once() {
        for n in [0usize, 1, 7, 64, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            parallel_for(n, 3, &|r| {
                for i in r {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                }
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }

    #[test]
    fn nested_and_concurrent_jobs_run() {
        let total = AtomicUsize::new(0);
        std::thread::scope(|sc| {
            for _ in 0..3 {
                sc.spawn(|| {
                    for _ in 0..200 {
                        parallel_for(16, 1, &|r| {
                            parallel_for(4, 1, &|r2| {
                                total.fetch_add(r.len() * r2.len(), Ordering::Relaxed);
                            });
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 3 * 200 * 16 * 4);
    }

    /// A thread cap of 1 (a model's `Compute { threads: Some(1) }`) keeps every chunk of a
    /// parallel region on the calling thread; without it the pool's workers may join.
    #[test]
    fn a_thread_cap_of_one_runs_on_the_caller_alone() {
        let me = std::thread::current().id();
        let seen = Mutex::new(Vec::new());
        let work = |r: std::ops::Range<usize>| {
            // Long enough per chunk for a worker to join if it may.
            std::thread::sleep(Duration::from_micros(200 * r.len() as u64));
            seen.lock()
                .unwrap()
                .push((std::thread::current().id(), r.len()));
        };
        let c = crate::kernels::Compute {
            mode: None,
            threads: Some(1),
        };
        {
            let _scope = c.enter(false);
            assert_eq!(crate::kernels::threads(), 1);
            parallel_for(64, 1, &work);
        }
        let ids = std::mem::take(&mut *seen.lock().unwrap());
        assert_eq!(ids.iter().map(|&(_, n)| n).sum::<usize>(), 64);
        assert!(
            ids.iter().all(|&(t, _)| t == me),
            "a capped region ran on a worker"
        );
        assert_eq!(crate::kernels::threads(), global().threads());
    }

    #[test]
    fn empty_job_overhead() {
        let pool = global();
        for _ in 0..100 {
            pool.run(&|| {});
        }
        let iters = 2000;
        let t = Instant::now();
        for _ in 0..iters {
            pool.run(&|| {});
        }
        let per = t.elapsed() / iters;
        eprintln!("empty pool job: {per:?} with {} threads", pool.threads());
        // Generous: shared CI machines get preempted; a few µs is the expectation.
        assert!(per < Duration::from_millis(1), "{per:?}");
    }
}
