//! Account names sent once: a per-(agent, master) dictionary that lets a
//! rollup name an account by a small number instead of its name.
//!
//! Most of a rollup entry's bytes are its account's name, sent again every
//! round for the same accounts. With a dictionary, the agent numbers each
//! account it reports to a master and sends the name once, beside its
//! number ([`AccountCounts::id`]); once the master has answered a rollup
//! that carried the pair, later rounds carry the account by number alone
//! ([`OpCounts::by_id`], three packed numbers on the wire: a few bytes an
//! entry rather than twenty).
//!
//! Both sides live here, so they cannot drift apart:
//! - [`AgentDictionary`], one per master, in the agent's round: numbers
//!   accounts, rewrites a rollup for its master ([`AgentDictionary::compact`]),
//!   learns from replies which numbers the master holds.
//! - [`Dictionaries`], in the master: one [`Held`] dictionary per agent run
//!   (`agent_id`, `incarnation`), which turns numbers back into names
//!   before anything else reads the rollup ([`Dictionaries::expand`]).
//!
//! # Safety of the protocol
//! - **Opt-in by the master.** An agent uses numbers only with a master
//!   whose last reply said it holds dictionaries ([`Reply::takes_ids`]).
//!   A master that predates them never says so, and gets names; an agent
//!   that predates them never sends numbers, and the master reads names as
//!   always.
//! - **Confirmed before use.** A number goes alone only after a reply to a
//!   rollup that defined it. A rollup whose answer never came may or may
//!   not have been taken: its new accounts are named again, with the same
//!   numbers, until a reply comes (a master that took the first naming
//!   takes the same one again).
//! - **Refused, not guessed.** A master that does not hold a number the
//!   rollup uses (it restarted, or dropped an idle agent's dictionary)
//!   refuses the whole rollup with [`DictionaryError::Unknown`]
//!   (FAILED_PRECONDITION on the wire), counting none of it. The agent
//!   starts a new *epoch* ([`AgentDictionary::refused`]: a fresh, empty
//!   dictionary on the master) and resends the rollup at once, naming
//!   every account: nothing is lost and nothing counted twice (the resend
//!   keeps its sequence number). Only that refusal resets a dictionary: a
//!   timeout under load costs no more bytes than it did before numbers.
//! - **Bounded.** A master holds at most [`DictionaryLimits::max_ids`]
//!   numbers per agent run and [`DictionaryLimits::max_total`] in all; an
//!   agent past them is told `takes_ids = false` and names its accounts, as
//!   before dictionaries. Dictionaries idle for a while are dropped.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::time::Duration;

use compact_str::CompactString;
use foldhash::fast::RandomState;

use super::{AccountCounts, IdCounts, OpCounts, Reply, Rollup, validate_name};
use crate::time::Nanos;

/// How a rollup's accounts are named: `0` for no dictionary (names only),
/// otherwise the epoch of the sending agent's dictionary for this master.
pub type Epoch = u32;

/// Why a master refuses a rollup's numbers.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DictionaryError {
    /// The rollup uses a number this master does not hold for the agent
    /// (or a dictionary it does not hold at all): resend with names.
    #[error(
        "ops[{op}].ids: account id {id} is not in this master's dictionary for agent run {incarnation} (epoch {epoch}); send the account names again"
    )]
    Unknown {
        /// Index of the op.
        op: usize,
        /// The number.
        id: u32,
        /// The agent run's incarnation.
        incarnation: u64,
        /// The rollup's epoch.
        epoch: Epoch,
    },
    /// A definition gives a held number another name: the agent's
    /// dictionary and the master's disagree; resend with names in a new
    /// epoch.
    #[error(
        "ops[{op}].accounts[{account}].id: id {id} is held for another account in epoch {epoch}; start a new epoch"
    )]
    Conflict {
        /// Index of the op.
        op: usize,
        /// Index of the entry.
        account: usize,
        /// The number.
        id: u32,
        /// The rollup's epoch.
        epoch: Epoch,
    },
    /// Numbers in a rollup that names no dictionary (`dictionary` is 0).
    #[error("ops[{op}]: account ids without a dictionary (dictionary is 0)")]
    NoDictionary {
        /// Index of the op.
        op: usize,
    },
    /// A number of 0, which names nothing.
    #[error("ops[{op}]: account id 0 is not a valid id")]
    Zero {
        /// Index of the op.
        op: usize,
    },
}

