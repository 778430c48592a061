//! Where a master keeps its (account, op) pairs: one entry each, 56
//! bytes with the account name inline up to 15 bytes, in chunks of 384
//! KiB that never move, found by one probe of a hash index; op names
//! interned. What few windows hold beyond the rest (a surge, hints, the
//! `ably-mma` sub-intervals) is kept beside the entries by position
//! (`extras`), and so are the rests of long names (`account_name`).

use std::hash::BuildHasher;

use foldhash::fast::RandomState;
use hashbrown::hash_table;

use super::account_name::{AccountName, AccountStr, LongNames};
use super::extras::ExtrasBlocks;
use super::report_time::REPORT_TIME_BITS;
use super::{MasterState, ReportTime};
use crate::Pair;
use crate::limits::{LimitId, MAX_LIMIT_KEYS};
use crate::time::Nanos;
use crate::window::{DemandWindow, WindowCore};

/// One tracked (account, op). A master holds millions, so it is kept small
/// (56 bytes, the account name inline up to 15 bytes) and in one place:
/// finding it is one probe of the index and one cache miss here (two
/// lines, read one after the other, for most).
#[derive(Debug)]
pub(super) struct Entry {
    /// Read through [`Entries::account`]: a long name is kept beside.
    account: AccountName,
    /// From its low bits: the op's index in [`MasterState::ops`] (12
    /// bits, [`OP_BITS`]); the flags [`SUPPRESSED`], [`NEAR`], [`EXEMPT`],
    /// [`SHADOW`], [`HAS_EXTRAS`] and [`STALE`], a bit each; the
    /// [`LimitId`] of its match (24 bits, 0 for none); the [`ReportTime`]
    /// of its last report (22 bits). One word for what took twelve bytes.
    word: u64,
    /// Its window, but for what only some windows hold (see
    /// [`Entries::take_window`]).
    pub(super) window: WindowCore,
}

/// An entry's position as the index holds it: three bytes, so a slot of
/// the index is 4 bytes with its control byte rather than 5 (at a million
/// pairs 2 bytes a pair fewer, at ten million 1.7). A shard numbers at
/// most [`MAX_SHARD_PAIRS`] entries.
pub(super) type IndexPos = [u8; 3];

/// The most entries one shard numbers (2^24 − 1): a master's pairs are
/// shared over its shards (`--shards`, 4 per core by default), so a
/// master of 8 shards may track 134 million.
pub const MAX_SHARD_PAIRS: usize = (1 << 24) - 1;

/// Entry `i` as the index holds it (below [`MAX_SHARD_PAIRS`]).
#[inline]
pub(super) fn index_pos(i: u32) -> IndexPos {
    debug_assert!(i as usize <= MAX_SHARD_PAIRS);
    let [a, b, c, _] = i.to_le_bytes();
    [a, b, c]
}

/// The entry an index slot holds.
#[inline]
pub(super) fn entry_at(pos: IndexPos) -> u32 {
    u32::from_le_bytes([pos[0], pos[1], pos[2], 0])
}

/// The bits of [`Entry`]'s op index.
const OP_BITS: u32 = 12;
/// The most ops a master interns, as an agent numbers at most as many
/// (`agent::table::MAX_OPS`): ops are a node's vocabulary (publish,
/// connect, ...). The pairs of further op names are not tracked (counted
/// in [`refused_ops`](MasterState::refused_ops)), so a client inventing
/// op names cannot grow the list, or the time a lookup by name spends in
/// it, without bound.
pub const MAX_OPS: usize = 1 << OP_BITS;

