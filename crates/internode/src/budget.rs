//! A byte budget that bounds a queue: space is reserved before a message enters and released
//! when it leaves, and a reservation that does not fit fails at once.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes in use against a fixed limit.
#[derive(Debug)]
pub(crate) struct ByteBudget {
    used: AtomicUsize,
    limit: usize,
}

impl ByteBudget {
    pub(crate) const fn new(limit: usize) -> ByteBudget {
        ByteBudget {
            used: AtomicUsize::new(0),
            limit,
        }
    }

    /// Reserves `n` bytes if they fit under the limit.
    pub(crate) fn try_acquire(&self, n: usize) -> bool {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let Some(next) = used.checked_add(n).filter(|&next| next <= self.limit) else {
                return false;
            };
            match self
                .used
                .compare_exchange_weak(used, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    debug_assert!(next <= self.limit);
                    return true;
                }
                Err(actual) => used = actual,
            }
        }
    }

    /// Returns `n` bytes reserved earlier.
    pub(crate) fn release(&self, n: usize) {
        let before = self.used.fetch_sub(n, Ordering::AcqRel);
        debug_assert!(before >= n, "released {n} bytes of {before} in use");
    }

    /// Bytes reserved now.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_past_the_limit_fails_and_release_makes_room() {
        let budget = ByteBudget::new(100);
        assert!(budget.try_acquire(60));
        assert!(!budget.try_acquire(41));
        assert!(budget.try_acquire(40));
        assert_eq!(budget.used(), 100);
        budget.release(60);
        assert!(budget.try_acquire(50));
        assert!(!budget.try_acquire(usize::MAX));
    }
}