impl DictionaryError {
    /// Whether the agent should resend with names (the master lacks what
    /// the agent thought it held), rather than fix a malformed request.
    pub fn is_unknown(&self) -> bool {
        matches!(
            self,
            DictionaryError::Unknown { .. } | DictionaryError::Conflict { .. }
        )
    }
}

/// One account as an [`AgentDictionary`] numbers it.
#[derive(Clone, Copy, Debug)]
struct Slot {
    id: u32,
    /// Whether the master holds it: a reply came to a rollup of this epoch
    /// that defined it.
    confirmed: bool,
    /// The end of the last rollup that carried it, for pruning.
    used: Nanos,
}

/// An account no rollup has carried for this long counts as gone quiet;
/// the dictionary is looked over for pruning this often.
const PRUNE_AFTER: Duration = Duration::from_secs(64);

/// The agent's dictionary for one master. See the module docs.
#[derive(Debug)]
pub struct AgentDictionary {
    /// Whether the master said, in its last reply to a rollup, that it
    /// takes numbers.
    enabled: bool,
    epoch: Epoch,
    /// Looked up once per entry of every rollup: a fast hasher, seeded
    /// at random (an account name is the client's to choose); names up to
    /// 24 bytes inline, so an account costs about 40 bytes and a slot.
    slots: HashMap<CompactString, Slot, RandomState>,
    next_id: u32,
    /// The end of the rollup being compacted: the clock of `Slot::used`.
    now: Nanos,
    /// When the dictionary was last looked over for pruning.
    pruned: Nanos,
}

impl Default for AgentDictionary {
    fn default() -> Self {
        AgentDictionary {
            enabled: false,
            epoch: 1,
            slots: HashMap::default(),
            next_id: 1,
            now: Nanos::ZERO,
            pruned: Nanos::ZERO,
        }
    }
}

/// What [`AgentDictionary::compact`] defined in one rollup: confirmed
/// when its reply comes ([`AgentDictionary::confirm`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Defined {
    /// The epoch the rollup was sent in (0: it used no dictionary).
    pub epoch: Epoch,
    /// The numbers it defined.
    pub ids: Vec<u32>,
    /// How many of its entries went by number alone.
    pub by_number: usize,
}

impl AgentDictionary {
    /// Whether rollups to this master use numbers.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Accounts numbered.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no account is numbered.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The heap this dictionary holds, in bytes, as its table's capacity
    /// says: a slot and a control byte for each place, and the names too
    /// long to be kept inline (over 24 bytes).
    pub fn heap_bytes(&self) -> usize {
        let place = std::mem::size_of::<(CompactString, Slot)>() + 1;
        let spilled: usize = self
            .slots
            .keys()
            .filter(|name| name.is_heap_allocated())
            .map(|name| name.capacity())
            .sum();
        self.slots.capacity() * place + spilled
    }

    /// `rollup` (named) as it goes to this master: with numbers when the
    /// master takes them, each confirmed account by number alone and every
    /// other one named with its number; as it is otherwise. An entry with
    /// its own start (carried over) keeps its name: the packed form has no
    /// room for a start.
    pub fn compact(&mut self, rollup: &Rollup) -> (Rollup, Defined) {
        if !self.enabled {
            return (rollup.clone(), Defined::default());
        }
        self.now = self.now.max(rollup.end);
        self.prune();
        let mut defined = Vec::new();
        let ops = rollup
            .ops
            .iter()
            .map(|op| self.compact_op(op, &mut defined))
            .collect();
        let compacted = Rollup {
            ops,
            dictionary: self.epoch,
            ..rollup.without_ops()
        };
        let defined = Defined {
            epoch: self.epoch,
            ids: defined,
            by_number: compacted.ops.iter().map(|o| o.by_id.len()).sum(),
        };
        (compacted, defined)
    }

