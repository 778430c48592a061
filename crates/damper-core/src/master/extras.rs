//! [`ExtrasBlocks`]: what a master's few windows hold beyond their core
//! (a surge, hints, the `ably-mma` sub-intervals), by their entry's
//! position, in blocks made only where some entry has extras.

use crate::window::WindowExtras;

/// Entries per block: a block is 4 KiB of slots, made when its first
/// entry gains extras and freed when its last one loses them.
const BLOCK: usize = 512;

/// The extras of the windows that hold some, each at its entry's position
/// (an entry says, in one bit, whether it has some). What the entries
/// would otherwise each keep: a pointer in every window (8 bytes, and the
/// padding its alignment asked for) or the 4-byte place of a slab, for
/// what few windows hold. With the default estimator a block is made only
/// where a window surges or is hinted (a hundred surges at once over a
/// million pairs hold about 400 KB); with `ably-mma`, whose every window
/// has sub-intervals, every block is made: 8 bytes a pair, and a report
/// finds its window's extras by its position, as in a slab.
#[derive(Debug, Default)]
pub(super) struct ExtrasBlocks {
    blocks: Vec<Option<Box<[Option<WindowExtras>]>>>,
    /// How many entries of each block have extras (taken ones too).
    held: Vec<u16>,
}

fn split(i: u32) -> (usize, usize) {
    (i as usize / BLOCK, i as usize % BLOCK)
}

impl ExtrasBlocks {
    /// Entry `i`'s extras, taken out until [`put`](Self::put) (which the
    /// entry, still marked as having some, must be given next).
    pub(super) fn take(&mut self, i: u32) -> Option<WindowExtras> {
        let (block, at) = split(i);
        self.blocks.get_mut(block)?.as_mut()?[at].take()
    }

    /// Entry `i`'s extras.
    pub(super) fn get(&self, i: u32) -> Option<&WindowExtras> {
        let (block, at) = split(i);
        self.blocks.get(block)?.as_ref()?[at].as_ref()
    }

    /// Sets entry `i`'s extras to `extras`; `had` is whether it was marked
    /// as having some.
    pub(super) fn put(&mut self, i: u32, had: bool, extras: Option<WindowExtras>) {
        let (block, at) = split(i);
        match (had, extras) {
            (_, Some(extras)) => {
                if self.blocks.len() <= block {
                    self.blocks.resize_with(block + 1, || None);
                    self.held.resize(block + 1, 0);
                }
                let slots =
                    self.blocks[block].get_or_insert_with(|| (0..BLOCK).map(|_| None).collect());
                slots[at] = Some(extras);
                if !had {
                    self.held[block] += 1;
                }
            }
            (true, None) => self.release(block, at),
            (false, None) => {}
        }
    }

    /// Entry `i`, marked as having extras, is gone.
    pub(super) fn remove(&mut self, i: u32) {
        let (block, at) = split(i);
        self.release(block, at);
    }

    /// Entry `from`, marked as having extras, moved to `to` (whose own
    /// were removed first, if it had any).
    pub(super) fn move_to(&mut self, from: u32, to: u32) {
        let extras = self.take(from);
        self.remove(from);
        self.put(to, false, extras);
    }

    /// Clears one entry's slot, and frees its block once none is held.
    fn release(&mut self, block: usize, at: usize) {
        let Some(slots) = self.blocks.get_mut(block).and_then(Option::as_mut) else {
            return;
        };
        slots[at] = None;
        self.held[block] -= 1;
        if self.held[block] == 0 {
            self.blocks[block] = None;
        }
    }

    /// How many entries have extras.
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.held.iter().map(|&n| usize::from(n)).sum()
    }

    /// How many blocks are made.
    #[cfg(test)]
    pub(super) fn blocks(&self) -> usize {
        self.blocks.iter().filter(|b| b.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WindowConfig;
    use crate::window::DemandWindow;

    /// Some extras: an `ably-mma` window's.
    fn extras() -> WindowExtras {
        let cfg = WindowConfig {
            estimator: crate::config::EstimatorKind::AblyMma,
            ..WindowConfig::default()
        };
        DemandWindow::new(&cfg).split().1.expect("sub-intervals")
    }

    #[test]
    fn blocks_are_made_where_extras_are_and_freed_when_none_are_left() {
        let mut x = ExtrasBlocks::default();
        x.put(5, false, Some(extras()));
        x.put(2_000, false, Some(extras()));
        assert_eq!((x.held(), x.blocks()), (2, 2));
        assert!(x.get(5).is_some() && x.get(6).is_none() && x.get(100_000).is_none());
        // Taken and put back: still held, no count moved.
        let taken = x.take(5);
        assert!(taken.is_some() && x.get(5).is_none());
        x.put(5, true, taken);
        assert_eq!((x.held(), x.blocks()), (2, 2));
        // Taken and put back with none: let go of, and its block freed.
        let _ = x.take(5);
        x.put(5, true, None);
        assert_eq!((x.held(), x.blocks()), (1, 1));
        x.remove(2_000);
        assert_eq!((x.held(), x.blocks()), (0, 0));
    }

    #[test]
    fn extras_move_with_their_entry() {
        let mut x = ExtrasBlocks::default();
        x.put(3, false, Some(extras()));
        x.put(9_999, false, Some(extras()));
        // Entry 3 goes, and the last (9 999) moves into its place.
        x.remove(3);
        x.move_to(9_999, 3);
        assert!(x.get(3).is_some() && x.get(9_999).is_none());
        assert_eq!((x.held(), x.blocks()), (1, 1));
    }
}
