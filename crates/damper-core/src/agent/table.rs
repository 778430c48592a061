//! The agent's table of (account, op) pairs: [`PairTable`], laid out so a
//! known key's `check` touches three cache lines (its index word, its
//! slot's name, the entry's hot line), takes no lock and allocates nothing.
//!
//! - **Slots** live in chunks that never move, made as the table grows: a
//!   slot is its pair's name (one line: the account inline up to 48 bytes,
//!   the op's number, the low half of the hash) and its [`Entry`] (two
//!   lines). No allocation per pair, unless its account is longer.
//! - **The index** is open addressing: one 4-byte word per place, the
//!   hash's top 8 bits as a tag and the slot's position (24 bits, so a
//!   table holds at most 16.7 million pairs), at most three quarters
//!   full. A lookup probes places in a row until its tag and then the slot's
//!   name match, or an empty place says the pair is not there. Inserts take
//!   a lock (a new pair is rare next to checks of known ones); when the
//!   index fills, a new one is built, twice as large or, after many pairs
//!   were forgotten, smaller.
//! - **Generations and grace.** Readers hold the generation they started
//!   with (a [`Pinned`]: an `arc-swap` guard) for the whole of a check: the
//!   index, and the lists of the chunks and of the ops' names as they
//!   were, so a lookup follows plain pointers (no check of a lazily made
//!   cell on the way). A new chunk or op makes a new generation. A
//!   forgotten pair's slot is reused only once every reader that might have
//!   found it is done: its position waits for the end of every generation
//!   of the index up to the one current when it was removed, and a removal
//!   ends the current generation by installing a new one over the same
//!   places (a pointer, not a copy). So a check never counts into a slot
//!   made over for a stranger; one that found a pair just before its
//!   removal counts into the emptied entry and sees the retired mark (see
//!   `forget`). A check never ends a generation itself, so it takes no
//!   lock and frees nothing: the writer keeps every generation it
//!   replaced until no reader holds it, and its next insert, removal pass
//!   or new generation ends the ones let go (see [`Writer::sweep`]).