    fn compact_op(&mut self, op: &OpCounts, defined: &mut Vec<u32>) -> OpCounts {
        let mut named = Vec::new();
        let mut by_id = Vec::new();
        for c in &op.accounts {
            let slot = self.slot(&c.account);
            if slot.confirmed && c.since.is_none() {
                by_id.push(IdCounts {
                    id: slot.id,
                    attempted: c.attempted,
                    admitted: c.admitted,
                    op_cost: c.op_cost,
                    ops: c.ops,
                });
            } else {
                if !slot.confirmed {
                    defined.push(slot.id);
                }
                named.push(AccountCounts {
                    id: slot.id,
                    ..c.clone()
                });
            }
        }
        by_id.sort_unstable_by_key(|c| c.id);
        OpCounts {
            op: op.op.clone(),
            accounts: named,
            by_id,
        }
    }

    /// The slot of `account`, numbered now if new, marked used.
    fn slot(&mut self, account: &str) -> Slot {
        let now = self.now;
        if let Some(slot) = self.slots.get_mut(account) {
            slot.used = now;
            return *slot;
        }
        let slot = Slot {
            id: self.next_id,
            confirmed: false,
            used: now,
        };
        self.next_id += 1;
        self.slots.insert(CompactString::from(account), slot);
        slot
    }

    /// Starts afresh in a new epoch, keeping only the accounts used lately,
    /// numbered from 1, when more than half the numbers given out belong
    /// to accounts gone quiet: the master's copy, which never forgets a
    /// number within an epoch, stays within twice the live accounts.
    fn prune(&mut self) {
        if self.now.since(self.pruned) < PRUNE_AFTER {
            return;
        }
        self.pruned = self.now;
        let cutoff = self.now - PRUNE_AFTER;
        let live = self.slots.values().filter(|s| s.used >= cutoff).count();
        if live * 2 >= (self.next_id - 1) as usize && self.next_id < u32::MAX / 2 {
            return;
        }
        self.slots.retain(|_, s| s.used >= cutoff);
        self.next_epoch();
        let mut next = 1;
        for slot in self.slots.values_mut() {
            slot.id = next;
            next += 1;
        }
        self.next_id = next;
    }

    /// Every number unconfirmed, in a new epoch: the master's dictionary
    /// for it starts empty.
    fn next_epoch(&mut self) {
        self.epoch = self.epoch.wrapping_add(1).max(1);
        for slot in self.slots.values_mut() {
            slot.confirmed = false;
        }
    }

    /// A reply to a rollup arrived: whether the master takes numbers, and
    /// the numbers that rollup defined, now held (if still this epoch).
    pub fn confirm(&mut self, reply: &Reply, defined: &Defined) {
        if !reply.takes_ids {
            // An old master, or one at its budget: names from now on, and a
            // new epoch, should it take numbers again.
            if self.enabled || !self.slots.is_empty() {
                self.enabled = false;
                self.slots.clear();
                self.next_id = 1;
                self.next_epoch();
            }
            return;
        }
        self.enabled = true;
        if defined.epoch != self.epoch || defined.ids.is_empty() {
            return;
        }
        let mut ids: Vec<u32> = defined.ids.clone();
        ids.sort_unstable();
        for slot in self.slots.values_mut() {
            if ids.binary_search(&slot.id).is_ok() {
                slot.confirmed = true;
            }
        }
    }