/// Whether the last verdict had a positive factor: a change is a
/// [`Transition`](super::Transition).
pub(super) const SUPPRESSED: u64 = 1 << OP_BITS;
/// Whether the last verdict's demand was near the limit
/// (`policy.near_limit_share`): a change is a [`Transition`](super::Transition).
pub(super) const NEAR: u64 = 2 << OP_BITS;
/// Whether `[exempt]` covers it, under the config its limit was looked up
/// under.
pub(super) const EXEMPT: u64 = 4 << OP_BITS;
/// Whether the last verdict's limit was in shadow: a change while
/// suppressed is a [`Transition`](super::Transition).
pub(super) const SHADOW: u64 = 8 << OP_BITS;
/// Whether [`Entries`] keeps extras for its window.
const HAS_EXTRAS: u64 = 16 << OP_BITS;
/// Whether its limit and [`EXEMPT`] were looked up under an older config
/// (or never): set on every entry by
/// [`MasterState::set_config`], cleared by the next report's lookup.
/// One bit where a 15-bit generation was compared, at the cost of a pass
/// over the entries per reload (sequential; a few milliseconds per
/// million pairs).
pub(super) const STALE: u64 = 32 << OP_BITS;
/// Where the limit's id starts, and its bits.
const LIMIT_SHIFT: u32 = OP_BITS + 6;
const LIMIT_BITS: u32 = 24;
/// Where the report time starts.
const REPORT_SHIFT: u32 = LIMIT_SHIFT + LIMIT_BITS;
const _: () = assert!(REPORT_SHIFT + REPORT_TIME_BITS == 64);
const _: () = assert!(MAX_LIMIT_KEYS < 1 << LIMIT_BITS);

impl Entry {
    /// A new pair's entry: op `op` (below [`MAX_OPS`]), its limit
    /// [`STALE`], its last report at `now`.
    fn new(account: AccountName, op: u32, now: Nanos, window: WindowCore) -> Entry {
        debug_assert!((op as usize) < MAX_OPS);
        let mut entry = Entry {
            account,
            word: u64::from(op) | STALE,
            window,
        };
        entry.set_last_report(ReportTime::at(now));
        entry
    }

    /// The index of its op in [`MasterState::ops`].
    pub(super) fn op(&self) -> u32 {
        (self.word & ((1 << OP_BITS) - 1)) as u32
    }

    pub(super) fn is(&self, flag: u64) -> bool {
        self.word & flag != 0
    }

    pub(super) fn set(&mut self, flag: u64, on: bool) {
        if on {
            self.word |= flag;
        } else {
            self.word &= !flag;
        }
    }

    /// The limit that applied when it was last looked up (see [`STALE`]).
    pub(super) fn limit(&self) -> Option<LimitId> {
        LimitId::from_bits(((self.word >> LIMIT_SHIFT) & ((1 << LIMIT_BITS) - 1)) as u32)
    }

    pub(super) fn set_limit(&mut self, limit: Option<LimitId>) {
        let bits = u64::from(limit.map_or(0, LimitId::bits));
        self.word = (self.word & !(((1 << LIMIT_BITS) - 1) << LIMIT_SHIFT)) | bits << LIMIT_SHIFT;
    }

    /// When its last report came, for eviction and views.
    pub(super) fn last_report(&self) -> ReportTime {
        ReportTime::from_bits((self.word >> REPORT_SHIFT) as u32)
    }

    pub(super) fn set_last_report(&mut self, at: ReportTime) {
        self.word = (self.word & ((1 << REPORT_SHIFT) - 1)) | u64::from(at.bits()) << REPORT_SHIFT;
    }

    fn has_extras(&self) -> bool {
        self.is(HAS_EXTRAS)
    }

    fn set_has_extras(&mut self, on: bool) {
        self.set(HAS_EXTRAS, on);
    }

    /// Its word, for loads that only touch the entry.
    fn bits(&self) -> u64 {
        self.word
    }
}

/// An op name, interned: entries hold its index.
#[derive(Debug)]
pub(super) struct Op {
    pub(super) name: Box<str>,
    /// Entries with this op.
    pub(super) keys: usize,
}

/// Entries in chunks of [`CHUNK`] that never move once allocated: growing
/// costs no copy of what is there and wastes at most one chunk, where a
/// doubling vector would copy everything and leave up to half unused.
#[derive(Debug, Default)]
pub(super) struct Entries {
    pub(super) chunks: Vec<Vec<Entry>>,
    pub(super) len: usize,
    /// The extras of the windows that hold some, by their entry's
    /// position (an entry says whether it has some, in one bit). Moved
    /// with their entry when eviction fills a gap with the last one.
    extras: ExtrasBlocks,
    /// The account names too long to be inline, each at the place its
    /// entry names; a place stays its entry's while the entry moves.
    pub(super) names: LongNames,
}

