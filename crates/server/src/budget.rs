//! In-flight caps of a shard and of each connection: counters that requests take from and
//! give back, with a wait for readers that pause over a cap (backpressure).
//!
//! A shard is one thread, so a budget is a `Cell` and an `Rc`, not a semaphore: taking and
//! giving back are an add and a subtract (a tokio semaphore locks a mutex on every release,
//! and a request holds four of them). Fairness: while a reader waits, nobody takes from the
//! budget without waiting too, so a paused reader is not starved by the ones still reading.

use std::cell::Cell;
use std::rc::Rc;

use tokio::sync::Notify;

/// A count of units (requests or bytes) in flight, at most `cap`.
pub struct Budget {
    cap: usize,
    used: Cell<usize>,
    /// Readers waiting to take: while there are any, nobody takes without waiting.
    waiters: Cell<usize>,
    /// Waiters plus those waiting for the budget to drain: a release wakes them.
    watchers: Cell<usize>,
    freed: Notify,
}

/// Units taken from a [`Budget`]; given back when dropped.
pub struct Held {
    budget: Rc<Budget>,
    units: usize,
}

impl Budget {
    /// A budget of `cap` units (at least 1).
    pub fn new(cap: usize) -> Rc<Budget> {
        Rc::new(Budget {
            cap: cap.max(1),
            used: Cell::new(0),
            waiters: Cell::new(0),
            watchers: Cell::new(0),
            freed: Notify::new(),
        })
    }

    /// Units in flight.
    pub fn in_use(&self) -> usize {
        self.used.get()
    }

    /// Takes `units` (at most the cap, so that a large request takes the whole budget
    /// instead of never fitting) if they fit now and nobody waits; `None` otherwise.
    #[inline]
    pub fn try_take(self: &Rc<Self>, units: usize) -> Option<Held> {
        if self.waiters.get() > 0 {
            return None;
        }
        self.fit(units)
    }

    /// True if [`Self::try_take`] of `units` would succeed now; takes nothing.
    #[inline]
    pub fn fits_now(&self, units: usize) -> bool {
        self.waiters.get() == 0 && self.used.get() + units.min(self.cap) <= self.cap
    }

    /// Takes `units` (at most the cap) that [`Self::fits_now`] just said fit, without a
    /// [`Held`]: the caller gives back the returned count with [`Self::give_back`].
    #[inline]
    pub fn take_fitting(&self, units: usize) -> usize {
        debug_assert!(self.fits_now(units), "taken only when it fits");
        let units = units.min(self.cap);
        self.used.set(self.used.get() + units);
        debug_assert!(
            self.used.get() <= self.cap,
            "a budget never exceeds its cap"
        );
        units
    }

    /// Gives back `units` taken by [`Self::take_fitting`] or kept by [`Held::keep`], and
    /// wakes those waiting for room.
    #[inline]
    pub fn give_back(&self, units: usize) {
        debug_assert!(
            self.used.get() >= units,
            "a budget gives back what was taken"
        );
        self.used.set(self.used.get() - units);
        if self.watchers.get() > 0 {
            self.freed.notify_waiters();
        }
    }

    /// Takes `units` (at most the cap), waiting until they fit.
    pub async fn take(self: &Rc<Self>, units: usize) -> Held {
        if let Some(held) = self.try_take(units) {
            return held;
        }
        let _waiting = Waiting::new(self, true);
        loop {
            // Created before the check: a release in between still wakes it.
            let freed = self.freed.notified();
            if let Some(held) = self.fit(units) {
                return held;
            }
            freed.await;
        }
    }

    /// Waits until nothing is in flight.
    pub async fn drained(&self) {
        let _watching = Waiting::new(self, false);
        loop {
            let freed = self.freed.notified();
            if self.used.get() == 0 {
                return;
            }
            freed.await;
        }
    }

    #[inline]
    fn fit(self: &Rc<Self>, units: usize) -> Option<Held> {
        let units = units.min(self.cap);
        let used = self.used.get();
        if used + units > self.cap {
            return None;
        }
        self.used.set(used + units);
        debug_assert!(
            self.used.get() <= self.cap,
            "a budget never exceeds its cap"
        );
        Some(Held {
            budget: self.clone(),
            units,
        })
    }
}

impl Held {
    /// Keeps the units taken past this value: the owner gives back the returned count with
    /// [`Budget::give_back`].
    pub fn keep(mut self) -> usize {
        std::mem::take(&mut self.units)
    }
}

impl Drop for Held {
    #[inline]
    fn drop(&mut self) {
        // Nothing held (kept, or a zero-byte frame): nothing freed, nobody to wake.
        if self.units > 0 {
            self.budget.give_back(self.units);
        }
    }
}