    /// The master refused a rollup for its numbers
    /// ([`DictionaryError::is_unknown`]): it does not hold what this
    /// dictionary thought it did (it restarted, or dropped this agent's
    /// dictionary). A new epoch: every account is named again, and the
    /// master starts a fresh dictionary. Whether the refused rollup gave
    /// any account by number is the caller's to check first: one that did
    /// not cannot have been refused for it.
    pub fn refused(&mut self, defined: &Defined) {
        if defined.epoch != 0 && defined.epoch == self.epoch {
            self.next_epoch();
        }
    }
}

/// Bounds on what a master holds in dictionaries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DictionaryLimits {
    /// Most numbers held for one agent run: an agent past it names its
    /// accounts. Default 1 000 000.
    pub max_ids: u32,
    /// Most numbers held over every agent run, counted by the room they
    /// take (the highest number of each dictionary): past it, an agent is
    /// told to name its accounts. 4 bytes each, and each distinct name
    /// once (about 40 bytes). Default 8 000 000 (32 MB, and the names).
    pub max_total: usize,
    /// A dictionary unused this long is dropped. Default 5 minutes.
    pub idle_for: Duration,
}

impl Default for DictionaryLimits {
    fn default() -> Self {
        DictionaryLimits {
            max_ids: 1_000_000,
            max_total: 8_000_000,
            idle_for: Duration::from_secs(300),
        }
    }
}

/// One agent run's dictionary, held by a master.
#[derive(Debug)]
pub struct Held {
    epoch: Epoch,
    /// Index: the number; the name's place in [`Names`] plus one, 0 for
    /// numbers not defined. Four bytes a number: an account reported by
    /// `k` agents costs `4 k` bytes and its name once.
    names: Vec<u32>,
    last_used: Nanos,
    /// Its agent went past [`DictionaryLimits::max_ids`] or the room
    /// left: it holds no numbers, and tells the agent to name its
    /// accounts until it is dropped idle, so the agent does not try again
    /// every other round.
    over: bool,
}

/// What a dictionary counts against [`DictionaryLimits::max_total`] on top
/// of its numbers, for its own keeping (its key, its place in the map):
/// made-up agent runs with a number or two each cannot hold more than
/// `max_total / 16` dictionaries.
const DICTIONARY_ROOM: usize = 16;

/// Account names held by a master's dictionaries, each once however many
/// agents number it, with how many numbers refer to it.
#[derive(Debug, Default)]
struct Names {
    /// By place; a free place has no references.
    names: Vec<Name>,
    /// Places of the names, by hash of the name.
    index: hashbrown::HashTable<u32>,
    hasher: RandomState,
    /// Places freed, to reuse.
    free: Vec<u32>,
}

/// One account name a master's dictionaries hold.
#[derive(Debug, Default)]
struct Name {
    name: CompactString,
    /// Numbers that refer to it, over every dictionary.
    refs: u32,
    /// Where the master last found a pair of this account ([`Expansion`]):
    /// shared by every agent that numbers the account, and read in the
    /// same cache line as the name.
    at: u32,
}

impl Names {
    /// The place of `name`, which gains a reference (added if new).
    fn intern(&mut self, name: &str) -> u32 {
        let hash = self.hasher.hash_one(name);
        let names = &self.names;
        if let Some(&at) = self
            .index
            .find(hash, |&at| names[at as usize].name.as_str() == name)
        {
            self.names[at as usize].refs += 1;
            return at;
        }
        let entry = Name {
            name: CompactString::from(name),
            refs: 1,
            at: 0,
        };
        let at = match self.free.pop() {
            Some(at) => {
                self.names[at as usize] = entry;
                at
            }
            None => {
                self.names.push(entry);
                (self.names.len() - 1) as u32
            }
        };
        let (names, hasher) = (&self.names, &self.hasher);
        self.index.insert_unique(hash, at, |&at| {
            hasher.hash_one(names[at as usize].name.as_str())
        });
        at
    }

