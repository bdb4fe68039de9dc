//! Tests of the linearizability checker: hand-made histories with known
//! verdicts, generated histories (long, busy, corrupted), and a property
//! test that the segmented checker agrees with the plain search.

use std::collections::HashMap;

use super::*;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

type Op = Operation<HostOp, HostResult>;

fn op(client: usize, input: HostOp, call: u64, ret: u64, out: HostResult) -> Op {
    Operation::done(client, input, call, ret, out)
}

/// Asserts that the checker finds history `h` linearizable (`what` names
/// the case).
fn assert_linearizable(h: &[Op], what: &str) {
    assert_eq!(
        check(&HostModel, h, BUDGET),
        Verdict::Linearizable,
        "{what}"
    );
}

/// Asserts that the checker finds history `h` not linearizable.
fn assert_rejected(h: &[Op]) {
    let v = check(&HostModel, h, BUDGET);
    assert!(matches!(v, Verdict::NotLinearizable { .. }), "{v:?}");
}

fn unknown(client: usize, input: HostOp, call: u64) -> Op {
    Operation {
        client,
        input,
        call,
        ret: None,
        output: None,
    }
}

fn read(cordoned: bool, draining: bool) -> HostResult {
    HostResult::Read(HostView {
        cordoned,
        draining,
        ..Default::default()
    })
}

fn read_labels(cordoned: bool, labels: &[(&str, u64)]) -> HostResult {
    HostResult::Read(HostView {
        cordoned,
        draining: false,
        labels: labels.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        ..Default::default()
    })
}

const BUDGET: u64 = 1_000_000;

fn limits(max_steps: u64) -> Limits {
    Limits {
        max_steps,
        max_frontier: MAX_FRONTIER,
    }
}

#[test]
fn sequential_history_is_linearizable() {
    let h = vec![
        op(0, HostOp::Cordon, 0, 1, HostResult::Ok),
        op(0, HostOp::Read, 2, 3, read(true, false)),
        op(0, HostOp::Drain, 4, 5, HostResult::Ok),
        op(0, HostOp::Uncordon, 6, 7, HostResult::Refused),
        op(0, HostOp::Undrain, 8, 9, HostResult::Ok),
        op(0, HostOp::Read, 10, 11, read(false, false)),
    ];
    assert_linearizable(&h, "");
}

#[test]
fn stale_read_after_acknowledged_write_is_rejected() {
    // The cordon returned before the read began, yet the read missed it.
    let h = vec![
        op(0, HostOp::Cordon, 0, 10, HostResult::Ok),
        op(1, HostOp::Read, 20, 30, read(false, false)),
    ];
    assert_rejected(&h);
}

#[test]
fn concurrent_read_may_see_either_state() {
    for seen in [false, true] {
        let h = vec![
            op(0, HostOp::Cordon, 0, 10, HostResult::Ok),
            op(1, HostOp::Read, 5, 15, read(seen, false)),
        ];
        assert_linearizable(&h, &format!("seen={seen}"));
    }
}

#[test]
fn reads_must_not_go_back_in_time() {
    // Two sequential reads by different clients, both concurrent with the
    // write: new value then old value is not linearizable.
    let h = vec![
        op(0, HostOp::Cordon, 0, 100, HostResult::Ok),
        op(1, HostOp::Read, 10, 20, read(true, false)),
        op(2, HostOp::Read, 30, 40, read(false, false)),
    ];
    assert_rejected(&h);
}

/// A failover holds its NIC; one onto a held NIC is refused; a failback
/// releases it. A refusal only fits a history where the backup is held.
#[test]
fn failover_holds_and_refuses_onto_a_held_nic() {
    let f = |n: &str| HostOp::Failover(n.into());
    let held = |nics: &[&str]| {
        HostResult::Read(HostView {
            held: nics.iter().map(|n| n.to_string()).collect(),
            ..Default::default()
        })
    };
    let ok = [
        op(0, f("rail0"), 0, 10, HostResult::Ok),
        op(1, f("rail1"), 20, 30, HostResult::Refused),
        op(0, HostOp::Read, 40, 50, held(&["rail0"])),
        op(1, HostOp::Failback("rail0".into()), 60, 70, HostResult::Ok),
        op(0, f("rail1"), 80, 90, HostResult::Ok),
        op(1, HostOp::Read, 100, 110, held(&["rail1"])),
    ];
    assert_linearizable(&ok, "failover, refusal, failback, failover");
    // Refused with nothing held: no order of these explains it.
    assert_rejected(&[
        op(0, f("rail1"), 0, 10, HostResult::Refused),
        op(0, HostOp::Read, 20, 30, held(&[])),
    ]);
    // Accepted although its backup was held before it was called.
    assert_rejected(&[
        op(0, f("rail0"), 0, 10, HostResult::Ok),
        op(1, f("rail1"), 20, 30, HostResult::Ok),
    ]);
    // Two concurrent failovers of a host's two NICs cannot both succeed,
    // whichever came first; one accepted and one refused can.
    assert_rejected(&[
        op(0, f("rail0"), 0, 30, HostResult::Ok),
        op(1, f("rail1"), 10, 20, HostResult::Ok),
    ]);
    assert_linearizable(
        &[
            op(0, f("rail0"), 0, 30, HostResult::Ok),
            op(1, f("rail1"), 10, 20, HostResult::Refused),
            op(0, HostOp::Read, 40, 50, held(&["rail0"])),
        ],
        "rail0 taken first, though it returned last",
    );
}