use std::collections::{BTreeSet, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{
    AtomicU16, AtomicU32, AtomicU64, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use arc_swap::{ArcSwap, ArcSwapOption};
use foldhash::fast::RandomState;

use super::entry::Entry;

/// A slot's position in the table.
pub(super) type Pos = u32;

/// Positions per chunk: 1 024, of which the last is never used, so that a
/// chunk's allocation (1 023 slots of 192 bytes and the `Arc`'s 64-byte
/// header) fits in 192 KiB, what a table holds at least once it holds a
/// pair. With all 1 024, 64 bytes over, mimalloc rounded each chunk up to
/// its next size class, and with transparent huge pages the rounding was
/// resident: 251 bytes per pair rather than 209 under glibc's allocator.
const CHUNK_BITS: u32 = 10;
/// Slots in a chunk.
const CHUNK_SLOTS: usize = (1 << CHUNK_BITS) - 1;
/// Chunks per span (a span's chunk list is made when first needed).
const SPAN_BITS: u32 = 9;
/// Positions are below 2^24 (an index word holds one plus the position
/// in 24 bits; 2^24 − 1 is a chunk's last position, never used): 16.7
/// million pairs, 3.2 GB of slots, far past
/// what one node holds.
const POS_BITS: u32 = 24;
/// The bits of an index word that hold one plus its slot's position.
const POS_MASK: u32 = (1 << POS_BITS) - 1;
const SPANS: usize = 1 << (POS_BITS - CHUNK_BITS - SPAN_BITS);

/// The most ops a table numbers; the pairs of further ops are not tracked
/// (admitted and not counted). Ops are a node's own vocabulary (publish,
/// connect, ...), not its clients'.
pub(super) const MAX_OPS: usize = 4096;
const OPS_CHUNK: usize = 64;

/// Account names up to this many bytes live in the slot; longer ones (up
/// to [`MAX_NAME_LEN`](crate::MAX_NAME_LEN)) in an allocation of their own.
const INLINE: usize = 48;
const INLINE_WORDS: usize = INLINE / 8;

/// The smallest index.
const MIN_PLACES: usize = 16;
/// An index place no pair ever took: a lookup ends there.
const EMPTY: u32 = 0;
/// An index place a forgotten pair left: lookups go on past it. Live
/// words have a tag of at least 1 in their high half, so never equal it.
const TOMBSTONE: u32 = 1;

/// Slots made together, shared by the generations that know them.
type Chunk = Arc<[Slot]>;
/// A span's chunks, each kept when made.
type Span = Box<[OnceLock<Chunk>]>;
/// Some ops' names.
type OpChunk = Box<[OnceLock<Arc<str>>]>;

/// One pair: its name, then its entry. Three cache lines.
#[repr(C, align(64))]
#[derive(Default)]
struct Slot {
    name: SlotName,
    entry: Entry,
}

const _: () = assert!(std::mem::size_of::<SlotName>() == 64);
const _: () = assert!(std::mem::size_of::<Slot>() == 192);

/// A slot's (account, op), in one cache line. Atomics, because a slot is
/// made over for another pair (after its grace) through a shared
/// reference; no reader can see it then.
#[repr(C)]
#[derive(Default)]
struct SlotName {
    /// The account's bytes, little-endian words, zero past its end; empty
    /// when it is longer than [`INLINE`].
    inline: [AtomicU64; INLINE_WORDS],
    /// The account when longer than [`INLINE`].
    long: ArcSwapOption<Box<str>>,
    /// The low half of the pair's hash: where its index search starts, so
    /// a new index is built without reading names.
    hash_low: AtomicU32,
    /// The account's length in bytes; 0 for a vacant slot (an account is
    /// never empty).
    len: AtomicU16,
    /// The op's number in the table.
    op: AtomicU16,
}

/// An (account, op) as a lookup wants it, with its hash computed once.
#[derive(Clone, Copy)]
pub(super) struct PairName<'a> {
    pub(super) account: &'a str,
    pub(super) op: &'a str,
    hash: u64,
}

/// A copy of a slot's account, for the passes over the pairs.
pub(super) struct AccountName {
    inline: [u8; INLINE],
    len: usize,
    long: Option<Arc<Box<str>>>,
}

impl AccountName {
    pub(super) fn as_str(&self) -> &str {
        match &self.long {
            Some(long) => long,
            None => std::str::from_utf8(&self.inline[..self.len])
                .expect("written from a str, and never rewritten while pinned"),
        }
    }
}

/// Where lookups start: the index, the chunks and the ops' names, as of
/// one generation.
struct Generation {
    number: u64,
    places: Arc<[AtomicU32]>,
    chunks: Arc<[Chunk]>,
    ops: Arc<[Arc<str>]>,
}

/// Which generations readers may still hold, and the positions waiting for
/// them to end.
#[derive(Default)]
struct Grace {
    live: BTreeSet<u64>,
    /// Positions removed while the generation given was current, oldest
    /// first: free once it and every older generation ended.
    waiting: VecDeque<(u64, Vec<Pos>)>,
    /// Positions of forgotten pairs that no reader can hold any more.
    free: Vec<Pos>,
}

impl Grace {
    fn ended(&mut self, number: u64) {
        self.live.remove(&number);
        let oldest_live = self.live.first().copied().unwrap_or(u64::MAX);
        while self.waiting.front().is_some_and(|(n, _)| *n < oldest_live) {
            let (_, positions) = self.waiting.pop_front().expect("just seen");
            self.free.extend(positions);
        }
    }
}

/// What only inserts and removals change, under the table's lock.
struct Writer {
    /// Positions ever made: the next new pair's, once no forgotten
    /// pair's is free.
    made: Pos,
    /// Index places holding a tombstone.
    tombstones: usize,
    /// The next generation's number.
    next_generation: u64,
    /// Positions removed in the current generation.
    removed: Vec<Pos>,
    /// Every chunk made, for the next generation.
    chunks: Arc<[Chunk]>,
    /// Every op's name, by number, for the next generation.
    ops: Arc<[Arc<str>]>,
    /// The generations replaced since, until no reader holds them: the
    /// writer ends them, so the reader that lets go of one last neither
    /// locks nor frees.
    retired: Vec<Arc<Generation>>,
    /// The generations readers may still hold, and what waits for them.
    grace: Grace,
}

impl Writer {
    /// Ends the replaced generations no reader holds any more, freeing
    /// their positions and index. A reader's hold is an `Arc` (arc-swap
    /// pays its readers' debts on the swap that replaced it): the writer's
    /// is the last one when `get_mut` finds it alone, which orders this
    /// after every reader's release of it.
    fn sweep(&mut self) {
        let Writer { retired, grace, .. } = self;
        retired.retain_mut(|generation| {
            let Some(alone) = Arc::get_mut(generation) else {
                return true;
            };
            grace.ended(alone.number);
            false
        });
    }
}

/// See the module docs.
pub(super) struct PairTable {
    /// Every chunk of slots, by position, for the writer and the passes
    /// (readers use their generation's list).
    spans: Box<[OnceLock<Span>]>,
    /// Every op's name by number, likewise.
    ops: Box<[OnceLock<OpChunk>]>,
    hasher: RandomState,
    current: ArcSwap<Generation>,
    writer: Mutex<Writer>,
    /// Pairs in the table.
    live: AtomicUsize,
    /// Positions ever made (the writer's `made`, for the passes): the
    /// slots past it were never taken, and a pass over an agent of a
    /// hundred pairs does not walk the other 924 slots of its chunk (half
    /// the simulator's time went there).
    made: AtomicU32,
}

/// A reader's hold on the table: lookups through it, and every entry they
/// return stays this pair's for as long as it lives.
pub(super) struct Pinned<'t> {
    table: &'t PairTable,
    generation: arc_swap::Guard<Arc<Generation>>,
}