/// Counts a watcher, and a waiting taker if `taker`, for as long as it waits (also when its
/// future is dropped).
struct Waiting<'a> {
    budget: &'a Budget,
    taker: bool,
}

impl<'a> Waiting<'a> {
    fn new(budget: &'a Budget, taker: bool) -> Waiting<'a> {
        budget.watchers.set(budget.watchers.get() + 1);
        if taker {
            budget.waiters.set(budget.waiters.get() + 1);
        }
        Waiting { budget, taker }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let b = self.budget;
        debug_assert!(b.watchers.get() > 0 && (!self.taker || b.waiters.get() > 0));
        b.watchers.set(b.watchers.get() - 1);
        if self.taker {
            b.waiters.set(b.waiters.get() - 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    fn poll_once<F: Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
        f.poll(&mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn takes_up_to_the_cap_and_gives_back_on_drop() {
        let b = Budget::new(3);
        let one = b.try_take(1).expect("room");
        let two = b.try_take(2).expect("room");
        assert_eq!(b.in_use(), 3);
        assert!(b.try_take(1).is_none(), "over the cap");
        drop(one);
        assert_eq!(b.in_use(), 2);
        let again = b.try_take(1).expect("room again");
        drop((two, again));
        assert_eq!(b.in_use(), 0);
    }

    #[test]
    fn a_request_larger_than_the_cap_takes_all_of_it() {
        let b = Budget::new(10);
        let all = b.try_take(1_000).expect("fits when empty");
        assert_eq!(b.in_use(), 10);
        assert!(b.try_take(1).is_none());
        drop(all);
        assert_eq!(b.in_use(), 0);
    }

    #[test]
    fn a_waiter_gets_in_when_room_is_freed_and_nobody_cuts_in_line() {
        let b = Budget::new(2);
        let held = b.try_take(2).expect("room");
        let mut waiter = pin!(b.take(1));
        assert!(poll_once(waiter.as_mut()).is_pending());
        drop(held);
        // Room now, but the waiter is first: an immediate taker is refused.
        assert!(b.try_take(1).is_none(), "cut in line");
        let Poll::Ready(got) = poll_once(waiter.as_mut()) else {
            panic!("the waiter did not get in");
        };
        assert_eq!(b.in_use(), 1);
        drop(got);
        assert!(b.try_take(2).is_some(), "nobody waits any more");
    }

    #[test]
    fn units_taken_without_a_hold_are_given_back_by_count() {
        let b = Budget::new(4);
        assert!(b.fits_now(3));
        assert_eq!(b.take_fitting(3), 3);
        assert!(!b.fits_now(2), "over the cap");
        assert!(b.fits_now(1));
        b.give_back(3);
        assert_eq!(b.in_use(), 0);
        // A request larger than the cap fits an empty budget and takes all of it.
        assert!(b.fits_now(100));
        assert_eq!(b.take_fitting(100), 4);
        assert!(!b.fits_now(1));
        b.give_back(4);
        // A hold kept past its value stays taken until given back by count.
        let kept = b.try_take(2).expect("room").keep();
        assert_eq!((kept, b.in_use()), (2, 2));
        b.give_back(kept);
        assert_eq!(b.in_use(), 0);
    }

    #[test]
    fn nothing_fits_now_while_a_reader_waits() {
        let b = Budget::new(2);
        let held = b.try_take(2).expect("room");
        let mut waiter = pin!(b.take(1));
        assert!(poll_once(waiter.as_mut()).is_pending());
        drop(held);
        assert!(!b.fits_now(1), "room, but the waiter is first");
        let Poll::Ready(got) = poll_once(waiter.as_mut()) else {
            panic!("the waiter did not get in");
        };
        drop(got);
        assert!(b.fits_now(2));
    }

    #[test]
    fn a_dropped_waiter_stops_counting() {
        let b = Budget::new(1);
        let held = b.try_take(1).expect("room");
        {
            let mut waiter = pin!(b.take(1));
            assert!(poll_once(waiter.as_mut()).is_pending());
        }
        drop(held);
        assert!(b.try_take(1).is_some(), "a gone waiter still blocks takers");
    }

    #[test]
    fn drained_waits_for_everything_in_flight() {
        let b = Budget::new(4);
        let a = b.try_take(1).expect("room");
        let c = b.try_take(1).expect("room");
        let mut drained = pin!(b.drained());
        assert!(poll_once(drained.as_mut()).is_pending());
        let d = b
            .try_take(1)
            .expect("waiting to drain does not stop takers");
        drop((a, d));
        assert!(poll_once(drained.as_mut()).is_pending());
        drop(c);
        assert!(poll_once(drained.as_mut()).is_ready());
    }
}