#[test]
fn unknown_outcome_may_or_may_not_apply() {
    for seen in [false, true] {
        let h = vec![
            unknown(0, HostOp::Cordon, 0),
            op(1, HostOp::Read, 50, 60, read(seen, false)),
        ];
        assert_linearizable(&h, &format!("seen={seen}"));
    }
}

#[test]
fn refused_uncordon_requires_a_drain() {
    let h = vec![op(0, HostOp::Uncordon, 0, 1, HostResult::Refused)];
    assert_rejected(&h);
}

#[test]
fn lost_label_write_is_rejected() {
    let h = vec![
        op(0, HostOp::SetLabel("c0".into(), 1), 0, 1, HostResult::Ok),
        op(1, HostOp::Read, 2, 3, read(false, false)),
    ];
    assert_rejected(&h);
}

#[test]
fn budget_exhaustion_is_undecided_not_success() {
    let h = vec![
        op(0, HostOp::Cordon, 0, 10, HostResult::Ok),
        op(1, HostOp::Read, 5, 15, read(true, false)),
    ];
    assert_eq!(check(&HostModel, &h, 1), Verdict::Undecided);
}

#[test]
fn empty_and_unknown_only_histories_are_linearizable() {
    assert_eq!(check(&HostModel, &[], BUDGET), Verdict::Linearizable);
    let h = vec![unknown(0, HostOp::Drain, 0), unknown(1, HostOp::Undrain, 3)];
    let r = check_with(&HostModel, &h, limits(BUDGET));
    assert_eq!(r.verdict, Verdict::Linearizable);
    assert_eq!(r.dropped, 2, "nothing completed can observe them");
}

#[test]
fn quiescent_points_cut_the_history() {
    // [0,10] and [5,15] overlap; [20,30] starts after both returned; a
    // call at the instant of the latest return does not start a segment.
    let h = vec![
        op(0, HostOp::Cordon, 0, 10, HostResult::Ok),
        op(1, HostOp::Read, 5, 15, read(true, false)),
        op(0, HostOp::Uncordon, 15, 18, HostResult::Ok),
        op(1, HostOp::Read, 20, 30, read(false, false)),
        op(0, HostOp::Read, 40, 41, read(false, false)),
    ];
    let r = check_with(&HostModel, &h, limits(BUDGET));
    assert_eq!(r.verdict, Verdict::Linearizable);
    assert_eq!(r.segments, 3);
}

#[test]
fn unknown_op_taking_effect_many_segments_later_is_accepted() {
    // The unknown label write is invisible to 100 sequential operations
    // (each its own segment), then a read sees it.
    let mut h = vec![unknown(0, HostOp::SetLabel("c0".into(), 1), 0)];
    let mut cordoned = false;
    for i in 0..50u64 {
        let t = 10 + 10 * i;
        cordoned = !cordoned;
        let w = if cordoned {
            HostOp::Cordon
        } else {
            HostOp::Uncordon
        };
        h.push(op(1, w, t, t + 2, HostResult::Ok));
        h.push(op(2, HostOp::Read, t + 4, t + 6, read(cordoned, false)));
    }
    h.push(op(
        2,
        HostOp::Read,
        1000,
        1001,
        read_labels(cordoned, &[("c0", 1)]),
    ));
    h.push(op(
        1,
        HostOp::Read,
        1002,
        1003,
        read_labels(cordoned, &[("c0", 1)]),
    ));
    let r = check_with(&HostModel, &h, limits(BUDGET));
    assert_eq!(r.verdict, Verdict::Linearizable);
    assert!(r.segments >= 100, "{r:?}");
    assert_eq!(r.dropped, 0, "the write is observed, so it is kept");

    // Once seen, the value cannot disappear again: nothing else writes
    // that key.
    h.push(op(1, HostOp::Read, 1004, 1005, read(cordoned, false)));
    assert!(matches!(
        check(&HostModel, &h, BUDGET),
        Verdict::NotLinearizable { best_prefix } if best_prefix == 102
    ));
}

