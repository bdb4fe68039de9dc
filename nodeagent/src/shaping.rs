//! The supervisor's shaping orders (`ShapeNic`, `ClearShape`; DESIGN.md
//! flow 4, contention → reshaping) carried out on this host's NICs, and
//! the shaped NICs' counters for the probe summary.
//!
//! **An order.** [`Shaper::execute`] validates everything first (an unknown
//! NIC, a bad address, port, minor or rate fails the order and changes
//! nothing), installs the HTB classes and filters with [`tc_htb`] on
//! the NIC's ifindex in the agent's own network namespace, dumps them back
//! and checks that the kernel holds exactly what was asked (qdisc, every
//! class's rate and ceiling, every filter's match and class, in order, and
//! nothing else). Then it paces the jobs the order names through the job
//! contract ([`Control::pace_job`]); jobs this agent paced for the NIC that
//! the order no longer names are unpaced. Orders run one at a time. The
//! outcome is `(ok, one-line detail)`; the agent stores and reports it like
//! every order (at most once per id, see [`crate::agent`]).
//!
//! **Edge holding.** An order with `hold_queueing_us > 0` also starts a
//! [`HoldLoop`] for the NIC (see [`crate::hold`]) over the jobs of its
//! job classes (`ShapeClass.job`), fed by the probe mesh's outgoing queueing
//! ([`Shaper::attach_queueing`]; without a probe mesh the order succeeds and
//! its detail says holding is off). Every order for the NIC (and
//! `ClearShape`) first stops the NIC's loop, which releases what it held;
//! its counters end up in that order's detail.
//!
//! **Lifetime.** Shapes outlive the agent: a clean exit leaves them (the
//! supervisor owns them). At start, [`Shaper::adopt_existing`] logs the
//! shaping it finds on its NICs and keeps counting it; the supervisor
//! re-sends or clears it. Pacing is held by the jobs, not the kernel, and
//! is not known after a restart.
//!
//! **Counters.** [`Shaper::summary`] takes one class dump per shaped NIC and
//! sums the bytes of the non-default classes into a total that only grows
//! while the NIC stays shaped (a class re-created by a new order starts
//! from zero; its bytes are added from there).

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use futures::TryStreamExt;
use proto::v1::{ClearShape, ShapeNic, ShapedNic};
use rdma::contract;

use crate::config::NicConfig;
use crate::control::{Control, MAX_DETAIL};
use crate::hold::{HoldLoop, HoldSpec, JobHold};
use crate::probe::queueing::QueueingBoard;
use tc_htb::{self as shape, FlowMatch, Installed, L4Port, Shape, DEFAULT_MINOR, ROOT_MINOR};

/// Jobs one order may pace.
pub const MAX_PACE_JOBS: usize = 64;
/// How long the per-second counter dump of one NIC may take.
const SUMMARY_DUMP_TIMEOUT: Duration = Duration::from_millis(300);

/// A shaping order as the agent executes it.
#[derive(Debug, Clone, PartialEq)]
pub enum ShapeOrder {
    Shape(ShapeNic),
    Clear(ClearShape),
}

/// One class of an order, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
struct WantedClass {
    shape: Shape,
    label: String,
    /// The job whose edges the class holds (`None`: not a job's).
    job: Option<String>,
}

/// A `ShapeNic`, validated and in [`tc_htb`]'s types.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Plan {
    classes: Vec<WantedClass>,
    default_rate_bps: u64,
    /// (job, bytes/s per connection; None = unpaced), in order.
    pace: Vec<(String, Option<u64>)>,
    /// Edge-holding threshold (ns; None = off).
    hold_threshold_ns: Option<i64>,
}

impl Plan {
    /// The jobs to hold: each job's class, its destinations and the
    /// job's pace from the order.
    fn holds(&self) -> BTreeMap<String, JobHold> {
        let mut out: BTreeMap<String, JobHold> = BTreeMap::new();
        for c in &self.classes {
            let Some(job) = c.job.as_deref() else {
                continue;
            };
            let release = self
                .pace
                .iter()
                .find(|(j, _)| j == job)
                .and_then(|(_, r)| *r);
            let e = out.entry(job.to_owned()).or_insert_with(|| JobHold {
                dsts: BTreeSet::new(),
                release_bytes_per_s: release,
            });
            e.dsts.extend(c.shape.matches.iter().map(|m| m.dst));
        }
        out
    }
}

impl Plan {
    fn shapes(&self) -> Vec<Shape> {
        self.classes.iter().map(|c| c.shape.clone()).collect()
    }
}

fn flow_from_wire(f: &proto::v1::FlowMatch) -> Result<FlowMatch, String> {
    let dst: Ipv4Addr = f
        .dst
        .parse()
        .map_err(|_| format!("flow dst {:?} is not an IPv4 address", f.dst))?;
    let port = |what: &str, p: u32| -> Result<Option<L4Port>, String> {
        if p == 0 {
            return Ok(None);
        }
        let p16 = u16::try_from(p).map_err(|_| format!("{what} port {p} is above 65535"))?;
        match f.protocol {
            6 => Ok(Some(L4Port::Tcp(p16))),
            17 => Ok(Some(L4Port::Udp(p16))),
            0 => Err(format!("{what} port {p} without a protocol (6 or 17)")),
            other => Err(format!("protocol {other} is not 6 (tcp) or 17 (udp)")),
        }
    };
    let m = FlowMatch {
        dst,
        dst_port: port("dst", f.dst_port)?,
        src_port: port("src", f.src_port)?,
    };
    if f.protocol != 0 && m.dst_port.is_none() && m.src_port.is_none() {
        return Err(format!(
            "protocol {} for dst {dst} without a port (a protocol alone is not matched)",
            f.protocol
        ));
    }
    Ok(m)
}