    /// Drops a reference to the name at `at`; the last one frees it.
    fn release(&mut self, at: u32) {
        let entry = &mut self.names[at as usize];
        entry.refs -= 1;
        if entry.refs > 0 {
            return;
        }
        let name = std::mem::take(&mut entry.name);
        let hash = self.hasher.hash_one(name.as_str());
        if let Ok(found) = self.index.find_entry(hash, |&i| i == at) {
            found.remove();
        }
        self.free.push(at);
    }

    fn get(&self, at: u32) -> &Name {
        &self.names[at as usize]
    }

    /// Distinct names held.
    fn len(&self) -> usize {
        self.names.len() - self.free.len()
    }
}

/// What expanding a rollup told ([`Dictionaries::expand_found`]): whether
/// the master takes numbers from its sender, and where it last found the
/// pairs of the accounts the rollup gave by number, so that ingest can go straight
/// to each pair's entry rather than through its index; and, once ingested,
/// where they are now ([`Dictionaries::learn`]). A hint is the pair's
/// position in its shard plus one, 0 for none; every one is checked
/// against the entry it points to before use, so a stale hint (the pair
/// moved, or was forgotten) costs a lookup and nothing else.
#[derive(Debug, Default)]
pub struct Expansion {
    /// Whether this master holds the sender's dictionary (the reply's
    /// `takes_ids`).
    pub takes_ids: bool,
    /// Per op: the first entry of `accounts` that was given by number, and
    /// for each such entry its name's place and hint.
    ops: Vec<(usize, Vec<(u32, u32)>)>,
    /// Names whose pairs ingest found elsewhere than their hint said, and
    /// where: for [`Dictionaries::learn`].
    moved: Vec<(u32, u32)>,
}

impl Expansion {
    /// For a rollup that names every account: no hints.
    pub fn named(takes_ids: bool) -> Expansion {
        Expansion {
            takes_ids,
            ..Expansion::default()
        }
    }

    /// The hint for entry `j` of op `i`: 0 for an entry that came named.
    pub fn hint(&self, i: usize, j: usize) -> u32 {
        self.by_number(i, j).map_or(0, |&(_, at)| at)
    }

    /// The name's place and hint of entry `j` of op `i`, if it came by
    /// number.
    fn by_number(&self, i: usize, j: usize) -> Option<&(u32, u32)> {
        let (first, hints) = self.ops.get(i)?;
        hints.get(j.checked_sub(*first)?)
    }

    /// Whether ingest found any pair away from its hint: only then is
    /// there something to [`learn`](Dictionaries::learn).
    pub fn moved(&self) -> bool {
        !self.moved.is_empty()
    }

    /// Notes where ingest found or put the pair of entry `j` of op `i`
    /// (its position plus one, as [`MasterState::ingest_at`] leaves it),
    /// to be remembered if it is not where the hint said.
    ///
    /// [`MasterState::ingest_at`]: crate::master::MasterState::ingest_at
    pub fn found(&mut self, i: usize, j: usize, at: u32) {
        if let Some(&(place, hint)) = self.by_number(i, j)
            && hint != at
        {
            self.moved.push((place, at));
        }
    }
}

/// A master's dictionaries, one per agent run. See the module docs.
#[derive(Debug, Default)]
pub struct Dictionaries {
    limits: DictionaryLimits,
    held: HashMap<(String, u64), Held, RandomState>,
    names: Names,
    /// Numbers held over every dictionary.
    total: usize,
}

impl Dictionaries {
    /// None held yet, under `limits`.
    pub fn new(limits: DictionaryLimits) -> Dictionaries {
        Dictionaries {
            limits,
            ..Dictionaries::default()
        }
    }

    /// Room held over every agent run, against
    /// [`DictionaryLimits::max_total`]: the numbers (up to each
    /// dictionary's highest) and `DICTIONARY_ROOM` for each dictionary.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Distinct account names held, however many agents number each.
    pub fn names(&self) -> usize {
        self.names.len()
    }