#[test]
fn unknown_op_observed_before_its_call_is_rejected() {
    for (call, linearizable) in [(20, false), (5, true)] {
        // A read sees the cordon; the only cordon is called at `call`.
        let h = vec![
            op(1, HostOp::Read, 0, 10, read(true, false)),
            unknown(0, HostOp::Cordon, call),
            op(1, HostOp::Read, 30, 40, read(true, false)),
        ];
        let v = check(&HostModel, &h, BUDGET);
        assert_eq!(
            v == Verdict::Linearizable,
            linearizable,
            "call={call}: {v:?}"
        );
        let plain = check_unsegmented(&HostModel, &h, BUDGET);
        assert_eq!(plain == Verdict::Linearizable, linearizable, "call={call}");
    }
}

#[test]
fn pending_ops_with_equal_inputs_are_one_class() {
    // Ten lost cordons and ten lost uncordons, then reads that flip:
    // each flip needs one more of them.
    let mut h = Vec::new();
    for i in 0..10 {
        h.push(unknown(i, HostOp::Cordon, 0));
        h.push(unknown(10 + i, HostOp::Uncordon, 0));
    }
    h.push(op(20, HostOp::Read, 1, 2, read(false, false)));
    for i in 0..20u64 {
        h.push(op(
            20,
            HostOp::Read,
            10 + 10 * i,
            12 + 10 * i,
            read(i % 2 == 0, false),
        ));
    }
    let r = check_with(&HostModel, &h, limits(BUDGET));
    assert_eq!(r.verdict, Verdict::Linearizable, "{r:?}");
    assert!(r.max_frontier <= 2, "{r:?}");
    // One flip too many.
    h.push(op(20, HostOp::Read, 500, 501, read(false, false)));
    h.push(op(20, HostOp::Read, 510, 511, read(true, false)));
    assert_rejected(&h);
}

#[test]
fn unobserved_unknown_label_writes_are_left_out() {
    let h = vec![
        unknown(0, HostOp::SetLabel("c0".into(), 1), 0),
        unknown(1, HostOp::SetLabel("c1".into(), 1), 0),
        op(0, HostOp::SetLabel("c0".into(), 2), 5, 6, HostResult::Ok),
        op(
            2,
            HostOp::Read,
            10,
            11,
            read_labels(false, &[("c0", 2), ("c1", 1)]),
        ),
    ];
    assert_eq!(HostModel.unobservable(&h), vec![true, false, false, false]);
    let r = check_with(&HostModel, &h, limits(BUDGET));
    assert_eq!(r.verdict, Verdict::Linearizable);
    assert_eq!(r.dropped, 1);
}

#[test]
fn frontier_overflow_is_undecided() {
    // Two clients write different values to each of four keys, all at
    // once: at the cut after them, any of the 16 combinations may be the
    // state, until a later read tells.
    let keys = ["c0", "c1", "c2", "c3"];
    let mut h = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        for v in [1, 2] {
            let w = HostOp::SetLabel(k.to_string(), v);
            h.push(op(2 * i + v as usize, w, 0, 10, HostResult::Ok));
        }
    }
    h.push(op(9, HostOp::Cordon, 20, 21, HostResult::Ok));
    let all: Vec<(&str, u64)> = keys.iter().map(|k| (*k, 2)).collect();
    h.push(op(9, HostOp::Read, 30, 31, read_labels(true, &all)));

    let r = check_with(&HostModel, &h, limits(BUDGET));
    assert_eq!(r.verdict, Verdict::Linearizable);
    assert_eq!(r.max_frontier, 16);
    let small = Limits {
        max_steps: BUDGET,
        max_frontier: 8,
    };
    let r = check_with(&HostModel, &h, small);
    assert_eq!(r.verdict, Verdict::Undecided, "{r:?}");
    assert_eq!(r.segments, 1, "stops at the first cut that overflows");
}