/// Checks a `ShapeNic` (all of it: addresses, ports, minors, rates, pace
/// entries) without touching the kernel.
fn plan_from_wire(s: &ShapeNic) -> Result<Plan, String> {
    let mut classes = Vec::with_capacity(s.classes.len());
    for c in &s.classes {
        let minor = u16::try_from(c.minor)
            .map_err(|_| format!("class minor {} is above 65535", c.minor))?;
        let mut matches = Vec::with_capacity(c.flows.len());
        for f in &c.flows {
            matches.push(flow_from_wire(f).map_err(|e| format!("class 1:{minor:x}: {e}"))?);
        }
        classes.push(WantedClass {
            shape: Shape {
                class_minor: minor,
                rate_bps: c.rate_bps,
                ceil_bps: c.ceil_bps,
                matches,
            },
            label: c.label.clone(),
            job: (!c.job.is_empty()).then(|| c.job.clone()),
        });
    }
    let plan_shapes: Vec<Shape> = classes.iter().map(|c| c.shape.clone()).collect();
    if !plan_shapes.is_empty() {
        shape::validate(&plan_shapes, s.default_rate_bps).map_err(|e| e.to_string())?;
    }
    if s.pace.len() > MAX_PACE_JOBS {
        return Err(format!(
            "{} paced jobs, at most {MAX_PACE_JOBS}",
            s.pace.len()
        ));
    }
    let mut pace = Vec::with_capacity(s.pace.len());
    let mut seen = BTreeSet::new();
    for p in &s.pace {
        contract::check_name("paced job", &p.job).map_err(|e| e.to_string())?;
        if !seen.insert(p.job.as_str()) {
            return Err(format!("job {:?} is paced twice", p.job));
        }
        let bytes = match p.rate_bps {
            0 => None,
            r if r < 8 => {
                return Err(format!(
                    "job {}: pace {r} bit/s is below one byte per second",
                    p.job
                ))
            }
            r => Some(r / 8),
        };
        pace.push((p.job.clone(), bytes));
    }
    Ok(Plan {
        classes,
        default_rate_bps: s.default_rate_bps,
        pace,
        hold_threshold_ns: (s.hold_queueing_us > 0).then(|| i64::from(s.hold_queueing_us) * 1_000),
    })
}

/// `what` is installed exactly: our qdisc, root and default classes, each
/// wanted class under the root with its rate and ceil (in whole bytes/s,
/// as the kernel keeps them), each filter in evaluation order, and nothing
/// more. `Err` names the first difference.
fn verify(i: &Installed, shapes: &[Shape], default_rate_bps: u64) -> Result<(), String> {
    let q = i.qdisc.as_ref().ok_or("no root HTB qdisc 1: in the dump")?;
    if q.default_minor != DEFAULT_MINOR {
        return Err(format!(
            "root qdisc's default class is 1:{:x}, not 1:{DEFAULT_MINOR:x}",
            q.default_minor
        ));
    }
    let kernel = |bps: u64| bps / 8 * 8;
    let mut want: BTreeMap<u16, (Option<u16>, u64, u64)> = shapes
        .iter()
        .map(|s| {
            (
                s.class_minor,
                (Some(ROOT_MINOR), kernel(s.rate_bps), kernel(s.ceil_bps)),
            )
        })
        .collect();
    let d = kernel(default_rate_bps);
    want.insert(DEFAULT_MINOR, (Some(ROOT_MINOR), d, d));
    for c in &i.classes {
        if c.minor == ROOT_MINOR {
            continue;
        }
        let Some(w) = want.remove(&c.minor) else {
            return Err(format!("unexpected class 1:{:x} in the dump", c.minor));
        };
        let got = (c.parent_minor, c.rate_bps, c.ceil_bps);
        if got != w {
            return Err(format!(
                "class 1:{:x}: dump has parent {:?}, rate {} bit/s, ceil {} bit/s; asked {:?}, {} bit/s, {} bit/s",
                c.minor, got.0, got.1, got.2, w.0, w.1, w.2
            ));
        }
    }
    if let Some(m) = want.keys().next() {
        return Err(format!("class 1:{m:x} missing from the dump"));
    }
    if i.class(ROOT_MINOR).is_none() {
        return Err("root class 1:1 missing from the dump".into());
    }
    let got: Vec<(Option<u16>, Option<FlowMatch>)> =
        i.filters.iter().map(|f| (f.class_minor, f.flow)).collect();
    let asked: Vec<(Option<u16>, Option<FlowMatch>)> = shape::filter_plan(shapes)
        .into_iter()
        .map(|(_, minor, m)| (Some(minor), Some(m)))
        .collect();
    if got != asked {
        let at = got
            .iter()
            .zip(&asked)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(asked.len()));
        return Err(format!(
            "filters differ from filter {}: dump has {} filters, asked {}",
            at + 1,
            got.len(),
            asked.len()
        ));
    }
    Ok(())
}

