//! A model's waiting room (docs/behaviour.md §8.12): requests that found every eligible
//! worker's engine slots full wait here, each on its own core, and are bound to a worker
//! only when one of them frees a slot (late binding). At most `cap` wait, across all cores,
//! exactly. Lock-free, with the gate's place and waker discipline (`mod.rs`).
//!
//! The room hands out no slots: it tells a waiter when to look. A waiter looks at the
//! model's gates itself ([`super::Gate::try_take`]) when it is **due**: it entered an empty
//! room, it was **notified**, or it took a **permit**. A slot given back at a gate of the
//! model notifies the waiter served first that is not already due (most important class,
//! then oldest); one that finds nobody to notify leaves a permit for the next waiter to
//! arrive. So only the front of the room looks while others wait, and a request that
//! comes while others wait joins them rather than taking the slot ahead of them.
//!
//! The word packs three counts and a note, so each decision is one read-modify-write:
//! - `l`: waiters in the room (counted from `enter` until their [`Waiter`] drops);
//! - `g`: notifications under way (a notifier between its reservation and its settle);
//! - `p`: permits left by notifications that found nobody waiting (never more than `l`);
//! - the note: set by a waiter that arrived while a notification was under way and found no
//!   permit. The notifier that clears it looks again, so that waiter is not missed.
//!
//! A full room makes way for a more important request: it evicts the youngest waiter of
//! the least important class below the newcomer's that is waiting (not notified), marking
//! its place EVICTED and waking it. The evicted waiter's count in `l` goes to the
//! newcomer, so the size stays exact; its place frees when it leaves. At most `SPARE`
//! evicted waiters are on their way out at once, the places the room has beyond its size,
//! so a newcomer always finds a free place.
//!
//! No lost notification: a release writes the gate's word, then the room's. A waiter is
//! WAITING (or NOTIFIED) from its claim until it leaves, and every look writes each gate's
//! word it reads. So either the waiter's look follows the release on that gate's word
//! (and sees the slot), or the release's notification follows the look (and sees the place
//! WAITING, or leaves a permit or a note the waiter sees). `tests/loom_room.rs`
//! model-checks it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crossbeam_utils::CachePadded;

use super::tenants::{TENANTS, bucket};
use super::{ARRIVAL_SHIFT, AtomicU64, AtomicWaker, FREE, MAX_LIMIT, Ordering, Place, STATUS};
use super::{Pace, WAITING, claim_at, class_of, served_before};
use crate::shed::Class;

/// The tenants' counts and tags: std atomics in every build. They order waiters and cap
/// each tenant's places but take no part in the notification protocol, so the loom model
/// (`tests/loom_room.rs`) leaves them out of its interleavings.
type Tally = std::sync::atomic::AtomicU64;

/// Spillway's refusal messages: the room full, a wait in it ended.
pub const ROOM_FULL: &str =
    "Server overloaded: every worker of the model is at capacity and its waiting room is full";
pub const ROOM_TIMEOUT: &str = "Server overloaded: request rejected after waiting in the model's waiting room past its timeout";
pub const ROOM_TENANT_FULL: &str =
    "Server overloaded: this tenant already holds its share of the model's waiting room";
pub const ROOM_EVICTED: &str =
    "Server overloaded: request evicted from the model's full waiting room by a more important one";

/// A place whose waiter is due to look: a notification it has not yet taken.
const NOTIFIED: u64 = 2;
/// A place whose waiter a more important request evicted: its count in the room went to
/// that request, and the place frees when the waiter leaves.
const EVICTED: u64 = 3;
/// Evictions under way at most (evicted waiters that have not left yet): the places a
/// room has beyond its size.
const SPARE: u32 = 16;

const BITS: u32 = 21;
const MASK: u64 = (1 << BITS) - 1;
const L1: u64 = 1;
const G1: u64 = 1 << BITS;
const P1: u64 = 1 << (2 * BITS);
const NOTE: u64 = 1 << 63;

/// (l, g, p) of a word.
fn counts(w: u64) -> (u64, u64, u64) {
    (w & MASK, (w >> BITS) & MASK, (w >> (2 * BITS)) & MASK)
}