/// One operation of a simulated run (see [`simulate`]).
#[derive(Debug, Clone)]
struct Spec {
    client: usize,
    /// 0..=5: cordon, uncordon, drain, undrain, label write, read.
    kind: u8,
    /// Idle time of the client before the call.
    gap: u64,
    /// Length of the call's interval.
    dur: u64,
    /// When it takes effect, from the call (clamped to `dur` for
    /// completed operations).
    at: u64,
    /// Outcome lost: `Some(applied)`, with `applied` saying whether it
    /// took effect (at `at`, which may be after `dur`).
    lost: Option<bool>,
}

/// Runs `specs` against one atomic host: every client issues its
/// operations one after the other, each takes effect at one instant
/// (inside its interval unless its outcome is lost) and outputs are
/// computed in that order, so the history is linearizable by
/// construction. Client `c` writes label `c{c}` with increasing values.
fn simulate(specs: &[Spec]) -> Vec<Op> {
    let clients = specs.iter().map(|s| s.client + 1).max().unwrap_or(0);
    let mut free = vec![0u64; clients];
    let mut values = vec![0u64; clients];
    let mut ops = Vec::new();
    // (instant of effect, operation index)
    let mut effects = Vec::new();
    for s in specs {
        let call = free[s.client] + s.gap;
        free[s.client] = call + s.dur + 1;
        let input = match s.kind {
            0 => HostOp::Cordon,
            1 => HostOp::Uncordon,
            2 => HostOp::Drain,
            3 => HostOp::Undrain,
            4 => {
                values[s.client] += 1;
                HostOp::SetLabel(format!("c{}", s.client), values[s.client])
            }
            _ => HostOp::Read,
        };
        let lost = s.lost.filter(|_| input != HostOp::Read);
        let ret = lost.is_none().then_some(call + s.dur);
        match lost {
            None => effects.push((call + s.at.min(s.dur), ops.len())),
            Some(true) => effects.push((call + s.at, ops.len())),
            Some(false) => {}
        }
        ops.push(Operation {
            client: s.client,
            input,
            call,
            ret,
            output: None,
        });
    }
    effects.sort_unstable();
    let mut state = HostView::default();
    for (_, i) in effects {
        let out = match ops[i].input {
            HostOp::Read => HostResult::Read(state.clone()),
            HostOp::Uncordon if state.draining => HostResult::Refused,
            _ => HostResult::Ok,
        };
        state = HostModel
            .step(&state, &ops[i].input, Some(&out))
            .expect("the simulated output is valid");
        if ops[i].ret.is_some() {
            ops[i].output = Some(out);
        }
    }
    ops
}

/// `n` operations of `clients` clients with the admin scenarios' mix,
/// mostly short, some long, 1 in 200 with its outcome lost (half of
/// those never take effect, some take effect late). Before each call a
/// client idles for up to `idle` (in the scenarios, clients spread over
/// several hosts, so one host is often idle: the history has cuts).
fn generated(n: usize, clients: usize, idle: u64, seed: u64) -> Vec<Op> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut specs = Vec::with_capacity(n);
    for k in 0..n {
        let roll = rng.gen_range(0..100);
        let kind = match roll {
            0..=14 => 0,
            15..=29 => 1,
            30..=37 => 2,
            38..=45 => 3,
            46..=70 => 4,
            _ => 5,
        };
        let dur = if rng.gen_range(0..100) == 0 {
            rng.gen_range(50..300)
        } else {
            rng.gen_range(1..20)
        };
        let lost = (rng.gen_range(0..200) == 0).then(|| rng.gen_bool(0.5));
        let at = if lost == Some(true) && rng.gen_bool(0.3) {
            dur + rng.gen_range(0..500)
        } else {
            rng.gen_range(0..=dur)
        };
        specs.push(Spec {
            client: k % clients,
            kind,
            gap: rng.gen_range(0..idle),
            dur,
            at,
            lost,
        });
    }
    simulate(&specs)
}

/// Steps for the 50,000-operation histories: they take about 7.2 M
/// (0.7 s in release); the scenarios allow 50 M per host.
const LONG_BUDGET: u64 = 20_000_000;

#[test]
fn long_generated_history_is_decided() {
    let h = generated(50_000, 6, 60, 42);
    let lost = h.iter().filter(|o| o.ret.is_none()).count();
    assert!(lost > 100, "{lost} unknown-outcome operations");
    let r = check_with(&HostModel, &h, limits(LONG_BUDGET));
    assert_eq!(r.verdict, Verdict::Linearizable, "{r:?}");
    assert!(r.segments > 5_000, "{r:?}");
}