/// `120 Mbit/s`, `2 Gbit/s`, `1500 kbit/s`, `12345 bit/s`.
pub fn fmt_rate(bps: u64) -> String {
    for (unit, name) in [
        (1_000_000_000, "Gbit/s"),
        (1_000_000, "Mbit/s"),
        (1_000, "kbit/s"),
    ] {
        if bps >= unit && bps.is_multiple_of(unit) {
            return format!("{} {name}", bps / unit);
        }
    }
    format!("{bps} bit/s")
}

/// What the agent holds for one NIC it shapes.
#[derive(Debug, Clone, Default)]
struct NicState {
    ifindex: u32,
    /// Rate of each non-default class (minor → bit/s).
    rates: BTreeMap<u16, u64>,
    /// Jobs this agent paced for the NIC (and did not unpace).
    paced: BTreeSet<String>,
    /// Bytes counted so far through the non-default classes.
    shaped_bytes: u64,
    /// Each class's byte counter at the last look.
    last_bytes: BTreeMap<u16, u64>,
}

impl NicState {
    /// Adds what the classes sent since the last look. A class seen for
    /// the first time is a baseline (its earlier bytes are not ours); a
    /// counter that went back means the class was re-created: all of it
    /// is new.
    fn observe(&mut self, stats: &BTreeMap<u16, shape::ClassStats>) {
        let mut last = BTreeMap::new();
        for minor in self.rates.keys() {
            let Some(s) = stats.get(minor) else { continue };
            if let Some(&prev) = self.last_bytes.get(minor) {
                let delta = if s.bytes >= prev {
                    s.bytes - prev
                } else {
                    s.bytes
                };
                self.shaped_bytes = self.shaped_bytes.saturating_add(delta);
            }
            last.insert(*minor, s.bytes);
        }
        self.last_bytes = last;
    }
}

/// Carries out shaping orders on the agent's NICs and counts their bytes.
pub struct Shaper {
    handle: rtnetlink::Handle,
    nics: Vec<NicConfig>,
    control: Arc<Control>,
    /// NICs shaped now, by name.
    state: Mutex<BTreeMap<String, NicState>>,
    /// One shaping order at a time.
    serial: tokio::sync::Mutex<()>,
    /// The probe mesh's outgoing queueing (None: no mesh, no holding).
    queueing: OnceLock<Arc<QueueingBoard>>,
    /// Edge-hold loops, by NIC.
    holds: Mutex<BTreeMap<String, HoldLoop>>,
    /// The probe mesh's UDP port: probes to the order's destinations get a
    /// class of their own ([`PROBE_MINOR`]) so they never queue behind the
    /// traffic they measure.
    probe_port: Option<u16>,
}

/// Class of the probe mesh's traffic on a shaped NIC (first in filter
/// order; not counted in the shaped bytes).
pub const PROBE_MINOR: u16 = 0xfff0;
/// Its rate and ceil (the mesh sends ~1.4 Mbit/s per agent to 5 peers).
pub const PROBE_CLASS_BPS: u64 = 20_000_000;

/// The probe class for an order's classes: UDP to the probe port at each
/// destination they name (at most 16, the class limit).
fn probe_class(port: u16, shapes: &[Shape]) -> Option<Shape> {
    let dsts: BTreeSet<Ipv4Addr> = shapes
        .iter()
        .flat_map(|s| s.matches.iter().map(|m| m.dst))
        .collect();
    let matches: Vec<FlowMatch> = dsts
        .into_iter()
        .take(16)
        .map(|dst| FlowMatch {
            dst,
            dst_port: Some(L4Port::Udp(port)),
            src_port: None,
        })
        .collect();
    (!matches.is_empty()).then_some(Shape {
        class_minor: PROBE_MINOR,
        rate_bps: PROBE_CLASS_BPS,
        ceil_bps: PROBE_CLASS_BPS,
        matches,
    })
}

impl Shaper {
    /// A shaper working through `handle` (a netlink socket in the agent's
    /// network namespace) on `nics`, pacing through `control`.
    pub fn new(handle: rtnetlink::Handle, nics: Vec<NicConfig>, control: Arc<Control>) -> Self {
        Shaper {
            handle,
            nics,
            control,
            state: Mutex::new(BTreeMap::new()),
            serial: tokio::sync::Mutex::new(()),
            queueing: OnceLock::new(),
            holds: Mutex::new(BTreeMap::new()),
            probe_port: None,
        }
    }

    /// Gives probes to shaped destinations a class of their own.
    pub fn with_probe_port(mut self, port: Option<u16>) -> Self {
        self.probe_port = port;
        self
    }

    /// Feeds edge holding with the probe mesh's outgoing queueing (the
    /// first board given is kept).
    pub fn attach_queueing(&self, board: Arc<QueueingBoard>) {
        let _ = self.queueing.set(board);
    }