    /// Agent runs with a dictionary.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Turns `rollup`'s numbers back into names at `now`: takes its
    /// definitions, and moves every entry given by number into
    /// `accounts`, named, so what follows reads a rollup like any other.
    /// Returns whether this master holds the sender's dictionary (the
    /// reply's `takes_ids`). A rollup that uses a number not held is
    /// refused whole, and changed in nothing that is counted.
    pub fn expand(&mut self, now: Nanos, rollup: &mut Rollup) -> Result<bool, DictionaryError> {
        self.expand_found(now, rollup)
            .map(|expanded| expanded.takes_ids)
    }

    /// [`expand`](Self::expand), and where the master last found the pair
    /// of each entry that came by number ([`Expansion`]).
    pub fn expand_found(
        &mut self,
        now: Nanos,
        rollup: &mut Rollup,
    ) -> Result<Expansion, DictionaryError> {
        if rollup.dictionary == 0 {
            return self.named(rollup).map(Expansion::named);
        }
        let key = (rollup.agent_id.clone(), rollup.incarnation);
        let fresh = self
            .held
            .get(&key)
            .is_none_or(|h| h.epoch != rollup.dictionary);
        if fresh {
            if let Some(op) = rollup.ops.iter().position(|o| !o.by_id.is_empty()) {
                let id = rollup.ops[op].by_id[0].id;
                return Err(DictionaryError::Unknown {
                    op,
                    id,
                    incarnation: rollup.incarnation,
                    epoch: rollup.dictionary,
                });
            }
            self.drop_held(&key);
            if !self.has_room(&key) {
                return Ok(Expansion::default());
            }
            self.total += DICTIONARY_ROOM;
            self.held.insert(
                key.clone(),
                Held {
                    epoch: rollup.dictionary,
                    names: Vec::new(),
                    last_used: now,
                    over: false,
                },
            );
        }
        self.check_numbers(&key, rollup)?;
        let held = self.held.get_mut(&key).expect("made above");
        held.last_used = now;
        let mut ops = Vec::with_capacity(rollup.ops.len());
        for op in &mut rollup.ops {
            let first = op.accounts.len();
            let mut hints = Vec::with_capacity(op.by_id.len());
            op.accounts.reserve(op.by_id.len());
            for c in std::mem::take(&mut op.by_id) {
                let place = held.names[c.id as usize] - 1;
                let name = self.names.get(place);
                hints.push((place, name.at));
                op.accounts.push(AccountCounts {
                    account: String::from(name.name.as_str()),
                    attempted: c.attempted,
                    admitted: c.admitted,
                    op_cost: c.op_cost,
                    ops: c.ops,
                    since: None,
                    id: 0,
                    at: 0,
                });
            }
            ops.push((first, hints));
        }
        let takes_ids = self.define(&key, rollup);
        Ok(Expansion {
            takes_ids,
            ops,
            moved: Vec::new(),
        })
    }

    /// Remembers where the pairs of an expanded rollup are now, as
    /// ingest noted them ([`Expansion::found`]). Names freed since are
    /// skipped; one given to another account since only gets a hint that
    /// fails its check.
    pub fn learn(&mut self, expanded: &Expansion) {
        for &(place, at) in &expanded.moved {
            if let Some(name) = self.names.names.get_mut(place as usize)
                && name.refs > 0
            {
                name.at = at;
            }
        }
    }

    /// [`expand`](Self::expand) for a rollup that names every account
    /// (`dictionary` 0), which it leaves as it is: whether this master
    /// would hold a dictionary for its sender.
    pub fn named(&self, rollup: &Rollup) -> Result<bool, DictionaryError> {
        if let Some(op) = rollup
            .ops
            .iter()
            .position(|o| !o.by_id.is_empty() || o.accounts.iter().any(|c| c.id != 0))
        {
            return Err(DictionaryError::NoDictionary { op });
        }
        Ok(self.has_room(&(rollup.agent_id.clone(), rollup.incarnation)))
    }