#[derive(Debug)]
pub struct Room {
    cap: u32,
    /// `note | p << 42 | g << 21 | l`.
    word: CachePadded<AtomicU64>,
    places: Box<[Place]>,
    arrivals: AtomicU64,
    /// Waiters of each class (by [`Class::index`]), counted from just after `enter`'s
    /// reservation until they leave: which waiters a newcomer is behind.
    by_class: [AtomicU64; 3],
    /// How fast the model's slots come back while requests wait here.
    pace: Pace,
    /// Requests that entered so far (statistics outside the invariants).
    entered: std::sync::atomic::AtomicU64,
    /// Evicted waiters that have not left yet (at most the spare places).
    evicting: AtomicU64,
    spare: u64,
    /// Per tenant bucket: its waiters and its last tag.
    tenants: Box<[Tenant]>,
    /// The room's virtual time: the tag of the last waiter notified.
    vclock: Tally,
    /// Places one tenant may hold.
    tenant_cap: Tally,
    /// Tenant buckets with waiters (a reading for predicted turns).
    active: Tally,
}

/// Why a request found no place in a [`Room`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turned {
    /// `cap` wait, none less important than it.
    Full,
    /// Its tenant holds its share of the room.
    TenantFull,
}

/// A tenant bucket of a room.
#[derive(Debug, Default)]
struct Tenant {
    waiting: Tally,
    last: Tally,
}

