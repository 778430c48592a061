//! [`AccountName`]: a master entry's account name in 16 bytes, inline up
//! to 15; of a longer name the first 10 bytes inline and the rest in
//! [`LongNames`], beside the entries.

use std::ops::Deref;

use crate::MAX_NAME_LEN;

/// The longest name an [`AccountName`] holds inline.
const INLINE: usize = 15;

/// How much of a longer name an [`AccountName`] holds inline: the rest
/// of its 16 bytes are the tail's place (4), the length (1) and [`LONG`].
const PREFIX: usize = 10;

/// Where a long name's place starts, and the byte of its length.
const PLACE: usize = PREFIX;
const LENGTH: usize = PLACE + 4;

/// The last byte of an [`AccountName`] whose tail is in [`LongNames`]
/// (an inline name's last byte is its length, at most [`INLINE`]).
const LONG: u8 = u8::MAX;

// A long name's length, less the shortest (16), fits its byte.
const _: () = assert!(MAX_NAME_LEN - (INLINE + 1) <= u8::MAX as usize);

/// An account's name as a master's entry holds it: 16 bytes, aligned to
/// one, where a `CompactString` took 24 aligned to eight. Names of up to
/// 15 bytes (most account ids: `account-0000000`, a 6-character app id, a
/// 12-digit number) are inline, the last byte their length and the rest
/// zero. Of a longer one the entry holds its first 10 bytes, its length
/// and where [`LongNames`] keeps the rest. Of a million entries, that is
/// 8 MB fewer (the entry went from 72 bytes to 64); a name of 16 to 24
/// bytes, inline before, costs 0 to 6 bytes more than it did, a longer
/// one its length less 10 rather than an allocation.
///
/// Not `Clone`: a long name's place is its entry's alone, given back when
/// the entry goes ([`LongNames::release`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct AccountName([u8; 16]);

/// `account` packed inline, if it fits.
fn packed(account: &[u8]) -> Option<[u8; 16]> {
    (account.len() <= INLINE).then(|| {
        let mut packed = [0u8; 16];
        packed[..account.len()].copy_from_slice(account);
        packed[INLINE] = account.len() as u8;
        packed
    })
}

impl AccountName {
    /// Where in [`LongNames`] its tail starts, if not inline.
    fn place(&self) -> Option<usize> {
        (self.0[INLINE] == LONG).then(|| {
            let place = &self.0[PLACE..PLACE + 4];
            u32::from_le_bytes([place[0], place[1], place[2], place[3]]) as usize
        })
    }

    /// Its length in bytes, read from the entry alone.
    pub(super) fn len(&self) -> usize {
        match self.0[INLINE] {
            LONG => usize::from(self.0[LENGTH]) + INLINE + 1,
            inline => usize::from(inline),
        }
    }
}

/// A name read back from an [`AccountName`], whole: a short one where the
/// entry holds it, a long one (in two pieces there) put together on the
/// stack. Read to hash every entry when the index grows, and twice per
/// eviction: short names are not copied.
// A value on the stack for the length of a hash or a view: boxing the
// long one would allocate for it.
#[allow(clippy::large_enum_variant)]
pub(super) enum AccountStr<'a> {
    Inline(&'a [u8]),
    Long {
        bytes: [u8; MAX_NAME_LEN],
        len: usize,
    },
}

impl Deref for AccountStr<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        let bytes = match self {
            AccountStr::Inline(bytes) => bytes,
            AccountStr::Long { bytes, len } => &bytes[..*len],
        };
        std::str::from_utf8(bytes).expect("held from a str")
    }
}

/// The bytes of a chunk of [`LongNames`]: a tail never spans two, so at
/// most [`MAX_NAME_LEN`] − 11 bytes of each are left unused; growing adds
/// a chunk, never copies the tails there.
const CHUNK: usize = 64 << 10;