    /// Refuses a rollup whose numbers or definitions this dictionary
    /// cannot take, before anything of it is taken.
    fn check_numbers(&self, key: &(String, u64), rollup: &Rollup) -> Result<(), DictionaryError> {
        let held = &self.held[key];
        for (i, op) in rollup.ops.iter().enumerate() {
            for (j, c) in op.accounts.iter().enumerate() {
                if c.id == 0 {
                    continue;
                }
                if let Some(&at) = held.names.get(c.id as usize)
                    && at != 0
                    && self.names.get(at - 1).name != c.account
                {
                    return Err(DictionaryError::Conflict {
                        op: i,
                        account: j,
                        id: c.id,
                        epoch: held.epoch,
                    });
                }
            }
            for c in &op.by_id {
                if c.id == 0 {
                    return Err(DictionaryError::Zero { op: i });
                }
                // Only numbers defined by an earlier rollup, answered.
                if held.names.get(c.id as usize).is_none_or(|&at| at == 0) {
                    return Err(DictionaryError::Unknown {
                        op: i,
                        id: c.id,
                        incarnation: rollup.incarnation,
                        epoch: rollup.dictionary,
                    });
                }
            }
        }
        Ok(())
    }

    /// Takes the rollup's definitions of valid names within the limits;
    /// whether every one was taken (if not, the agent is told to name its
    /// accounts, and its dictionary here is emptied and marked `over`).
    fn define(&mut self, key: &(String, u64), rollup: &Rollup) -> bool {
        let max_ids = self.limits.max_ids;
        let room = self.limits.max_total.saturating_sub(self.total);
        let held = self.held.get_mut(key).expect("made above");
        let mut added = 0usize;
        let mut within = true;
        for c in rollup.ops.iter().flat_map(|o| &o.accounts) {
            if c.id == 0 || validate_name("account", &c.account).is_err() {
                continue;
            }
            let i = c.id as usize;
            if held.names.len() <= i {
                // Numbers are counted by the room they take, defined or
                // not, so sparse numbers cannot hold more than their share.
                let grow = i + 1 - held.names.len();
                if c.id > max_ids || added + grow > room {
                    within = false;
                    break;
                }
                held.names.resize(i + 1, 0);
                added += grow;
            }
            // A number given twice in one rollup keeps its first name: only
            // the sender's own counts can suffer.
            if held.names[i] == 0 {
                held.names[i] = self.names.intern(&c.account) + 1;
            }
        }
        self.total += added;
        if !within {
            let names = std::mem::take(&mut held.names);
            held.over = true;
            self.release(&names);
        }
        within
    }

    /// Whether a dictionary for `key` is held or could be made.
    fn has_room(&self, key: &(String, u64)) -> bool {
        match self.held.get(key) {
            Some(held) => !held.over,
            None => self.total + DICTIONARY_ROOM <= self.limits.max_total,
        }
    }

    fn drop_held(&mut self, key: &(String, u64)) {
        if let Some(held) = self.held.remove(key) {
            self.total -= DICTIONARY_ROOM;
            self.release(&held.names);
        }
    }

    /// Gives back the room of a dictionary's `names` and their references.
    fn release(&mut self, names: &[u32]) {
        self.total -= names.len();
        for &at in names.iter().filter(|&&at| at != 0) {
            self.names.release(at - 1);
        }
    }

    /// Drops the dictionaries unused since `limits.idle_for` before `now`;
    /// returns how many.
    pub fn evict_idle(&mut self, now: Nanos) -> usize {
        let idle_for = self.limits.idle_for;
        let idle: Vec<(String, u64)> = self
            .held
            .iter()
            .filter(|(_, h)| now.since(h.last_used) >= idle_for)
            .map(|(k, _)| k.clone())
            .collect();
        for key in &idle {
            self.drop_held(key);
        }
        idle.len()
    }
}

#[cfg(test)]
mod tests;