/// One pair met by [`Pinned::pairs`].
#[derive(Clone, Copy)]
pub(super) struct PairRef<'p> {
    pub(super) pos: Pos,
    table: &'p PairTable,
    slot: &'p Slot,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// A live index word's tag: the hash's top 8 bits, never 0. A place
/// whose tag matches by chance (one in 255) costs a read of its slot's
/// name line, where the hash's low half is compared first.
#[inline(always)]
fn tag_of(hash: u64) -> u32 {
    ((hash >> 56) as u32).max(1)
}

/// An index word: the tag above one plus the position.
#[inline]
fn word_of(hash: u64, pos: Pos) -> u32 {
    debug_assert!(pos < POS_MASK);
    tag_of(hash) << POS_BITS | (pos + 1)
}

/// The position an index word holding a pair names.
#[inline(always)]
fn pos_of(word: u32) -> Pos {
    (word & POS_MASK).wrapping_sub(1)
}

/// The index size for `pairs`: at most half full once built.
fn places_for(pairs: usize) -> usize {
    (pairs.saturating_mul(2))
        .next_power_of_two()
        .max(MIN_PLACES)
}

fn empty_places(n: usize) -> Arc<[AtomicU32]> {
    (0..n).map(|_| AtomicU32::new(EMPTY)).collect()
}

/// Puts `word` in the first empty place from `start` (a new index, or one
/// the caller holds the writer's lock on and knows not full).
fn place(places: &[AtomicU32], start: u32, word: u32) -> bool {
    let mask = places.len() - 1;
    let mut i = start as usize & mask;
    loop {
        let old = places[i].load(Relaxed);
        if old == EMPTY || old == TOMBSTONE {
            places[i].store(word, Release);
            return old == TOMBSTONE;
        }
        i = (i + 1) & mask;
    }
}

impl PairTable {
    pub(super) fn new() -> PairTable {
        let mut grace = Grace::default();
        grace.live.insert(0);
        let first = Generation {
            number: 0,
            places: empty_places(MIN_PLACES),
            chunks: Arc::new([]),
            ops: Arc::new([]),
        };
        PairTable {
            spans: (0..SPANS).map(|_| OnceLock::new()).collect(),
            ops: (0..MAX_OPS / OPS_CHUNK).map(|_| OnceLock::new()).collect(),
            hasher: RandomState::default(),
            current: ArcSwap::from_pointee(first),
            writer: Mutex::new(Writer {
                next_generation: 1,
                made: 0,
                tombstones: 0,
                removed: Vec::new(),
                chunks: Arc::new([]),
                ops: Arc::new([]),
                retired: Vec::new(),
                grace,
            }),
            live: AtomicUsize::new(0),
            made: AtomicU32::new(0),
        }
    }