/// The tails of the names too long for an [`AccountName`], one after
/// another in chunks: a name costs its length less 10, not an allocation
/// and a pointer. A tail's place stays its entry's while the entry moves;
/// a place given back is taken again by a tail of the same length (the
/// names of one platform's accounts mostly share a few lengths). Once
/// more than half of what is written is free (names that changed length
/// for good, or a hostile client's made-up names of every length, gone
/// with their pairs), the entries' tails are copied into fresh chunks
/// ([`Entries::compact_names`](super::table::Entries::compact_names)) and
/// the old ones given back: without it, a client that sent made-up long
/// names of one length after another, each batch evicted before the next,
/// grew a master by the sum of their peaks.
#[derive(Debug, Default)]
pub(super) struct LongNames {
    chunks: Vec<Vec<u8>>,
    /// Places given back, by length.
    free: Vec<Vec<u32>>,
    /// The bytes of the places in `free`.
    free_bytes: usize,
}

impl LongNames {
    /// `account` as an entry holds it, keeping its tail here if it is
    /// long.
    pub(super) fn hold(&mut self, account: &str) -> AccountName {
        let bytes = account.as_bytes();
        if let Some(packed) = packed(bytes) {
            return AccountName(packed);
        }
        // Names are validated before any entry is made: one longer would
        // not read back.
        assert!(
            bytes.len() <= MAX_NAME_LEN,
            "an account name of {} bytes",
            bytes.len()
        );
        let (prefix, tail) = bytes.split_at(PREFIX);
        let place = match self.free.get_mut(tail.len()).and_then(Vec::pop) {
            Some(place) => {
                self.free_bytes -= tail.len();
                let (chunk, at) = split(place as usize);
                self.chunks[chunk][at..at + tail.len()].copy_from_slice(tail);
                place
            }
            None => self.append(tail),
        };
        let mut name = [0u8; 16];
        name[..PREFIX].copy_from_slice(prefix);
        name[PLACE..PLACE + 4].copy_from_slice(&place.to_le_bytes());
        name[LENGTH] = (bytes.len() - (INLINE + 1)) as u8;
        name[INLINE] = LONG;
        AccountName(name)
    }

    /// Writes `tail` after the last one, in a new chunk if the last one
    /// has no room; returns where.
    fn append(&mut self, tail: &[u8]) -> u32 {
        if self
            .chunks
            .last()
            .is_none_or(|c| c.len() + tail.len() > CHUNK)
        {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        let chunk = self.chunks.len() - 1;
        let last = &mut self.chunks[chunk];
        let at = last.len();
        last.extend_from_slice(tail);
        u32::try_from(chunk * CHUNK + at).expect("under 4 GiB of long account names per shard")
    }

    /// The tail of a long name at `place`.
    fn tail(&self, name: &AccountName, place: usize) -> &[u8] {
        let (chunk, at) = split(place);
        &self.chunks[chunk][at..at + name.len() - PREFIX]
    }

    /// The name `name` holds.
    pub(super) fn get<'a>(&self, name: &'a AccountName) -> AccountStr<'a> {
        let len = name.len();
        let Some(place) = name.place() else {
            return AccountStr::Inline(&name.0[..len]);
        };
        let mut bytes = [0; MAX_NAME_LEN];
        bytes[..PREFIX].copy_from_slice(&name.0[..PREFIX]);
        bytes[PREFIX..len].copy_from_slice(self.tail(name, place));
        AccountStr::Long { bytes, len }
    }

    /// Whether `name` holds `account`: one 16-byte comparison for a short
    /// one; for a long one the length and the first 10 bytes, read from
    /// the entry alone, before the rest.
    pub(super) fn is(&self, name: &AccountName, account: &str) -> bool {
        let account = account.as_bytes();
        match packed(account) {
            Some(packed) => name.0 == packed,
            None => {
                name.len() == account.len()
                    && name.0[..PREFIX] == account[..PREFIX]
                    && name
                        .place()
                        .is_some_and(|place| self.tail(name, place) == &account[PREFIX..])
            }
        }
    }

    /// Gives back the place of `name`'s tail, whose entry is gone.
    pub(super) fn release(&mut self, name: &AccountName) {
        if let Some(place) = name.place() {
            let len = name.len() - PREFIX;
            if self.free.len() <= len {
                self.free.resize_with(len + 1, Vec::new);
            }
            self.free[len].push(place as u32);
            self.free_bytes += len;
        }
    }

    /// `name`, whose tail `from` holds, as these names hold it: a long
    /// name's tail copied here (after the last one, not into a free
    /// place), a short one as it is. For compaction: `from` is dropped
    /// once every entry's name has moved.
    pub(super) fn moved(&mut self, from: &LongNames, name: &AccountName) -> AccountName {
        let Some(place) = name.place() else {
            return AccountName(name.0);
        };
        let place = self.append(from.tail(name, place));
        let mut moved = name.0;
        moved[PLACE..PLACE + 4].copy_from_slice(&place.to_le_bytes());
        AccountName(moved)
    }

    /// Whether more than half of what is written here is free, by more
    /// than a chunk: worth copying the tails held into fresh chunks.
    pub(super) fn wasteful(&self) -> bool {
        self.free_bytes > CHUNK && 2 * self.free_bytes > self.written()
    }

    /// Bytes of tails held here, beyond the entries.
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.written() - self.free_bytes
    }

    /// Bytes written, held or free.
    pub(super) fn written(&self) -> usize {
        self.chunks.iter().map(Vec::len).sum()
    }
}

