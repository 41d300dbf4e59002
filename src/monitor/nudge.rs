//! The monitor's nudge of the models' waiting rooms (docs/behaviour.md §8.12). A slot given
//! back notifies a waiter itself; a worker that becomes admissible otherwise gives nothing
//! back: it stops being busy, its refusal hold or connect backoff ends, its health comes
//! back. After each publication of the busy set and on each tick, the monitor counts, for
//! each room with waiters, the free slots at the model's workers the router could pick
//! now for the most important class waiting, and tells that many waiters to look (those
//! told already and not yet looking count). A waiter that finds nothing after all waits
//! again; one missed is told at the next tick.

use crate::shed::Class;
use crate::state::{BusySet, Model, Snapshot};

/// Nudges every room of `snap` with waiters by what `busy` (the set just published) and
/// the workers' marks at `now` admit.
pub fn nudge(snap: &Snapshot, busy: &BusySet, now: u64) {
    for model in snap.models.iter() {
        let Some(room) = model.room.as_ref().map(|r| &*r.room) else {
            continue;
        };
        let Some(class) = room.first_class() else {
            continue;
        };
        let free = admissible_slots(snap, model, busy, class, now, room.waiting());
        if free > 0 {
            room.wake(free);
        }
    }
}

/// Free slots at the members of `model` the router could pick now for `class`: not busy
/// by the busy set, not held after a refusal, not down after a failed connect, not out
/// of rotation by health (unless the model panics, or a trial is open). A member without
/// a cap counts as `waiting` free slots. Looser than the router (it ignores what each core
/// routed since the set was published): a waiter told in vain looks and waits again.
pub fn admissible_slots(
    snap: &Snapshot,
    model: &Model,
    busy: &BusySet,
    class: Class,
    now: u64,
    waiting: u64,
) -> u64 {
    let shed = busy.enabled(model.id);
    let panic = busy.panics(model.id);
    let mut free = 0u64;
    for m in model.members.iter() {
        let Some(w) = snap.workers.get(m.worker as usize) else {
            continue;
        };
        let s = &w.state;
        let unhealthy =
            s.is_suspect() || s.is_provisional() || (busy.is_unhealthy(s.slot) && !s.trial_open());
        let out = s.is_down(now) || s.is_held(now) || (unhealthy && !panic);
        if out || (shed && busy.is_busy(class, m.id)) {
            continue;
        }
        free = free.saturating_add(match w.gate.as_deref() {
            None => waiting,
            Some(gate) => u64::from(gate.class_limit(class)).saturating_sub(gate.occupancy().0),
        });
    }
    free.min(waiting)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Overrides};
    use crate::shed::Why;

    /// A model with a room of 4 over workers a and b, two slots each.
    fn snap() -> Snapshot {
        let mut text = String::from(
            "[[models]]\nname = \"m\"\nwaiting_room_size = 4\nactive_decode_blocks_threshold = 0.5\n",
        );
        for (name, port) in [("a", 1), ("b", 2)] {
            text.push_str(&format!(
                "[[models.workers]]\nurl = \"http://127.0.0.1:{port}\"\nname = \"{name}\"\nengine_request_limit = 2\n"
            ));
        }
        Snapshot::standalone(Config::parse(&text, &Overrides::default()).unwrap(), 1).unwrap()
    }

    #[test]
    fn free_slots_count_at_workers_the_router_could_pick_now() {
        let s = snap();
        let (m, now) = (&s.models[0], 1_000);
        let slots =
            |busy: &BusySet, waiting| admissible_slots(&s, m, busy, Class::Standard, now, waiting);
        let mut busy = BusySet::default();
        busy.set_enabled(m.id);
        assert_eq!(slots(&busy, 9), 4, "two free slots at each");
        assert_eq!(slots(&busy, 3), 3, "no more than wait");
        let held = s.workers[m.members[0].worker as usize]
            .gate
            .as_deref()
            .unwrap();
        let _running = held.try_take(Class::Standard).unwrap();
        assert_eq!(slots(&busy, 9), 3, "a slot taken");
        busy.set_busy(Class::Standard, m.members[1].id, None::<Why>);
        assert_eq!(slots(&busy, 9), 1, "b busy");
        assert_eq!(
            admissible_slots(&s, m, &busy, Class::Critical, now, 9),
            3,
            "b is busy for standard requests only"
        );
        let a = &s.workers[m.members[0].worker as usize].state;
        a.inhibit(now, 50);
        assert_eq!(slots(&busy, 9), 0, "a down until its backoff ends");
        assert_eq!(
            admissible_slots(&s, m, &busy, Class::Standard, now + 50, 9),
            1,
            "and back after it"
        );
    }

    #[test]
    fn a_nudge_tells_as_many_waiters_as_there_are_free_slots() {
        let s = snap();
        let room = &s.models[0].room.as_ref().unwrap().room;
        let mut waiters: Vec<_> = (0..4)
            .map(|_| room.enter(Class::Standard, 0).unwrap())
            .collect();
        assert!(waiters[0].due(), "entered an empty room");
        let mut busy = BusySet::default();
        busy.set_enabled(s.models[0].id);
        for m in s.models[0].members.iter() {
            busy.set_busy(Class::Standard, m.id, None);
        }
        nudge(&s, &busy, 0);
        assert!(waiters.iter_mut().all(|w| !w.due()), "every worker busy");
        let b = s.models[0].members[1].id;
        busy.set_member(b, Default::default());
        nudge(&s, &busy, 0);
        let due: Vec<bool> = waiters.iter_mut().map(|w| w.due()).collect();
        assert_eq!(
            due,
            [true, true, false, false],
            "b's two slots, first come first"
        );
    }
}