    /// A hold on the table for lookups and passes.
    #[inline(always)]
    pub(super) fn pin(&self) -> Pinned<'_> {
        Pinned {
            table: self,
            generation: self.current.load(),
        }
    }

    /// `account` and `op` with their hash.
    #[inline(always)]
    pub(super) fn name<'a>(&self, account: &'a str, op: &'a str) -> PairName<'a> {
        PairName {
            account,
            op,
            hash: self.hasher.hash_one((op, account)),
        }
    }

    /// Pairs in the table.
    pub(super) fn len(&self) -> usize {
        self.live.load(Relaxed)
    }

    /// Numbers an op: its number, or `None` past [`MAX_OPS`]. The caller
    /// numbers each op once (under its own lock).
    pub(super) fn number_op(&self, op: Arc<str>) -> Option<u16> {
        let mut writer = lock(&self.writer);
        let n = writer.ops.len();
        if n >= MAX_OPS {
            return None;
        }
        let chunk = self.ops[n / OPS_CHUNK]
            .get_or_init(|| (0..OPS_CHUNK).map(|_| OnceLock::new()).collect());
        chunk[n % OPS_CHUNK]
            .set(op.clone())
            .unwrap_or_else(|_| unreachable!("numbered once, under the lock"));
        writer.ops = writer.ops.iter().cloned().chain([op]).collect();
        let places = self.current.load().places.clone();
        self.install(&mut writer, places);
        Some(n as u16)
    }

    /// The name of op number `n`.
    #[inline]
    fn op_name(&self, n: u16) -> Option<&Arc<str>> {
        let n = usize::from(n);
        self.ops.get(n / OPS_CHUNK)?.get()?[n % OPS_CHUNK].get()
    }

    /// The slot at `pos` (the writer's and the passes' way: readers use
    /// their generation's chunks).
    fn slot(&self, pos: Pos) -> &Slot {
        let chunk = (pos >> CHUNK_BITS) as usize;
        let span = self.spans[chunk >> SPAN_BITS]
            .get()
            .expect("positions are made with their chunk");
        let slots = span[chunk & ((1 << SPAN_BITS) - 1)]
            .get()
            .expect("positions are made with their chunk");
        &slots[(pos as usize) & ((1 << CHUNK_BITS) - 1)]
    }

    /// Makes the chunk of `pos`, if need be, and a generation that knows
    /// it (writer only).
    fn make_chunk(&self, writer: &mut Writer, pos: Pos) {
        let n = (pos >> CHUNK_BITS) as usize;
        if n < writer.chunks.len() {
            return;
        }
        let chunk: Chunk = (0..CHUNK_SLOTS).map(|_| Slot::default()).collect();
        let span = self.spans[n >> SPAN_BITS]
            .get_or_init(|| (0..1 << SPAN_BITS).map(|_| OnceLock::new()).collect());
        span[n & ((1 << SPAN_BITS) - 1)]
            .set(chunk.clone())
            .unwrap_or_else(|_| unreachable!("made once, under the lock"));
        writer.chunks = writer.chunks.iter().cloned().chain([chunk]).collect();
        let places = self.current.load().places.clone();
        self.install(writer, places);
    }

    /// Ends the current generation: positions removed in it wait for
    /// every reader that holds it, or an older one. Ends, too, the
    /// generations replaced before that readers have let go of since (a
    /// forget pass comes every interval: what they hold, an outgrown index
    /// for one, is not kept longer).
    pub(super) fn end_generation(&self) {
        let mut writer = lock(&self.writer);
        if writer.removed.is_empty() {
            writer.sweep();
            return;
        }
        let removed = std::mem::take(&mut writer.removed);
        let (places, number) = {
            let current = self.current.load();
            (current.places.clone(), current.number)
        };
        writer.grace.waiting.push_back((number, removed));
        self.install(&mut writer, places);
    }

    /// Makes `places` the current index, as a new generation (writer
    /// only).
    fn install(&self, writer: &mut Writer, places: Arc<[AtomicU32]>) {
        let number = writer.next_generation;
        writer.next_generation += 1;
        writer.grace.live.insert(number);
        let replaced = self.current.swap(Arc::new(Generation {
            number,
            places,
            chunks: writer.chunks.clone(),
            ops: writer.ops.clone(),
        }));
        writer.retired.push(replaced);
        writer.sweep();
    }

    /// A new index for the pairs in `old` and one more (writer only).
    fn rebuild(&self, writer: &mut Writer, old: &[AtomicU32]) {
        let live = self.live.load(Relaxed);
        let places = empty_places(places_for(live + 1));
        for word in old.iter().map(|w| w.load(Relaxed)) {
            if word > TOMBSTONE {
                let pos = pos_of(word);
                place(&places, self.slot(pos).name.hash_low.load(Relaxed), word);
            }
        }
        writer.tombstones = 0;
        self.install(writer, places);
    }

    /// A position for a new pair: a forgotten pair's whose grace ended,
    /// or a new one (writer only). `None` when the table is full.
    fn new_pos(&self, writer: &mut Writer) -> Option<Pos> {
        writer.sweep();
        if let Some(pos) = writer.grace.free.pop() {
            return Some(pos);
        }
        let mut pos = writer.made;
        if pos as usize & CHUNK_SLOTS == CHUNK_SLOTS {
            pos += 1; // A chunk's last position has no slot.
        }
        if pos >= 1 << POS_BITS {
            return None;
        }
        self.make_chunk(writer, pos);
        writer.made = pos + 1;
        self.made.store(writer.made, Release);
        Some(pos)
    }
}

impl Generation {
    /// Where `name` is, if this generation's index holds it.
    #[inline(always)]
    fn find(&self, name: &PairName<'_>) -> Option<(Pos, &Slot)> {
        let places = &*self.places;
        let mask = places.len() - 1;
        let tag = tag_of(name.hash);
        let mut i = name.hash as usize & mask;
        loop {
            let word = places[i].load(Acquire);
            if word == EMPTY {
                return None;
            }
            let pos = pos_of(word);
            if word >> POS_BITS == tag
                && let Some(slot) = self.slot(pos)
                && slot.name.is(&self.ops, name)
            {
                return Some((pos, slot));
            }
            i = (i + 1) & mask;
        }
    }

    /// The slot at `pos`; `None` in a chunk made after this generation
    /// (its index may hold the word already: the places are shared).
    #[inline(always)]
    fn slot(&self, pos: Pos) -> Option<&Slot> {
        self.chunks
            .get((pos >> CHUNK_BITS) as usize)?
            .get((pos as usize) & ((1 << CHUNK_BITS) - 1))
    }
}

impl SlotName {
    /// Whether this slot holds `name`: its length, its hash, its op and
    /// its bytes.
    #[inline(always)]
    fn is(&self, ops: &[Arc<str>], name: &PairName<'_>) -> bool {
        let len = usize::from(self.len.load(Acquire));
        if len != name.account.len() || self.hash_low.load(Relaxed) != name.hash as u32 {
            return false;
        }
        self.holds(ops, name.account, name.op)
    }

    /// Whether this slot holds (`account`, `op`), without the hash: for a
    /// lookup that starts from a position it was given. Its length is
    /// read first (Acquire): 0 while the slot is vacant, else a pair's
    /// whose name was written before it, never a mix of two names.
    #[inline(always)]
    fn named(&self, ops: &[Arc<str>], account: &str, op: &str) -> bool {
        let len = usize::from(self.len.load(Acquire));
        len == account.len() && self.holds(ops, account, op)
    }