impl Room {
    /// A room for `cap` waiters (at least one, below 2^20).
    pub fn new(cap: u32) -> Room {
        let cap = cap.clamp(1, MAX_LIMIT);
        let spare = cap.min(SPARE);
        Room {
            cap,
            word: CachePadded::new(AtomicU64::new(0)),
            places: (0..cap + spare)
                .map(|_| Place {
                    state: AtomicU64::new(FREE),
                    waker: AtomicWaker::new(),
                })
                .collect(),
            arrivals: AtomicU64::new(0),
            by_class: [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
            pace: Pace::default(),
            entered: std::sync::atomic::AtomicU64::new(0),
            evicting: AtomicU64::new(0),
            spare: spare.into(),
            tenants: (0..TENANTS).map(|_| Tenant::default()).collect(),
            vclock: Tally::new(0),
            tenant_cap: Tally::new(cap.into()),
            active: Tally::new(0),
        }
    }

    /// Requests that entered so far.
    pub fn entered(&self) -> u64 {
        self.entered.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The rate at which the model's slots come back while requests wait here
    /// (`monitor/release.rs` measures it).
    pub fn pace(&self) -> &Pace {
        &self.pace
    }

    pub fn capacity(&self) -> u32 {
        self.cap
    }

    /// Waiters now (a gauge's reading; a decision uses [`Room::enter`]).
    pub fn waiting(&self) -> u64 {
        counts(self.word.load(Ordering::Acquire)).0
    }

    /// Waiters a request of `class` would be behind: those of its class and of more
    /// important ones.
    pub fn waiting_ahead(&self, class: Class) -> u64 {
        (self.by_class[..=class.index()].iter())
            .map(|n| n.load(Ordering::Acquire))
            .sum()
    }

    /// The most important class among the waiters now, if any wait (a reading).
    pub fn first_class(&self) -> Option<Class> {
        let i = (self.by_class.iter()).position(|n| n.load(Ordering::Acquire) > 0)?;
        Class::ALL.get(i).copied()
    }

    /// Tells waiters to look until `n` of them are told (those told already and not
    /// yet looking count), served first first; returns how many it told now. The
    /// monitor's nudge (docs/behaviour.md §8.12) for a worker that became admissible
    /// without giving a slot back: it leaves no permit, for a nudge that finds nobody
    /// is made again at the monitor's next tick. Scans the places once per waiter told
    /// (off the data path; allocates nothing).
    pub fn wake(&self, n: u64) -> u64 {
        let told = (self.places.iter())
            .filter(|p| p.state.load(Ordering::Acquire) & STATUS == NOTIFIED)
            .count() as u64;
        let want = n.saturating_sub(told);
        let mut now = 0;
        while now < want && self.notify_best() {
            now += 1;
        }
        now
    }

    /// A place for a request of `class` from `tenant` (a hash; 0 for none); when `cap`
    /// already wait, the place of the last served waiter of the least important class
    /// below `class`, which is evicted. Refused when there is none, or when the tenant
    /// holds its share of the room already. Within a class, tenants are served in turn
    /// (start-time fair queuing over `TENANTS` buckets), each tenant first come, first
    /// served. The waiter is due at once when nobody of its class or a more important
    /// one waited (it is first in line), or it took a permit.
    pub fn enter(&self, class: Class, tenant: u64) -> Result<Waiter<'_>, Turned> {
        let cap = u64::from(self.cap);
        let bucket = bucket(tenant);
        // A tenant's share below the room's size caps its waiters (those evicted and on
        // their way out included); at the room's size, the room's count alone does.
        let share = self.tenant_cap.load(Ordering::Relaxed);
        let of_tenant = &self.tenants[bucket];
        let before = (of_tenant.waiting)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < share || share >= cap).then_some(n + 1)
            })
            .map_err(|_| Turned::TenantFull)?;
        if before == 0 {
            self.active.fetch_add(1, Ordering::Relaxed);
        }
        let reserved = (self.word).fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
            (counts(w).0 < cap).then_some(w + L1)
        });
        let empty = match reserved {
            Ok(before) => counts(before).0 == 0,
            Err(_) if self.evict(class) => false,
            Err(_) => {
                self.tenant_left(bucket);
                return Err(Turned::Full);
            }
        };
        (self.entered).fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let ahead = self.waiting_ahead(class);
        self.by_class[class.index()].fetch_add(1, Ordering::AcqRel);
        // Start-time fair queuing: the tenant's next tag, from the room's virtual time
        // or just after its own last one, whichever is later.
        let now = self.vclock.load(Ordering::Acquire);
        let last = (of_tenant.last)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |l| {
                Some(l.max(now) + 1)
            })
            .unwrap_or_else(|l| l);
        let tag = last.max(now) + 1;
        let start = self.arrivals.fetch_add(1, Ordering::Relaxed);
        let place = claim_at(&self.places, start, tag, class);
        let permit = self.check();
        let active = self.active.load(Ordering::Relaxed);
        // Behind the waiters of its class and more important ones, or fewer: those
        // tagged before it, about `active` per tag of the virtual time.
        let ahead_fairly = (tag - now - 1).saturating_mul(active.max(1));
        Ok(Waiter {
            room: self,
            index: place.index,
            state: place.state,
            tenant: bucket,
            due: empty || ahead == 0 || permit,
            position: ahead.min(ahead_fairly) + 1,
        })
    }

    /// A waiter of tenant bucket `bucket` left (or never entered).
    fn tenant_left(&self, bucket: usize) {
        if self.tenants[bucket].waiting.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.active.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Sets the share of the room one tenant may hold (at least one place).
    pub fn set_tenant_share(&self, share: f64) {
        let places = (f64::from(self.cap) * share.clamp(0.0, 1.0)).ceil() as u64;
        (self.tenant_cap).store(places.clamp(1, self.cap.into()), Ordering::Relaxed);
    }

    /// Waiters of `tenant`'s bucket now (a reading).
    pub fn tenant_waiting(&self, tenant: u64) -> u64 {
        let bucket = bucket(tenant);
        self.tenants[bucket].waiting.load(Ordering::Acquire)
    }

    /// Waiters per tenant bucket, by bucket number (for metrics).
    pub fn waiting_by_bucket(&self) -> impl Iterator<Item = u64> + '_ {
        (self.tenants.iter()).map(|t| t.waiting.load(Ordering::Relaxed))
    }

    /// Places one tenant may hold.
    pub fn tenant_capacity(&self) -> u64 {
        self.tenant_cap.load(Ordering::Relaxed)
    }

    /// Evicts the youngest waiter of the least important class below `class` that is
    /// waiting (not notified), taking over its count: true when it did. At most `spare`
    /// evicted waiters are on their way out at once, so a place is always free to claim.
    fn evict(&self, class: Class) -> bool {
        let spare = self.spare;
        let took = (self.evicting).fetch_update(Ordering::AcqRel, Ordering::Acquire, |e| {
            (e < spare).then_some(e + 1)
        });
        if took.is_err() {
            return false;
        }
        let eligible = |s: u64| class_of(s) > class.index();
        if self.mark_first(eligible, served_before, EVICTED).is_some() {
            return true;
        }
        self.evicting.fetch_sub(1, Ordering::AcqRel);
        false
    }

    /// A waiter just claimed its place: takes a permit if one is left (true), else notes
    /// itself to the notifications under way.
    fn check(&self) -> bool {
        let before = (self.word)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                let (_, g, p) = counts(w);
                Some(if p > 0 {
                    w - P1
                } else if g > 0 {
                    w | NOTE
                } else {
                    w
                })
            })
            .unwrap_or_else(|w| w);
        counts(before).2 > 0
    }

    /// Something a waiter may use came back (a slot at a gate of the model): the waiter
    /// served first that is not yet due is notified, or a permit is left when there is
    /// none. A read-modify-write of the word even when the room is empty.
    pub fn notify(&self) {
        loop {
            let reserved = (self.word)
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                    Some(if counts(w).0 > 0 { w + G1 } else { w })
                })
                .unwrap_or_else(|w| w);
            if counts(reserved).0 == 0 {
                return;
            }
            let found = self.notify_best();
            let settled = (self.word)
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                    let next = (w - G1) & !NOTE;
                    let (l, _, p) = counts(next);
                    let permit = !found && w & NOTE == 0 && p < l;
                    Some(if permit { next + P1 } else { next })
                })
                .unwrap_or_else(|w| w);
            // A waiter arrived while this looked: look again, so it is not missed.
            if settled & NOTE == 0 {
                return;
            }
        }
    }

    /// Turns the WAITING place served first NOTIFIED and wakes its task; false when none
    /// waits.
    fn notify_best(&self) -> bool {
        let later = |a: u64, b: u64| served_before(b, a);
        let Some(s) = self.mark_first(|_| true, later, NOTIFIED) else {
            return false;
        };
        self.vclock.fetch_max(s >> ARRIVAL_SHIFT, Ordering::AcqRel);
        true
    }

    /// Turns the WAITING place that comes first by `later` among those `eligible` (by
    /// state) to `status` and wakes its task; returns its WAITING state, `None` when none
    /// waits. `later(a, b)`: `b` goes before `a`.
    fn mark_first(
        &self,
        eligible: impl Fn(u64) -> bool,
        later: impl Fn(u64, u64) -> bool,
        status: u64,
    ) -> Option<u64> {
        loop {
            let (i, s) = (self.places.iter().enumerate())
                .map(|(i, p)| (i, p.state.load(Ordering::Acquire)))
                .filter(|&(_, s)| s & STATUS == WAITING && eligible(s))
                .reduce(|a, b| if later(a.1, b.1) { b } else { a })?;
            let place = &self.places[i];
            let marked = s - WAITING + status;
            if (place.state)
                .compare_exchange(s, marked, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                place.waker.wake();
                return Some(s);
            }
        }
    }
}