    /// The NICs with an edge-hold loop now, and its counters.
    pub fn holds(&self) -> Vec<(String, crate::hold::HoldCounters)> {
        self.holds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(n, h)| (n.clone(), h.counters()))
            .collect()
    }

    /// Stops the NIC's hold loop (releasing what it held); the detail of
    /// what it did ("" when there was none).
    async fn stop_hold(&self, nic: &str) -> String {
        let h = self
            .holds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(nic);
        match h {
            Some(h) => format!("edge hold stopped ({})", h.stop().await),
            None => String::new(),
        }
    }

    /// Starts the NIC's hold loop for `plan` if it asks for one.
    fn start_hold(&self, nic: &str, plan: &Plan) -> String {
        let Some(threshold_ns) = plan.hold_threshold_ns else {
            return String::new();
        };
        let us = threshold_ns / 1_000;
        let Some(board) = self.queueing.get() else {
            tracing::warn!(nic = %nic, threshold_us = us, "edge holding asked but there is no probe mesh");
            return format!("edge hold at {us} µs off: no probe mesh on this host");
        };
        let Some(rail) = self
            .nics
            .iter()
            .find(|n| n.name == nic)
            .and_then(|n| n.rail)
        else {
            return format!("edge hold at {us} µs off: {nic} has no rail");
        };
        let jobs = plan.holds();
        if jobs.is_empty() {
            return format!("edge hold at {us} µs off: no job class");
        }
        let n = jobs.len();
        let spec = HoldSpec {
            nic: nic.to_owned(),
            rail,
            threshold_ns,
            jobs,
        };
        let h = HoldLoop::start(spec, self.control.clone(), board.clone());
        self.holds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(nic.to_owned(), h);
        format!("edge hold at {us} µs for {n} jobs")
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, NicState>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The NICs shaped now.
    pub fn shaped_nics(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    fn check_nic(&self, nic: &str) -> Result<(), String> {
        if self.nics.iter().any(|n| n.name == nic) {
            return Ok(());
        }
        let have: Vec<&str> = self.nics.iter().map(|n| n.name.as_str()).collect();
        Err(format!(
            "NIC {nic:?} is not a data NIC of this host (it has {}); nothing changed",
            if have.is_empty() {
                "none".to_string()
            } else {
                have.join(", ")
            }
        ))
    }

    async fn ifindex(&self, nic: &str) -> Result<u32, String> {
        match self
            .handle
            .link()
            .get()
            .match_name(nic.to_owned())
            .execute()
            .try_next()
            .await
        {
            Ok(Some(l)) => Ok(l.header.index),
            Ok(None) => Err(format!("NIC {nic} has no interface here; nothing changed")),
            Err(e) => Err(format!(
                "NIC {nic}: cannot find its interface ({e}); nothing changed"
            )),
        }
    }

    /// Logs the shaping found on the configured NICs (an earlier agent's,
    /// or someone's by hand) and keeps counting it; nothing is changed.
    pub async fn adopt_existing(&self) {
        for n in &self.nics {
            let ifindex = match self.ifindex(&n.name).await {
                Ok(i) => i,
                Err(e) => {
                    tracing::debug!(nic = %n.name, error = %e, "no interface to look for shaping on");
                    continue;
                }
            };
            let found = match shape::list(&self.handle, ifindex).await {
                Ok(f) => f,
                Err(e) => {
                    tracing::warn!(nic = %n.name, ifindex, error = %e, "cannot read the NIC's shaping");
                    continue;
                }
            };
            let Some(q) = &found.qdisc else { continue };
            let rates: BTreeMap<u16, u64> = found
                .classes
                .iter()
                .filter(|c| ![ROOT_MINOR, DEFAULT_MINOR, PROBE_MINOR].contains(&c.minor))
                .map(|c| (c.minor, c.rate_bps))
                .collect();
            tracing::warn!(
                nic = %n.name,
                ifindex,
                default_minor = q.default_minor,
                classes = found.classes.len(),
                filters = found.filters.len(),
                limit_bps = rates.values().sum::<u64>(),
                "HTB shaping found on the NIC at start; kept until the supervisor re-sends or clears it"
            );
            let mut st = NicState {
                ifindex,
                rates,
                ..Default::default()
            };
            let stats = found.classes.iter().map(|c| (c.minor, c.stats)).collect();
            st.observe(&stats);
            self.lock().insert(n.name.clone(), st);
        }
    }

    /// Carries out a shaping order; returns (ok, one-line detail).
    pub async fn execute(&self, order: &ShapeOrder) -> (bool, String) {
        let _one = self.serial.lock().await;
        let (ok, detail) = match order {
            ShapeOrder::Shape(s) => self.shape(s).await,
            ShapeOrder::Clear(c) => self.clear(&c.nic).await,
        };
        (ok, contract::truncate(&detail, MAX_DETAIL).to_owned())
    }

    async fn shape(&self, s: &ShapeNic) -> (bool, String) {
        if let Err(e) = self.check_nic(&s.nic) {
            return (false, e);
        }
        let plan = match plan_from_wire(s) {
            Ok(p) => p,
            Err(e) => return (false, format!("{}: {e}; nothing changed", s.nic)),
        };
        let ifindex = match self.ifindex(&s.nic).await {
            Ok(i) => i,
            Err(e) => return (false, e),
        };
        // The old loop goes first (its releases come before the new
        // shaping and pacing); a failed order leaves holding off.
        let stopped = self.stop_hold(&s.nic).await;
        let (ok, detail) = self.install(s, &plan, ifindex).await;
        if !ok {
            return (false, join(detail, stopped));
        }
        let paced = self.pace(&s.nic, &plan.pace).await;
        let held = self.start_hold(&s.nic, &plan);
        (true, join(join(join(detail, paced), held), stopped))
    }

    /// Installs and verifies the classes of a checked order (none: clears
    /// the NIC's shaping); returns (ok, detail). Pacing and holding are the
    /// caller's.
    async fn install(&self, s: &ShapeNic, plan: &Plan, ifindex: u32) -> (bool, String) {
        if plan.classes.is_empty() {
            // No classes: the shaping goes; the pacing still applies.
            return self.clear_htb(&s.nic, ifindex).await;
        }
        let ordered = plan.shapes();
        let mut shapes = Vec::with_capacity(ordered.len() + 1);
        if let Some(p) = self.probe_port.and_then(|port| probe_class(port, &ordered)) {
            shapes.push(p);
        }
        shapes.extend(ordered.iter().cloned());
        // Count what the old classes sent before they change.
        self.sample(&s.nic).await;
        if let Err(e) = shape::apply(&self.handle, ifindex, &shapes, plan.default_rate_bps).await {
            return (false, format!("{}: shaping not applied: {e}", s.nic));
        }
        let installed = match shape::list(&self.handle, ifindex).await {
            Ok(i) => i,
            Err(e) => return (false, format!("{}: applied but cannot dump it: {e}", s.nic)),
        };
        if let Err(e) = verify(&installed, &shapes, plan.default_rate_bps) {
            tracing::error!(nic = %s.nic, ifindex, error = %e, "installed shaping differs from the order");
            return (
                false,
                format!("{}: dump does not match the order: {e}", s.nic),
            );
        }
        {
            let mut st = self.lock();
            let e = st.entry(s.nic.clone()).or_default();
            e.ifindex = ifindex;
            e.rates = ordered
                .iter()
                .map(|s| (s.class_minor, s.rate_bps))
                .collect();
            let stats = installed
                .classes
                .iter()
                .map(|c| (c.minor, c.stats))
                .collect();
            e.observe(&stats);
        }
        let classes: Vec<String> = plan
            .classes
            .iter()
            .map(|c| {
                let name = if c.label.is_empty() {
                    format!("1:{:x}", c.shape.class_minor)
                } else {
                    c.label.clone()
                };
                format!("{name} {}", fmt_rate(c.shape.rate_bps))
            })
            .collect();
        let filters = installed.filters.len();
        tracing::info!(nic = %s.nic, ifindex, classes = shapes.len(), filters, default_rate_bps = plan.default_rate_bps, "shaping applied and verified");
        let head = format!(
            "{}: {} classes ({}), {filters} filters, verified by dump",
            s.nic,
            shapes.len(),
            classes.join(", ")
        );
        (true, head)
    }

    /// Deletes our HTB on the NIC and checks the dump is empty.
    async fn clear_htb(&self, nic: &str, ifindex: u32) -> (bool, String) {
        self.sample(nic).await;
        let removed = match shape::clear(&self.handle, ifindex).await {
            Ok(r) => r,
            Err(e) => return (false, format!("{nic}: cannot clear the shaping: {e}")),
        };
        match shape::list(&self.handle, ifindex).await {
            Ok(i) if i.is_empty() => {}
            Ok(i) => {
                return (
                    false,
                    format!(
                        "{nic}: cleared, but the dump still has {} classes and {} filters",
                        i.classes.len(),
                        i.filters.len()
                    ),
                )
            }
            Err(e) => return (false, format!("{nic}: cleared but cannot dump it: {e}")),
        }
        if let Some(st) = self.lock().get_mut(nic) {
            st.rates.clear();
            st.last_bytes.clear();
        }
        tracing::info!(nic = %nic, ifindex, removed, "shaping cleared");
        (
            true,
            if removed {
                format!("{nic}: shaping cleared")
            } else {
                format!("{nic}: nothing to clear")
            },
        )
    }

    async fn clear(&self, nic: &str) -> (bool, String) {
        if let Err(e) = self.check_nic(nic) {
            return (false, e);
        }
        let ifindex = match self.ifindex(nic).await {
            Ok(i) => i,
            Err(e) => return (false, e),
        };
        let stopped = self.stop_hold(nic).await;
        let (ok, detail) = self.clear_htb(nic, ifindex).await;
        let paced = self.pace(nic, &[]).await;
        (ok, join(join(detail, paced), stopped))
    }

    /// Paces `want` for `nic` and unpaces the jobs paced for it before that
    /// `want` no longer names; forgets the NIC when nothing is left.
    /// Returns the detail ("" when there was nothing to do).
    async fn pace(&self, nic: &str, want: &[(String, Option<u64>)]) -> String {
        let before = self
            .lock()
            .get(nic)
            .map(|s| s.paced.clone())
            .unwrap_or_default();
        let wanted: BTreeSet<&str> = want.iter().map(|(j, _)| j.as_str()).collect();
        let mut todo: Vec<(String, Option<u64>)> = want.to_vec();
        todo.extend(
            before
                .iter()
                .filter(|j| !wanted.contains(j.as_str()))
                .map(|j| (j.clone(), None)),
        );
        let mut parts = Vec::new();
        let mut paced_now = BTreeSet::new();
        for (job, rate) in &todo {
            let o = self.control.pace_job(job, nic, *rate).await;
            let what = match rate {
                Some(b) => format!("paced at {}", fmt_rate(b.saturating_mul(8))),
                None => "unpaced".to_string(),
            };
            if o.conns == 0 {
                if o.ranks == 0 {
                    parts.push(format!("job {job} has no ranks on this host"));
                } else {
                    parts.push(format!(
                        "job {job}: {} ranks here, no connections to pace",
                        o.ranks
                    ));
                }
            } else if o.failed.is_empty() {
                parts.push(format!("job {job}: {} connections {what}", o.paced));
            } else {
                parts.push(format!(
                    "job {job}: {} of {} connections {what} ({})",
                    o.paced,
                    o.conns,
                    o.failed.join("; ")
                ));
            }
            tracing::info!(nic = %nic, job = %job, bytes_per_s = ?rate, ranks = o.ranks, conns = o.conns, paced = o.paced, failed = o.failed.len(), "job paced for shaping");
            if rate.is_some() && o.paced > 0 {
                paced_now.insert(job.clone());
            }
        }
        let mut st = self.lock();
        if let Some(e) = st.get_mut(nic) {
            e.paced = paced_now;
            if e.rates.is_empty() && e.paced.is_empty() {
                st.remove(nic);
            }
        } else if !paced_now.is_empty() {
            st.insert(
                nic.to_owned(),
                NicState {
                    paced: paced_now,
                    ..Default::default()
                },
            );
        }
        parts.join("; ")
    }

    /// Reads one NIC's class counters into its total (bounded in time).
    async fn sample(&self, nic: &str) {
        let Some(ifindex) = self
            .lock()
            .get(nic)
            .filter(|s| !s.rates.is_empty())
            .map(|s| s.ifindex)
        else {
            return;
        };
        match tokio::time::timeout(
            SUMMARY_DUMP_TIMEOUT,
            shape::class_stats(&self.handle, ifindex),
        )
        .await
        {
            Ok(Ok(stats)) => {
                if let Some(st) = self.lock().get_mut(nic) {
                    st.observe(&stats);
                }
            }
            Ok(Err(e)) => tracing::debug!(nic = %nic, error = %e, "cannot read class counters"),
            Err(_) => tracing::debug!(nic = %nic, "class counter dump timed out"),
        }
    }

    /// The shaped NICs for the probe summary: one class dump per NIC with
    /// classes (a NIC that is only paced has no counters and is left out).
    pub async fn summary(&self) -> Vec<ShapedNic> {
        let nics: Vec<String> = self
            .lock()
            .iter()
            .filter(|(_, s)| !s.rates.is_empty())
            .map(|(n, _)| n.clone())
            .collect();
        let mut out = Vec::with_capacity(nics.len());
        for nic in nics {
            self.sample(&nic).await;
            if let Some(s) = self.lock().get(&nic).filter(|s| !s.rates.is_empty()) {
                out.push(ShapedNic {
                    nic: nic.clone(),
                    shaped_bytes: s.shaped_bytes,
                    limit_bps: s.rates.values().fold(0u64, |a, r| a.saturating_add(*r)),
                });
            }
        }
        out
    }
}

fn join(a: String, b: String) -> String {
    match (a.is_empty(), b.is_empty()) {
        (_, true) => a,
        (true, false) => b,
        (false, false) => format!("{a}; {b}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::v1::{FlowMatch as WireFlow, PaceJob, ShapeClass};

    fn wire_flow(dst: &str, protocol: u32, dst_port: u32, src_port: u32) -> WireFlow {
        WireFlow {
            dst: dst.into(),
            protocol,
            dst_port,
            src_port,
        }
    }

    fn order() -> ShapeNic {
        ShapeNic {
            nic: "rail0".into(),
            classes: vec![
                ShapeClass {
                    minor: 0x10,
                    rate_bps: 120_000_000,
                    ceil_bps: 120_000_000,
                    flows: vec![
                        wire_flow("10.0.0.2", 6, 7000, 0),
                        wire_flow("10.0.0.2", 6, 0, 7000),
                    ],
                    label: "job a".into(),
                    job: "a".into(),
                },
                ShapeClass {
                    minor: 0x20,
                    rate_bps: 120_000_000,
                    ceil_bps: 240_000_000,
                    flows: vec![wire_flow("10.0.0.2", 0, 0, 0)],
                    label: "other".into(),
                    job: String::new(),
                },
            ],
            default_rate_bps: 1_000_000_000,
            pace: vec![PaceJob {
                job: "a".into(),
                rate_bps: 50_000_000,
            }],
            hold_queueing_us: 0,
        }
    }

    #[test]
    fn a_wire_order_becomes_shapes() {
        let p = plan_from_wire(&order()).unwrap();
        assert_eq!(p.classes.len(), 2);
        let a = &p.classes[0].shape;
        assert_eq!(a.class_minor, 0x10);
        assert_eq!(
            a.matches,
            vec![
                FlowMatch {
                    dst: Ipv4Addr::new(10, 0, 0, 2),
                    dst_port: Some(L4Port::Tcp(7000)),
                    src_port: None
                },
                FlowMatch {
                    dst: Ipv4Addr::new(10, 0, 0, 2),
                    dst_port: None,
                    src_port: Some(L4Port::Tcp(7000))
                },
            ]
        );
        assert_eq!(
            p.classes[1].shape.matches,
            vec![FlowMatch::to_addr(Ipv4Addr::new(10, 0, 0, 2))]
        );
        assert_eq!(p.pace, vec![("a".to_string(), Some(6_250_000))]);
    }

    #[test]
    fn edge_holding_takes_the_job_classes_and_their_pace() {
        let p = plan_from_wire(&order()).unwrap();
        assert_eq!(p.hold_threshold_ns, None, "0 is off");
        let mut o = order();
        o.hold_queueing_us = 500;
        let p = plan_from_wire(&o).unwrap();
        assert_eq!(p.hold_threshold_ns, Some(500_000));
        let h = p.holds();
        assert_eq!(
            h.keys().collect::<Vec<_>>(),
            vec!["a"],
            "\"other\" is no job"
        );
        assert_eq!(h["a"].dsts, [Ipv4Addr::new(10, 0, 0, 2)].into());
        assert_eq!(h["a"].release_bytes_per_s, Some(6_250_000));
        o.pace.clear();
        assert_eq!(
            plan_from_wire(&o).unwrap().holds()["a"].release_bytes_per_s,
            None
        );
    }

    #[test]
    fn bad_orders_are_refused_with_the_reason() {
        let bad = |f: &dyn Fn(&mut ShapeNic), want: &str| {
            let mut o = order();
            f(&mut o);
            let e = plan_from_wire(&o).unwrap_err();
            assert!(e.contains(want), "{e:?} lacks {want:?}");
        };
        bad(
            &|o| o.classes[0].flows[0].dst = "10.0.0".into(),
            "\"10.0.0\" is not an IPv4 address",
        );
        bad(
            &|o| o.classes[0].flows[0].protocol = 1,
            "protocol 1 is not 6",
        );
        bad(
            &|o| o.classes[0].flows[0].dst_port = 70_000,
            "dst port 70000 is above 65535",
        );
        bad(
            &|o| o.classes[1].flows[0].src_port = 5,
            "src port 5 without a protocol",
        );
        bad(&|o| o.classes[1].flows[0].protocol = 17, "without a port");
        bad(&|o| o.classes[0].minor = 70_000, "minor 70000");
        bad(&|o| o.classes[0].minor = 1, "reserved");
        bad(&|o| o.classes[0].ceil_bps = 0, "class 1:10 ceil 0 bit/s");
        bad(&|o| o.default_rate_bps = 0, "default rate 0 bit/s");
        bad(
            &|o| o.classes[1].flows.clear(),
            "class 1:20 has no flow match",
        );
        bad(
            &|o| o.classes[1].flows.push(wire_flow("10.0.0.2", 6, 7000, 0)),
            "used more than once",
        );
        bad(&|o| o.pace[0].job = "a b".into(), "whitespace");
        bad(&|o| o.pace.push(o.pace[0].clone()), "paced twice");
        bad(&|o| o.pace[0].rate_bps = 7, "below one byte per second");
        // No classes: a default rate is not needed (it is a clear).
        let mut o = order();
        o.classes.clear();
        o.default_rate_bps = 0;
        assert!(plan_from_wire(&o).unwrap().classes.is_empty());
    }

    #[test]
    fn descriptions_are_stable_and_tell_orders_apart() {
        use proto::agent::Order;
        let a = Order::ShapeNic(order());
        assert_eq!(a.describe(), Order::ShapeNic(order()).describe());
        assert!(a
            .describe()
            .starts_with("shape rail0: 2 classes, 1 paced jobs, #"));
        let mut o = order();
        o.classes[0].rate_bps += 8;
        assert_ne!(a.describe(), Order::ShapeNic(o.clone()).describe());
        assert_ne!(a, Order::ShapeNic(o), "a repeat is told apart by equality");
        assert_eq!(
            Order::ClearShape {
                nic: "rail0".into()
            }
            .describe(),
            "clear shaping on rail0"
        );
    }

    #[test]
    fn probes_get_a_class_of_their_own_to_every_shaped_destination() {
        let plan = plan_from_wire(&order()).unwrap();
        let shapes = plan.shapes();
        let p = probe_class(7410, &shapes).unwrap();
        assert_eq!(p.class_minor, PROBE_MINOR);
        let dsts: BTreeSet<Ipv4Addr> = shapes
            .iter()
            .flat_map(|s| s.matches.iter().map(|m| m.dst))
            .collect();
        assert_eq!(p.matches.len(), dsts.len());
        assert!(p
            .matches
            .iter()
            .all(|m| m.dst_port == Some(L4Port::Udp(7410)) && m.src_port.is_none()));
        // With it first, the whole set still validates.
        let mut all = vec![p];
        all.extend(shapes);
        shape::validate(&all, plan.default_rate_bps).unwrap();
        assert!(probe_class(7410, &[]).is_none());
    }

    #[test]
    fn rates_read_well() {
        assert_eq!(fmt_rate(120_000_000), "120 Mbit/s");
        assert_eq!(fmt_rate(40_000_000_000), "40 Gbit/s");
        assert_eq!(fmt_rate(1_500_000_000), "1500 Mbit/s");
        assert_eq!(fmt_rate(8_000), "8 kbit/s");
        assert_eq!(fmt_rate(12_345), "12345 bit/s");
    }

    #[test]
    fn shaped_bytes_only_grow() {
        let stats = |v: &[(u16, u64)]| -> BTreeMap<u16, shape::ClassStats> {
            v.iter()
                .map(|&(m, b)| {
                    (
                        m,
                        shape::ClassStats {
                            bytes: b,
                            ..Default::default()
                        },
                    )
                })
                .collect()
        };
        let mut s = NicState {
            rates: [(0x10, 1), (0x20, 1)].into_iter().collect(),
            ..Default::default()
        };
        // First look: a baseline (bytes from before are not counted).
        s.observe(&stats(&[(0x10, 500), (0x20, 100), (DEFAULT_MINOR, 9_999)]));
        assert_eq!(s.shaped_bytes, 0);
        s.observe(&stats(&[(0x10, 800), (0x20, 150), (DEFAULT_MINOR, 99_999)]));
        assert_eq!(s.shaped_bytes, 350);
        // 1:20 re-created (counter went back): all of it is new.
        s.observe(&stats(&[(0x10, 800), (0x20, 40)]));
        assert_eq!(s.shaped_bytes, 390);
        // A class gone from the dump is skipped, not subtracted.
        s.observe(&stats(&[(0x10, 900)]));
        assert_eq!(s.shaped_bytes, 490);
    }

    fn installed_for(shapes: &[Shape], default_bps: u64) -> Installed {
        let class = |minor: u16, parent: Option<u16>, rate: u64, ceil: u64| shape::InstalledClass {
            minor,
            parent_minor: parent,
            rate_bps: rate,
            ceil_bps: ceil,
            buffer_ticks: 1,
            cbuffer_ticks: 1,
            quantum: 1000,
            level: 0,
            prio: 0,
            sent_bytes: 0,
            sent_packets: 0,
            stats: Default::default(),
        };
        let mut classes = vec![
            class(ROOT_MINOR, None, default_bps, default_bps),
            class(DEFAULT_MINOR, Some(ROOT_MINOR), default_bps, default_bps),
        ];
        classes.extend(
            shapes
                .iter()
                .map(|s| class(s.class_minor, Some(ROOT_MINOR), s.rate_bps, s.ceil_bps)),
        );
        Installed {
            qdisc: Some(shape::InstalledQdisc {
                major: 1,
                default_minor: DEFAULT_MINOR,
            }),
            classes,
            filters: shape::filter_plan(shapes)
                .into_iter()
                .map(|(n, minor, m)| shape::InstalledFilter {
                    kind: "u32".into(),
                    prio: shape::FILTER_PRIO,
                    protocol: 0x0800,
                    handle: 0x8000_0000 | n,
                    class_minor: Some(minor),
                    flow: Some(m),
                })
                .collect(),
        }
    }

    #[test]
    fn verification_finds_the_first_difference() {
        let shapes = plan_from_wire(&order()).unwrap().shapes();
        let good = installed_for(&shapes, 1_000_000_000);
        assert_eq!(verify(&good, &shapes, 1_000_000_000), Ok(()));
        let mut i = good.clone();
        i.classes[2].rate_bps = 64_000_000;
        let e = verify(&i, &shapes, 1_000_000_000).unwrap_err();
        assert!(e.contains("class 1:10: dump has"), "{e}");
        let mut i = good.clone();
        i.filters.swap(0, 1);
        let e = verify(&i, &shapes, 1_000_000_000).unwrap_err();
        assert!(e.contains("filters differ from filter 1"), "{e}");
        let mut i = good.clone();
        i.filters.pop();
        let e = verify(&i, &shapes, 1_000_000_000).unwrap_err();
        assert!(e.contains("dump has 2 filters, asked 3"), "{e}");
        let e = verify(&good, &shapes[..1], 1_000_000_000).unwrap_err();
        assert!(e.contains("unexpected class 1:20"), "{e}");
        let e = verify(&Installed::default(), &shapes, 1_000_000_000).unwrap_err();
        assert!(e.contains("no root HTB qdisc"), "{e}");
        // Rates the kernel keeps in whole bytes/s: 1 000 000 007 → …000.
        let mut odd = shapes.clone();
        odd[0].rate_bps += 7;
        odd[0].ceil_bps += 7;
        assert_eq!(verify(&good, &odd, 1_000_000_000), Ok(()));
    }
}