/// Entries per chunk: as many as fill [`CHUNK_BYTES`].
const CHUNK: usize = CHUNK_BYTES / std::mem::size_of::<Entry>();

// What `state_memory` measures: a change of size should be on purpose.
const _: () = assert!(std::mem::size_of::<Entry>() == 56);

/// A chunk's allocation: 384 KiB, one of mimalloc's size classes (they
/// run 1.25, 1.5, 1.75 and 2 times each power of two), so the chunk fills
/// its block. A chunk of 4 096 entries of 88 bytes (352 KiB) was rounded
/// up to this class, and with transparent huge pages the rounding was
/// resident: 9 bytes a pair (`state_memory`: 122 → 113). glibc's
/// allocator maps an allocation this large by whole pages.
const CHUNK_BYTES: usize = 384 << 10;

impl Entries {
    pub(super) fn get(&self, i: u32) -> &Entry {
        &self.chunks[i as usize / CHUNK][i as usize % CHUNK]
    }

    pub(super) fn get_mut(&mut self, i: u32) -> &mut Entry {
        &mut self.chunks[i as usize / CHUNK][i as usize % CHUNK]
    }

    /// Entry `i`'s window, whole, taken out of the table until
    /// [`put_window`](Self::put_window) puts it back: its core is copied,
    /// its extras (if any) moved.
    pub(super) fn take_window(&mut self, i: u32) -> DemandWindow {
        let entry = self.get(i);
        let core = entry.window;
        let extras = if entry.has_extras() {
            self.extras.take(i)
        } else {
            None
        };
        DemandWindow::join(core, extras)
    }

    /// Puts back entry `i`'s window (see [`take_window`](Self::take_window)).
    pub(super) fn put_window(&mut self, i: u32, window: DemandWindow) {
        let (core, extras) = window.split();
        let entry = self.get_mut(i);
        entry.window = core;
        let had = entry.has_extras();
        entry.set_has_extras(extras.is_some());
        self.extras.put(i, had, extras);
    }

    /// The account of `entry`, one of these entries.
    pub(super) fn account<'e>(&self, entry: &'e Entry) -> AccountStr<'e> {
        self.names.get(&entry.account)
    }

    /// The index's hash of `entry`, one of these entries: what
    /// [`MasterState::hash`] gives its op and account.
    pub(super) fn hash_of(&self, hasher: &RandomState, entry: &Entry) -> u64 {
        MasterState::hash(hasher, entry.op(), &self.account(entry))
    }

    /// Whether `entry`, one of these entries, is `account`'s.
    fn is_account(&self, entry: &Entry, account: &str) -> bool {
        self.names.is(&entry.account, account)
    }

    /// A copy of entry `i`'s window, whole (for views and snapshots).
    pub(super) fn window(&self, i: u32) -> DemandWindow {
        self.window_of(i, self.get(i))
    }

    /// A copy of the window of `entry`, entry `i`.
    pub(super) fn window_of(&self, i: u32, entry: &Entry) -> DemandWindow {
        let extras = if entry.has_extras() {
            self.extras.get(i).cloned()
        } else {
            None
        };
        DemandWindow::join(entry.window, extras)
    }

    /// Copies the tails of the long names held into fresh chunks, leaving
    /// out the places given back, and lets the old chunks go (see
    /// [`LongNames`]): one pass over the entries.
    pub(super) fn compact_names(&mut self) {
        let mut names = LongNames::default();
        for chunk in &mut self.chunks {
            for entry in chunk {
                entry.account = names.moved(&self.names, &entry.account);
            }
        }
        self.names = names;
    }

    /// Marks every entry's limit [`STALE`], to be looked up again by its
    /// next report (a new config).
    pub(super) fn mark_stale(&mut self) {
        for chunk in &mut self.chunks {
            for entry in chunk {
                entry.set(STALE, true);
            }
        }
    }

    pub(super) fn push(&mut self, entry: Entry) {
        match self.chunks.last_mut() {
            Some(chunk) if chunk.len() < CHUNK => chunk.push(entry),
            _ => {
                let mut chunk = Vec::with_capacity(CHUNK);
                chunk.push(entry);
                self.chunks.push(chunk);
            }
        }
        self.len += 1;
    }

    /// Removes entry `i`, moving the last one into its place, with their
    /// windows' extras; the removed entry's name is no longer readable.
    pub(super) fn swap_remove(&mut self, i: u32) -> Entry {
        let last = self
            .chunks
            .last_mut()
            .and_then(Vec::pop)
            .expect("not empty");
        if self.chunks.last().is_some_and(Vec::is_empty) {
            self.chunks.pop();
        }
        self.len -= 1;
        let moved = u32::try_from(self.len).expect("fewer than 2^32 pairs");
        let removed = if i == moved {
            last
        } else {
            std::mem::replace(self.get_mut(i), last)
        };
        if removed.has_extras() {
            self.extras.remove(i);
        }
        if i != moved && self.get(i).has_extras() {
            self.extras.move_to(moved, i);
        }
        self.names.release(&removed.account);
        removed
    }

    /// How many windows' extras are kept.
    #[cfg(test)]
    pub(super) fn extras_held(&self) -> usize {
        self.extras.held()
    }

    /// Every entry, with its position.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u32, &Entry)> {
        (0u32..).zip(self.chunks.iter().flatten())
    }
}