#[test]
fn busy_history_with_few_cuts_is_decided() {
    // Six clients that never idle: few quiescent points, segments of
    // hundreds of operations with unknown-outcome ones inside.
    let h = generated(2_000, 6, 2, 7);
    let r = check_with(&HostModel, &h, limits(10_000_000));
    assert_eq!(r.verdict, Verdict::Linearizable, "{r:?}");
    assert!(r.largest_segment > 200, "{r:?}");
}

#[test]
fn long_generated_history_with_one_stale_read_is_rejected() {
    let mut h = generated(50_000, 6, 60, 42);
    // The first read from op 40,000 on that sees a label value `v > 1`
    // written by an acknowledged write that returned before the read
    // began, the value `v - 1` having been acknowledged too (so it was
    // written before `v`, by the same client): make it return `v - 1`.
    let acked: HashMap<(String, u64), usize> = h
        .iter()
        .enumerate()
        .filter_map(|(i, o)| match (&o.input, &o.output) {
            (HostOp::SetLabel(k, v), Some(_)) => Some(((k.clone(), *v), i)),
            _ => None,
        })
        .collect();
    let (r, key, v) = (40_000..h.len())
        .find_map(|r| {
            let Some(HostResult::Read(view)) = &h[r].output else {
                return None;
            };
            view.labels.iter().find_map(|(k, &v)| {
                let w = *acked.get(&(k.clone(), v))?;
                acked.get(&(k.clone(), v - 1))?;
                (h[w].ret? < h[r].call).then(|| (r, k.clone(), v))
            })
        })
        .expect("such a read");
    let Some(HostResult::Read(view)) = &mut h[r].output else {
        unreachable!()
    };
    view.labels.insert(key, v - 1);
    let r_call = h[r].call;

    let rep = check_with(&HostModel, &h, limits(LONG_BUDGET));
    let Verdict::NotLinearizable { best_prefix } = rep.verdict else {
        panic!("{rep:?}");
    };
    // The report points at the corrupted read.
    let before = h
        .iter()
        .filter(|o| o.ret.is_some() && o.call < r_call)
        .count();
    assert!(
        best_prefix.abs_diff(before) < 200,
        "{best_prefix} vs {before}"
    );
}

fn spec_strategy() -> impl Strategy<Value = Spec> {
    (
        0usize..3,
        0u8..6,
        0u64..4,
        0u64..6,
        0u64..10,
        prop_oneof![4 => Just(None), 1 => any::<bool>().prop_map(Some)],
    )
        .prop_map(|(client, kind, gap, dur, at, lost)| Spec {
            client,
            kind,
            gap,
            dur,
            at,
            lost,
        })
}

/// Changes one operation's output: a read sees a flipped bit or another
/// label value, an uncordon the other answer.
fn corrupt(h: &mut [Op], which: usize, how: u8) {
    let n = h.len();
    let o = &mut h[which % n];
    match (&o.input, &mut o.output) {
        (_, Some(HostResult::Read(v))) => match how % 4 {
            0 => v.cordoned = !v.cordoned,
            1 => v.draining = !v.draining,
            2 => {
                let x = v.labels.entry("c0".into()).or_insert(0);
                *x = x.saturating_sub(1);
            }
            _ => {
                *v.labels.entry("c1".into()).or_insert(0) += 1;
            }
        },
        (HostOp::Uncordon, Some(out)) => {
            *out = if *out == HostResult::Ok {
                HostResult::Refused
            } else {
                HostResult::Ok
            };
        }
        _ => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// On small histories (linearizable by construction, or with one
    /// output changed) the segmented checker agrees with the plain
    /// search whenever the latter decides.
    #[test]
    fn segmented_agrees_with_plain_search(
        specs in prop::collection::vec(spec_strategy(), 1..12),
        change in prop::option::of((any::<usize>(), any::<u8>())),
    ) {
        let mut h = simulate(&specs);
        if let Some((which, how)) = change {
            corrupt(&mut h, which, how);
        }
        let plain = check_unsegmented(&HostModel, &h, BUDGET);
        let seg = check_with(&HostModel, &h, limits(BUDGET));
        if change.is_none() {
            prop_assert_eq!(&seg.verdict, &Verdict::Linearizable);
        }
        if plain != Verdict::Undecided {
            prop_assert_eq!(
                plain == Verdict::Linearizable,
                seg.verdict == Verdict::Linearizable,
                "plain {:?}, segmented {:?}, history {:#?}", plain, seg, h
            );
            prop_assert!(seg.verdict != Verdict::Undecided);
        }
    }
}