/// A request's place in a [`Room`]. Leaves on drop; a notification it had not acted on
/// goes to the next waiter.
#[derive(Debug)]
pub struct Waiter<'r> {
    room: &'r Room,
    index: usize,
    /// The place's WAITING state (tag and class included).
    state: u64,
    /// Its tenant's bucket.
    tenant: usize,
    /// Due by entering an empty room or by a permit, not yet acted on.
    due: bool,
    position: u64,
}

impl<'r> Waiter<'r> {
    /// True when the waiter should look at the gates now (and takes the reason): it
    /// entered an empty room, took a permit, or was notified since it last looked.
    pub fn due(&mut self) -> bool {
        if self.evicted() {
            return false;
        }
        if std::mem::take(&mut self.due) {
            return true;
        }
        let place = &self.room.places[self.index].state;
        let notified = self.state - WAITING + NOTIFIED;
        (place.compare_exchange(notified, self.state, Ordering::AcqRel, Ordering::Acquire)).is_ok()
    }

    /// Resolves when the waiter is notified or evicted.
    pub fn notified(&self) -> Notified<'_, '_> {
        Notified { waiter: self }
    }

    pub fn room(&self) -> &'r Room {
        self.room
    }

    /// This waiter's place in line when it came, 1-based: behind those of its class and
    /// of more important ones.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// True when a more important request evicted this waiter: it must leave.
    pub fn evicted(&self) -> bool {
        let s = self.room.places[self.index].state.load(Ordering::Acquire);
        s == self.state - WAITING + EVICTED
    }

    fn is_notified(&self) -> bool {
        let s = self.room.places[self.index].state.load(Ordering::Acquire);
        s == self.state - WAITING + NOTIFIED
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let room = self.room;
        room.by_class[class_of(self.state)].fetch_sub(1, Ordering::AcqRel);
        room.tenant_left(self.tenant);
        let before = room.places[self.index].state.swap(FREE, Ordering::AcqRel);
        let unused = self.due || before & STATUS == NOTIFIED;
        if before & STATUS == EVICTED {
            // Its count went to the request that evicted it.
            room.evicting.fetch_sub(1, Ordering::AcqRel);
            if unused {
                room.notify();
            }
            return;
        }
        let _ = room
            .word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                let (l, _, p) = counts(w);
                let left = l.saturating_sub(1);
                // Permits never outnumber the waiters; none is kept for an empty room.
                Some(w - L1 - P1 * p.saturating_sub(left))
            });
        if unused {
            room.notify();
        }
    }
}

/// Future of [`Waiter::notified`]: ready when the waiter is due or evicted.
#[derive(Debug)]
pub struct Notified<'w, 'r> {
    waiter: &'w Waiter<'r>,
}

impl Future for Notified<'_, '_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let waiter = self.waiter;
        let place = &waiter.room.places[waiter.index];
        place.poll_until(cx, || {
            waiter.due || waiter.is_notified() || waiter.evicted()
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