/// The chunk and offset of a place.
fn split(place: usize) -> (usize, usize) {
    (place / CHUNK, place % CHUNK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_up_to_fifteen_bytes_are_inline_and_longer_ones_beside() {
        let mut names = LongNames::default();
        for account in ["", "a", "account-0000000", "ünïcødé-ñm"] {
            let name = names.hold(account);
            assert_eq!(&*names.get(&name), account);
            assert_eq!(name.len(), account.len());
            assert!(names.is(&name, account));
        }
        assert_eq!(names.held(), 0, "all of them inline");
        let long = "account-00000000"; // 16 bytes
        let name = names.hold(long);
        assert_eq!((&*names.get(&name), name.len()), (long, 16));
        assert_eq!(names.held(), 6, "all but its first 10 bytes");
        let longest = "x".repeat(MAX_NAME_LEN);
        let name2 = names.hold(&longest);
        assert_eq!(*names.get(&name2), longest);
        assert_eq!(name2.len(), MAX_NAME_LEN);
    }

    #[test]
    fn moved_names_read_the_same_and_leave_the_free_places_behind() {
        let mut names = LongNames::default();
        let long = |i: usize| format!("a-long-account-name-{i:06}");
        let held: Vec<AccountName> = (0..5_000).map(|i| names.hold(&long(i))).collect();
        let tail = long(0).len() - PREFIX;
        assert!(!names.wasteful());
        // Give back all but every hundredth.
        let mut kept = Vec::new();
        for (i, name) in held.into_iter().enumerate() {
            if i % 100 == 0 {
                kept.push((i, name));
            } else {
                names.release(&name);
            }
        }
        assert_eq!(names.held(), 50 * tail);
        assert!(
            names.wasteful(),
            "{} free of {}",
            names.free_bytes,
            names.written()
        );
        let mut fresh = LongNames::default();
        let short = names.hold("short");
        assert_eq!(fresh.moved(&names, &short), short);
        for (i, name) in &kept {
            let moved = fresh.moved(&names, name);
            assert_eq!(&*fresh.get(&moved), long(*i));
            assert!(fresh.is(&moved, &long(*i)));
        }
        assert_eq!((fresh.written(), fresh.held()), (50 * tail, 50 * tail));
        assert!(!fresh.wasteful());
    }

    #[test]
    fn a_name_is_only_its_own() {
        let mut names = LongNames::default();
        let short = names.hold("acme");
        let long = names.hold("acme-corporation-eu");
        for other in ["acm", "acme ", "acme\0", "Acme", "acme-corporation-e", ""] {
            assert!(!names.is(&short, other), "{other:?}");
            assert!(!names.is(&long, other), "{other:?}");
        }
        // A name of 15 bytes ending in what would be a length byte.
        let tricky = names.hold("abcdefghijklmn\u{f}");
        assert!(!names.is(&tricky, "abcdefghijklmn"));
        assert!(names.is(&tricky, "abcdefghijklmn\u{f}"));
        assert!(names.is(&short, "acme") && names.is(&long, "acme-corporation-eu"));
        assert!(
            !names.is(&long, "acme-corporation-EU"),
            "same length, other tail"
        );
        assert!(
            !names.is(&long, "ACME-corporation-eu"),
            "same length, other prefix"
        );
        // Two long names of one length with the same tail, or prefix.
        let twin = names.hold("ACME-corporation-eu");
        let sibling = names.hold("acme-corporation-us");
        assert!(names.is(&twin, "ACME-corporation-eu") && !names.is(&twin, "acme-corporation-eu"));
        assert!(
            names.is(&sibling, "acme-corporation-us") && !names.is(&sibling, "acme-corporation-eu")
        );
    }

    #[test]
    fn a_released_place_is_used_again_and_others_keep_theirs() {
        let mut names = LongNames::default();
        let a = names.hold("a-name-longer-than-fifteen");
        let b = names.hold("b-name-longer-than-fifteen");
        names.release(&a);
        assert_eq!((names.held(), names.written()), (16, 32), "tails of 16");
        let c = names.hold("c-name-longer-than-fifteen");
        assert_eq!(names.written(), 32, "a's place taken again");
        let d = names.hold("d-name-longer-than-fifteen!");
        assert_eq!(names.written(), 49, "of another length: written after");
        assert_eq!(&*names.get(&b), "b-name-longer-than-fifteen");
        assert_eq!(&*names.get(&c), "c-name-longer-than-fifteen");
        assert_eq!(&*names.get(&d), "d-name-longer-than-fifteen!");
        let short = names.hold("short");
        names.release(&short);
        assert_eq!(names.held(), 49, "a short name holds no place");
    }

    #[test]
    fn names_never_span_two_chunks() {
        let mut names = LongNames::default();
        let held: Vec<(String, AccountName)> = (0..1_000)
            .map(|i| {
                let account = format!("{i:0>width$}", width = 16 + i % 241);
                let name = names.hold(&account);
                (account, name)
            })
            .collect();
        assert!(names.chunks.len() > 1);
        assert!(names.chunks.iter().all(|c| c.len() <= CHUNK));
        for (account, name) in &held {
            assert_eq!(&*names.get(name), account);
            assert!(names.is(name, account));
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Any names, held, released in part and held again, read back as
        /// themselves and are each only their own.
        #[test]
        fn every_name_reads_back_and_matches_only_itself(
            accounts in proptest::collection::vec("\\PC{1,90}", 1..40),
            released in proptest::collection::vec(proptest::bool::ANY, 40),
        ) {
            let accounts: Vec<String> = accounts
                .into_iter()
                .map(|a| a.chars().scan(0, |len, c| {
                    *len += c.len_utf8();
                    (*len <= MAX_NAME_LEN).then_some(c)
                }).collect())
                .collect();
            let mut names = LongNames::default();
            let mut held: Vec<(String, AccountName)> =
                accounts.iter().map(|a| (a.clone(), names.hold(a))).collect();
            // Some go, and their places are taken by the same names again.
            for (i, (account, name)) in held.iter_mut().enumerate() {
                if released[i] {
                    names.release(name);
                    *name = names.hold(account);
                }
            }
            for (account, name) in &held {
                proptest::prop_assert_eq!(&*names.get(name), account.as_str());
                proptest::prop_assert_eq!(name.len(), account.len());
                for (other, _) in &held {
                    proptest::prop_assert_eq!(names.is(name, other), account == other);
                }
            }
        }
    }
}