    /// Whether the slot, its length already read as `account`'s, holds
    /// `op` and `account`'s bytes.
    #[inline(always)]
    fn holds(&self, ops: &[Arc<str>], account: &str, op: &str) -> bool {
        if ops
            .get(usize::from(self.op.load(Relaxed)))
            .is_none_or(|known| !same_bytes(known.as_bytes(), op.as_bytes()))
        {
            return false;
        }
        if account.len() > INLINE {
            return self
                .long
                .load()
                .as_ref()
                .is_some_and(|long| ***long == *account);
        }
        let (words, tail) = account.as_bytes().as_chunks::<8>();
        words
            .iter()
            .zip(&self.inline)
            .all(|(bytes, word)| u64::from_le_bytes(*bytes) == word.load(Relaxed))
            && (tail.is_empty() || word_from(tail) == self.inline[words.len()].load(Relaxed))
    }

    /// Writes `name` here (writer only, the slot vacant and unreachable);
    /// its length last, so a pass that sees the slot taken sees the rest.
    fn write(&self, name: &PairName<'_>, op: u16) {
        let bytes = name.account.as_bytes();
        assert!(!bytes.is_empty(), "a slot's length 0 means vacant");
        let inline = if bytes.len() > INLINE { &[][..] } else { bytes };
        let mut chunks = inline.chunks(8);
        for word in &self.inline {
            word.store(chunks.next().map_or(0, word_from), Relaxed);
        }
        self.long
            .store((bytes.len() > INLINE).then(|| Arc::new(Box::<str>::from(name.account))));
        self.hash_low.store(name.hash as u32, Relaxed);
        self.op.store(op, Relaxed);
        self.len.store(bytes.len() as u16, Release);
    }

    fn account(&self) -> AccountName {
        let len = usize::from(self.len.load(Acquire));
        let mut inline = [0; INLINE];
        if len <= INLINE {
            for (bytes, word) in inline.chunks_mut(8).zip(&self.inline) {
                bytes.copy_from_slice(&word.load(Relaxed).to_le_bytes());
            }
            return AccountName {
                inline,
                len,
                long: None,
            };
        }
        AccountName {
            inline,
            len,
            long: self.long.load_full(),
        }
    }
}

/// Whether `a` and `b` are the same bytes, word by word (names are short:
/// a slice comparison would call `memcmp`).
#[inline(always)]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let ((a_words, a_tail), (b_words, b_tail)) = (a.as_chunks::<8>(), b.as_chunks::<8>());
    a_words.iter().zip(b_words).all(|(x, y)| x == y) && word_from(a_tail) == word_from(b_tail)
}

/// Up to 8 bytes as a little-endian word, zero past their end, in a
/// few loads whatever the length: a shorter tail is read as two
/// overlapping halves, or three bytes (a copy of a variable length would
/// call `memcpy`, and a loop over the bytes cost a check more than the
/// rest of its lookup).
#[inline(always)]
fn word_from(bytes: &[u8]) -> u64 {
    let n = bytes.len();
    if let Some(word) = bytes.first_chunk::<8>() {
        return u64::from_le_bytes(*word);
    }
    if n >= 4 {
        let low = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
        let high = u32::from_le_bytes(bytes[n - 4..].try_into().expect("4 bytes"));
        return u64::from(low) | u64::from(high) << (8 * (n - 4));
    }
    if n == 0 {
        return 0;
    }
    u64::from(bytes[0])
        | u64::from(bytes[n / 2]) << (8 * (n / 2))
        | u64::from(bytes[n - 1]) << (8 * (n - 1))
}

impl<'t> Pinned<'t> {
    /// The entry of (`account`, `op`), if the table holds it.
    #[inline(always)]
    pub(super) fn find(&self, account: &str, op: &str) -> Option<&Entry> {
        self.get(&self.table.name(account, op))
    }

    /// The entry of `name`, if the table holds it.
    #[inline(always)]
    pub(super) fn get(&self, name: &PairName<'_>) -> Option<&Entry> {
        Some(&self.generation.find(name)?.1.entry)
    }

    /// [`find`](Self::find), trying first the position `at` holds (plus
    /// one; 0 for none), and leaving in `at` where it found the pair: a
    /// caller that comes back to the same pairs over and over (the
    /// simulator's steps) skips the hash and the index word, one cache
    /// miss of two. A position is only a hint: the slot's name decides.
    /// One taken out of the index before this hold may be made over for
    /// another pair meanwhile, whose name reads whole or not at all (see
    /// `SlotName::named`); one taken out during it waits for it.
    #[inline]
    pub(super) fn find_near(&self, account: &str, op: &str, at: &mut Pos) -> Option<&Entry> {
        if let Some(pos) = at.checked_sub(1)
            && let Some(slot) = self.generation.slot(pos)
            && slot.name.named(&self.generation.ops, account, op)
        {
            return Some(&slot.entry);
        }
        let (pos, slot) = self.generation.find(&self.table.name(account, op))?;
        *at = pos + 1;
        Some(&slot.entry)
    }

