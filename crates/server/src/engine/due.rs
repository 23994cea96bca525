//! What falls due at an instant: finished jobs leaving memory, back-offs
//! ending, deadlines to judge, gangs' graces, unstarted attempts to end.

use std::collections::BTreeSet;

/// Items due at instants (Unix ms), earliest first; an item may be due at
/// several instants, and a handler that takes one checks it is still due
/// (the record it names may have moved on).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Due<T: Ord + Copy> {
    at: BTreeSet<(u64, T)>,
}

impl<T: Ord + Copy> Default for Due<T> {
    fn default() -> Self {
        Due { at: BTreeSet::new() }
    }
}

impl<T: Ord + Copy> Due<T> {
    pub fn insert(&mut self, at_ms: u64, item: T) {
        self.at.insert((at_ms, item));
    }

    pub fn remove(&mut self, at_ms: u64, item: T) {
        self.at.remove(&(at_ms, item));
    }

    pub fn contains(&self, at_ms: u64, item: T) -> bool {
        self.at.contains(&(at_ms, item))
    }

    /// The earliest item due at or before `now`, taken out, with its
    /// instant.
    pub fn pop_due(&mut self, now: u64) -> Option<(u64, T)> {
        let &(at_ms, item) = self.at.first()?;
        if at_ms > now {
            return None;
        }
        self.at.pop_first();
        Some((at_ms, item))
    }

    /// Every entry, earliest first.
    pub fn iter(&self) -> impl Iterator<Item = (u64, T)> + '_ {
        self.at.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_fall_due_in_order_of_their_instant_and_not_before() {
        let mut due = Due::default();
        due.insert(30, 'c');
        due.insert(10, 'a');
        due.insert(20, 'b');
        due.remove(20, 'b');
        assert!(due.contains(30, 'c'));
        assert_eq!(due.pop_due(5), None);
        assert_eq!(due.pop_due(30), Some((10, 'a')));
        assert_eq!(due.pop_due(29), None, "c is due at 30");
        assert_eq!(due.pop_due(30), Some((30, 'c')));
        assert_eq!(due.pop_due(u64::MAX), None);
    }
}