impl MasterState {
    /// The index of `op`, interned on first sight; `None` for a new op
    /// past [`MAX_OPS`] (counted in `refused_ops`).
    pub(super) fn op_id(&mut self, op: &str) -> Option<u32> {
        if self
            .ops
            .get(self.last_op as usize)
            .is_some_and(|o| *o.name == *op)
        {
            return Some(self.last_op);
        }
        let id = match self.ops.iter().position(|o| *o.name == *op) {
            Some(id) => id,
            None if self.ops.len() >= MAX_OPS => {
                self.refused_ops += 1;
                return None;
            }
            None => {
                self.ops.push(Op {
                    name: op.into(),
                    keys: 0,
                });
                self.ops.len() - 1
            }
        };
        self.last_op = id as u32;
        Some(self.last_op)
    }

    pub(super) fn hash(hasher: &RandomState, op: u32, account: &str) -> u64 {
        hasher.hash_one((op, account))
    }

    /// Where (op, account) is in `entries`, if tracked.
    pub(super) fn find(&self, op: &str, account: &str) -> Option<u32> {
        let op = self.ops.iter().position(|o| *o.name == *op)? as u32;
        let entries = &self.entries;
        self.index
            .find(Self::hash(&self.hasher, op, account), |&i| {
                let e = entries.get(entry_at(i));
                e.op() == op && entries.is_account(e, account)
            })
            .map(|&i| entry_at(i))
    }

    /// Where (op, account) is in `entries`, tracking it from `now` if new;
    /// `None` for a new pair when [`max_pairs`](MasterState::set_max_pairs)
    /// are tracked already (counted in `refused_pairs`).
    pub(super) fn find_or_insert(&mut self, op: u32, account: &str, now: Nanos) -> Option<u32> {
        let (entries, hasher) = (&self.entries, &self.hasher);
        let hash = Self::hash(hasher, op, account);
        let next = u32::try_from(entries.len).expect("fewer than 2^32 pairs per shard");
        match self.index.entry(
            hash,
            |&i| {
                let e = entries.get(entry_at(i));
                e.op() == op && entries.is_account(e, account)
            },
            |&i| entries.hash_of(hasher, entries.get(entry_at(i))),
        ) {
            hash_table::Entry::Occupied(found) => Some(entry_at(*found.get())),
            hash_table::Entry::Vacant(_)
                if entries.len >= self.max_pairs || self.new_pairs_allowed == Some(0) =>
            {
                self.refused_pairs += 1;
                None
            }
            hash_table::Entry::Vacant(slot) => {
                slot.insert(index_pos(next));
                if let Some(left) = &mut self.new_pairs_allowed {
                    *left -= 1;
                }
                let (window, extras) = DemandWindow::new(&self.config.window).split();
                let account = self.entries.names.hold(account);
                // `op` is below `MAX_OPS` (`op_id`).
                self.entries.push(Entry::new(account, op, now, window));
                if extras.is_some() {
                    self.entries
                        .put_window(next, DemandWindow::join(window, extras));
                }
                self.ops[op as usize].keys += 1;
                Some(next)
            }
        }
    }