    /// The entry of `name`, made by `make` if the table does not hold it
    /// (under the table's lock), and whether this call made it. `None`
    /// when `name`'s op has no number or the table is full. For a caller
    /// whose own lookup ([`get`](Self::get)) found nothing: it looks
    /// again, under the lock, in the current generation only.
    pub(super) fn get_or_insert(
        &self,
        name: &PairName<'_>,
        op: Option<u16>,
        make: impl FnOnce(&Entry),
    ) -> Option<(&Entry, bool)> {
        let table = self.table;
        let mut writer = lock(&table.writer);
        // The current index, which may be newer than this reader's: a pair
        // inserted since is found, not made twice.
        let current = table.current.load_full();
        if let Some((pos, _)) = current.find(name) {
            // From the table's own list: its chunks live as long as it.
            return Some((&table.slot(pos).entry, false));
        }
        let op = op?;
        let pos = table.new_pos(&mut writer)?;
        let slot = table.slot(pos);
        make(&slot.entry);
        slot.name.write(name, op);
        let live = table.live.load(Relaxed);
        if (live + writer.tombstones + 1) * 4 > current.places.len() * 3 {
            table.rebuild(&mut writer, &current.places);
        }
        let places = table.current.load().places.clone();
        if place(&places, name.hash as u32, word_of(name.hash, pos)) {
            writer.tombstones -= 1;
        }
        table.live.store(live + 1, Relaxed);
        Some((&slot.entry, true))
    }

    /// Takes the pair at `pair` out of the table: lookups from now on do
    /// not find it, and its slot is made over only after every reader
    /// that might have found it is done (see
    /// [`end_generation`](PairTable::end_generation), which the caller
    /// calls after its removals). Returns whether it took it out: not if
    /// the index no longer holds it.
    pub(super) fn remove(&self, pair: PairRef<'_>) -> bool {
        let table = self.table;
        let mut writer = lock(&table.writer);
        let places = table.current.load().places.clone();
        let mask = places.len() - 1;
        let mut i = pair.slot.name.hash_low.load(Relaxed) as usize & mask;
        loop {
            let word = places[i].load(Relaxed);
            if word == EMPTY {
                return false;
            }
            if word > TOMBSTONE && pos_of(word) == pair.pos {
                places[i].store(TOMBSTONE, Release);
                break;
            }
            i = (i + 1) & mask;
        }
        pair.slot.name.len.store(0, Release);
        writer.tombstones += 1;
        writer.removed.push(pair.pos);
        table.live.fetch_sub(1, Relaxed);
        true
    }

    /// Every pair in the table (those made during the pass may or may not
    /// be met), chunk by chunk: slots in the order they sit in memory
    /// (every chunk made before this hold is in its generation; slots no
    /// pair took yet are vacant, as forgotten ones are; those past the
    /// last position made are not visited).
    pub(super) fn pairs(&self) -> impl Iterator<Item = PairRef<'_>> + '_ {
        let table = self.table;
        let made = table.made.load(Acquire) as usize;
        self.generation
            .chunks
            .iter()
            .enumerate()
            .flat_map(move |(c, chunk)| {
                let first = c << CHUNK_BITS;
                let taken = chunk.len().min(made.saturating_sub(first));
                chunk[..taken]
                    .iter()
                    .enumerate()
                    .map(move |(i, slot)| (first + i, slot))
            })
            .filter(|(_, slot)| slot.name.len.load(Acquire) != 0)
            .map(move |(pos, slot)| PairRef {
                pos: pos as Pos,
                table,
                slot,
            })
    }
}

