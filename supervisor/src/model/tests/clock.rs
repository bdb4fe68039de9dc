//! Clock states: changed by events, never written for unknown hosts.

use super::*;

fn clock(host: &str, state: ClockState) -> ClockChange {
    ClockChange {
        host: host.into(),
        state,
        offset_ns: Some(40.0),
        error_bound_ns: Some(250.0),
    }
}

#[test]
fn clock_states_change_with_an_event_and_unknown_hosts_write_nothing() {
    let mut st = ClusterState::default();
    register(&mut st, "h0");
    register(&mut st, "h1");
    assert_eq!(st.hosts["h0"].clock.state, ClockState::Unsynced);
    let before = st.clone();
    for bad in [
        vec![
            clock("h0", ClockState::Synced),
            clock("ghost", ClockState::Synced),
        ],
        vec![
            clock("h0", ClockState::Synced),
            clock("h0", ClockState::Degraded),
        ],
        vec![ClockChange {
            offset_ns: Some(f64::NAN),
            ..clock("h0", ClockState::Synced)
        }],
        vec![ClockChange {
            error_bound_ns: Some(-1.0),
            ..clock("h0", ClockState::Synced)
        }],
    ] {
        let r = one(&mut st, 5, 5, Command::SetClockStates { changes: bad });
        assert!(r.is_err(), "{r:?}");
    }
    assert_eq!(
        one(
            &mut st,
            6,
            6,
            Command::SetClockStates {
                changes: vec![clock("ghost", ClockState::Synced)]
            }
        ),
        Err(not_found("host", "ghost"))
    );
    let mut after = st.clone();
    after.last_log_index = before.last_log_index;
    assert_eq!(after, before, "nothing written");
    let change = Command::SetClockStates {
        changes: vec![clock("h0", ClockState::Synced)],
    };
    assert_eq!(one(&mut st, 7, 70, change.clone()), Ok(CmdOk::Done));
    let c = &st.hosts["h0"].clock;
    assert_eq!(
        (c.state, c.offset_ns, c.error_bound_ns, c.changed_ms),
        (ClockState::Synced, Some(40.0), Some(250.0), 70)
    );
    assert!(st
        .events
        .back()
        .is_some_and(|e| e.what == "clock Unsynced -> Synced (offset 40 ns ± 250 ns)"));
    // The same state again changes nothing, not even the figures.
    let events = st.events.len();
    let mut again = clock("h0", ClockState::Synced);
    again.offset_ns = Some(1.0);
    one(
        &mut st,
        8,
        80,
        Command::SetClockStates {
            changes: vec![again],
        },
    )
    .unwrap();
    assert_eq!(st.events.len(), events);
    assert_eq!(st.hosts["h0"].clock.changed_ms, 70);
}