    /// [`find_or_insert`](Self::find_or_insert), trying first the
    /// position `at` holds (plus one; 0 for none), and leaving in `at`
    /// where the pair is (see [`MasterState::ingest_at`]).
    pub(super) fn find_or_insert_near(
        &mut self,
        op: u32,
        account: &str,
        now: Nanos,
        at: &mut u32,
    ) -> Option<u32> {
        if let Some(hint) = self.hinted(*at) {
            let e = self.entries.get(hint);
            if self.entries.is_account(e, account) {
                if e.op() == op {
                    return Some(hint);
                }
                // The account's other op: its hint stays.
                return self.find_or_insert(op, account, now);
            }
        }
        let found = self.find_or_insert(op, account, now)?;
        *at = found + 1;
        Some(found)
    }

    /// The entry a hint (position plus one; 0 for none) points to, if it
    /// is in the table: which pair is there is the caller's to check.
    fn hinted(&self, at: u32) -> Option<u32> {
        at.checked_sub(1)
            .filter(|&i| (i as usize) < self.entries.len)
    }

    /// Stops tracking entry `i`, moving the last entry into its place (read
    /// its account first: [`Entries::swap_remove`]).
    pub(super) fn remove(&mut self, i: u32) {
        let (entries, hasher) = (&self.entries, &self.hasher);
        let e = entries.get(i);
        if let Ok(found) = self
            .index
            .find_entry(entries.hash_of(hasher, e), |&j| entry_at(j) == i)
        {
            found.remove();
        }
        let last = u32::try_from(self.entries.len - 1).expect("fewer than 2^32 pairs");
        let removed = self.entries.swap_remove(i);
        if i != last {
            let moved = self.entries.get(i);
            let hash = self.entries.hash_of(&self.hasher, moved);
            if let Some(slot) = self.index.find_mut(hash, |&j| entry_at(j) == last) {
                *slot = index_pos(i);
            }
        }
        self.ops[removed.op() as usize].keys -= 1;
    }

    /// Reads where each (op, account) about to be ingested lives, so that
    /// the cache misses of a whole batch overlap rather than come one after
    /// another in [`ingest`](Self::ingest). Changes nothing; a pure hint
    /// (worth about a third of ingest time with a million pairs, measured
    /// by the master's `ingest` benchmark). Each pair comes with the hint
    /// of its position [`ingest_at`](Self::ingest_at) will be given (0 for
    /// none): a hinted entry is read directly, without the index.
    pub fn warm<'a>(&self, pairs: impl Iterator<Item = (Pair<'a>, u32)>) {
        let mut touched = 0u64;
        let mut last: Option<(&str, u32)> = None;
        for (Pair { account, op }, at) in pairs {
            if let Some(i) = self.hinted(at) {
                let e = self.entries.get(i);
                touched = touched
                    .wrapping_add(e.account.len() as u64)
                    .wrapping_add(e.bits())
                    .wrapping_add(e.window.touch());
                continue;
            }
            let op = match last {
                Some((name, id)) if name == op => id,
                _ => match self.ops.iter().position(|o| *o.name == *op) {
                    Some(id) => {
                        last = Some((op, id as u32));
                        id as u32
                    }
                    None => continue,
                },
            };
            // The first slot whose hash tag matches (nearly always the
            // pair's own), and its entry: loads that do not depend on one
            // another, so the CPU runs ahead with many in flight.
            if let Some(&i) = self
                .index
                .find(Self::hash(&self.hasher, op, account), |_| true)
            {
                let e = self.entries.get(entry_at(i));
                touched = touched
                    .wrapping_add(e.account.len() as u64)
                    .wrapping_add(e.bits());
            }
        }
        std::hint::black_box(touched);
    }
}