impl<'p> PairRef<'p> {
    pub(super) fn entry(&self) -> &'p Entry {
        &self.slot.entry
    }

    /// The op's interned name.
    pub(super) fn op(&self) -> &'p Arc<str> {
        self.table
            .op_name(self.slot.name.op.load(Relaxed))
            .expect("a slot's op is numbered before the slot is written")
    }

    /// A copy of the account's name (empty once the pair is removed).
    pub(super) fn account(&self) -> AccountName {
        self.slot.name.account()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Nanos;

    /// An index word is 4 bytes: every position a table makes, with any
    /// tag, reads back, and a live word is never empty nor a tombstone.
    #[test]
    fn index_words_hold_every_position_and_tag() {
        let last = (1 << POS_BITS) - 2;
        assert_eq!(
            last as usize & CHUNK_SLOTS,
            CHUNK_SLOTS - 1,
            "a slot's position"
        );
        for hash in [0, 1, u64::MAX, 0x00ff_ffff_ffff_ffff, 0xab00_0000_0000_0000] {
            for pos in [0, 1, 1022, 1024, last] {
                let word = word_of(hash, pos);
                assert_eq!(pos_of(word), pos);
                assert_eq!(word >> POS_BITS, tag_of(hash));
                assert!(word > TOMBSTONE && tag_of(hash) >= 1);
            }
        }
        assert_eq!(tag_of(0xab00_0000_0000_0000), 0xab);
        // The position after the last a chunk has room for is none.
        assert_eq!((last + 1) as usize & CHUNK_SLOTS, CHUNK_SLOTS);
        assert_eq!(
            SPANS << SPAN_BITS << CHUNK_BITS,
            1 << POS_BITS,
            "the spans cover every position"
        );
    }

    fn insert(table: &PairTable, account: &str, op: u16) -> bool {
        let pinned = table.pin();
        let name = table.name(account, "op");
        pinned
            .get_or_insert(&name, Some(op), |e| e.reset(Nanos::ZERO, 0))
            .expect("room")
            .1
    }

    /// Takes `account`'s pair out of the table, as a forget pass does,
    /// and ends the generation.
    fn forget(table: &PairTable, account: &str) {
        {
            let pinned = table.pin();
            let pair = pinned
                .pairs()
                .find(|p| p.account().as_str() == account)
                .unwrap();
            pinned.remove(pair);
        }
        table.end_generation();
    }

    #[test]
    fn pairs_are_found_after_the_index_grows() {
        let table = PairTable::new();
        let op = table.number_op("op".into()).unwrap();
        let long = "x".repeat(200);
        let names: Vec<String> = (0..5000)
            .map(|i| format!("acct-{i}"))
            .chain([long.clone(), "a".repeat(48), "b".repeat(49)])
            .collect();
        for name in &names {
            assert!(insert(&table, name, op), "{name} made once");
        }
        assert_eq!(table.len(), names.len());
        let pinned = table.pin();
        for name in &names {
            assert!(pinned.get(&table.name(name, "op")).is_some(), "{name}");
            assert!(!insert(&table, name, op), "{name} not made twice");
        }
        assert!(pinned.get(&table.name("acct-5000", "op")).is_none());
        assert!(pinned.get(&table.name("acct-1", "other")).is_none());
        let mut seen: Vec<String> = pinned
            .pairs()
            .map(|p| p.account().as_str().to_owned())
            .collect();
        seen.sort();
        let mut want = names.clone();
        want.sort();
        assert_eq!(seen, want);
    }

    #[test]
    fn a_removed_pairs_slot_is_reused_only_after_its_readers_are_done() {
        let table = PairTable::new();
        let op = table.number_op("op".into()).unwrap();
        insert(&table, "a", op);
        insert(&table, "b", op);
        let reader = table.pin();
        let a = reader.get(&table.name("a", "op")).unwrap() as *const Entry;
        forget(&table, "a");
        assert_eq!(table.len(), 1);
        assert!(table.pin().get(&table.name("a", "op")).is_none());
        // The reader from before the removal still holds "a"'s old slot:
        // a new pair gets a new one.
        insert(&table, "c", op);
        let c = table.pin().get(&table.name("c", "op")).unwrap() as *const Entry;
        assert_ne!(a, c);
        drop(reader);
        // Now no reader can hold it: the next new pair takes it.
        insert(&table, "d", op);
        let d = table.pin().get(&table.name("d", "op")).unwrap() as *const Entry;
        assert_eq!(a, d);
        let pinned = table.pin();
        let mut seen: Vec<String> = pinned
            .pairs()
            .map(|p| p.account().as_str().to_owned())
            .collect();
        seen.sort();
        assert_eq!(seen, ["b", "c", "d"]);
    }

    /// A position given as a hint finds its pair without the index, and a
    /// wrong or stale one (another pair's, a vacant slot's, one past the
    /// chunks) finds it through the index and says where it is.
    #[test]
    fn a_hinted_position_is_tried_first_and_corrected() {
        let table = PairTable::new();
        let op = table.number_op("op".into()).unwrap();
        for i in 0..10 {
            insert(&table, &format!("acct-{i}"), op);
        }
        let pinned = table.pin();
        let want = pinned.find("acct-7", "op").unwrap() as *const Entry;
        let mut at = 0;
        assert_eq!(
            pinned.find_near("acct-7", "op", &mut at).unwrap() as *const Entry,
            want
        );
        let pos = at;
        assert_ne!(pos, 0);
        // The hint alone: right, and left as it is.
        assert_eq!(
            pinned.find_near("acct-7", "op", &mut at).unwrap() as *const Entry,
            want
        );
        assert_eq!(at, pos);
        // Another pair's position, one past every chunk, another op's.
        for wrong in [1, 5_000_000] {
            let mut at = wrong;
            assert_eq!(
                pinned.find_near("acct-7", "op", &mut at).unwrap() as *const Entry,
                want
            );
            assert_eq!(at, pos);
        }
        let mut at = pos;
        assert!(pinned.find_near("acct-7", "other", &mut at).is_none());
        drop(pinned);
        // Forgotten, its slot made over for a stranger: the hint finds the
        // stranger's name, not the pair's.
        forget(&table, "acct-7");
        insert(&table, "stranger", op);
        let pinned = table.pin();
        let mut at = pos;
        assert!(pinned.find_near("acct-7", "op", &mut at).is_none());
        let mut at = pos;
        let stranger = pinned.find_near("stranger", "op", &mut at).unwrap() as *const Entry;
        assert_eq!(stranger, want, "the slot made over");
    }

    /// The reader that lets go of the last hold on a replaced generation
    /// does not end it: that would take the writer's lock (and free the
    /// generation) on a check's path. The writer ends it at its next
    /// insert or pass, and the position it held back is reused then.
    #[test]
    fn a_reader_letting_go_of_an_ended_generation_takes_no_lock() {
        let table = PairTable::new();
        let op = table.number_op("op".into()).unwrap();
        insert(&table, "a", op);
        insert(&table, "b", op);
        let reader = table.pin();
        assert!(reader.get(&table.name("a", "op")).is_some());
        forget(&table, "a");
        // The writer's lock held elsewhere: the reader still lets go.
        let writer = lock(&table.writer);
        let (done, let_go) = std::sync::mpsc::channel();
        std::thread::scope(|scope| {
            scope.spawn(move || {
                drop(reader);
                done.send(()).unwrap();
            });
            let waited = let_go.recv_timeout(std::time::Duration::from_secs(20));
            assert!(waited.is_ok(), "the reader waited for a lock to let go");
        });
        // The replaced generation is the writer's to end, not yet ended.
        assert!(!writer.retired.is_empty());
        assert!(writer.grace.free.is_empty());
        drop(writer);
        table.end_generation();
        let writer = lock(&table.writer);
        assert!(writer.retired.is_empty(), "let go of, it is ended");
        assert_eq!(writer.grace.free.len(), 1, "and a's position is free");
    }

    /// A chunk holds 1 023 slots (its allocation, with the `Arc`'s
    /// header, within 192 KiB): the last position of each is never given
    /// out, and every pair is met.
    #[test]
    fn a_chunks_last_position_is_never_used() {
        const _: () = assert!(CHUNK_SLOTS * size_of::<Slot>() + 64 <= 192 << 10);
        let table = PairTable::new();
        let op = table.number_op("op".into()).unwrap();
        for i in 0..2_100 {
            insert(&table, &format!("acct-{i}"), op);
        }
        let pinned = table.pin();
        let positions: Vec<Pos> = pinned.pairs().map(|p| p.pos).collect();
        assert_eq!(positions.len(), 2_100);
        assert!(
            positions
                .iter()
                .all(|&p| p as usize & CHUNK_SLOTS != CHUNK_SLOTS)
        );
        assert!(pinned.get(&table.name("acct-2099", "op")).is_some());
    }

    #[test]
    fn the_index_shrinks_after_many_pairs_are_forgotten() {
        let table = PairTable::new();
        let op = table.number_op("op".into()).unwrap();
        for i in 0..4000 {
            insert(&table, &format!("acct-{i}"), op);
        }
        let grown = table.current.load().places.len();
        let made = lock(&table.writer).made;
        let kept = {
            let pinned = table.pin();
            pinned.pairs().filter(|p| p.pos % 100 == 0).count()
        };
        {
            let pinned = table.pin();
            for pair in pinned.pairs().filter(|p| p.pos % 100 != 0) {
                pinned.remove(pair);
            }
        }
        table.end_generation();
        // New pairs fill the tombstones until a rebuild sized for the
        // live pairs.
        for i in 0..3000 {
            insert(&table, &format!("new-{i}"), op);
        }
        assert!(table.current.load().places.len() <= grown);
        assert_eq!(table.len(), kept + 3000);
        let pinned = table.pin();
        assert!(pinned.get(&table.name("acct-100", "op")).is_some());
        assert!(pinned.get(&table.name("acct-101", "op")).is_none());
        assert!(pinned.get(&table.name("new-2999", "op")).is_some());
        // Forgotten positions were reused: nothing grew past the first
        // 4 000 pairs' (and the chunks' unused last positions).
        assert_eq!(lock(&table.writer).made, made);
        assert_eq!(made, 4000 + 3);
    }

    #[test]
    fn a_word_holds_its_bytes_in_order_whatever_their_length() {
        let bytes: Vec<u8> = (1..=9).collect();
        for n in 0..=8 {
            let mut want = [0; 8];
            want[..n].copy_from_slice(&bytes[..n]);
            assert_eq!(
                word_from(&bytes[..n]),
                u64::from_le_bytes(want),
                "{n} bytes"
            );
        }
        assert!(same_bytes(b"messages", b"messages"));
        assert!(!same_bytes(b"messages", b"messagez"));
        assert!(!same_bytes(b"abc", b"abd"));
        assert!(!same_bytes(b"a", b"ab"));
    }

    #[test]
    fn ops_past_the_most_are_not_numbered() {
        let table = PairTable::new();
        for i in 0..MAX_OPS {
            assert_eq!(table.number_op(format!("op{i}").into()), Some(i as u16));
        }
        assert_eq!(table.number_op("one more".into()), None);
        assert_eq!(&**table.op_name(7).unwrap(), "op7");
    }
}
