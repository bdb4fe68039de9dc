//! Where a job's next incarnation runs (pure).

use crate::model::hosts::{HostStatus, Liveness};
use crate::model::jobs::types::{Job, JobSpec};
use crate::model::state::ClusterState;
use std::collections::BTreeMap;
use std::collections::BTreeSet;

/// Whether a host may receive new ranks of `spec`.
pub(in crate::model) fn eligible(st: &ClusterState, host: &str, spec: &JobSpec) -> bool {
    ineligible(st, host, spec).is_none()
}

/// Why a host may not receive new ranks of `spec` (`None`: it may).
pub fn ineligible(st: &ClusterState, host: &str, spec: &JobSpec) -> Option<String> {
    let Some(h) = st.hosts.get(host) else {
        return Some("not registered".into());
    };
    if h.liveness != Liveness::Ready {
        return Some(format!("{:?}", h.liveness).to_lowercase());
    }
    if h.status() != HostStatus::Ready {
        return Some(h.status().to_string().to_lowercase());
    }
    if !spec.hosts.is_empty() && !spec.hosts.iter().any(|x| x == host) {
        return Some("not in the job's hosts".into());
    }
    if let Some((k, v)) = spec
        .labels
        .iter()
        .find(|(k, v)| h.labels.get(*k) != Some(*v))
    {
        return Some(format!("no label {k}={v}"));
    }
    if !h
        .nics
        .values()
        .any(|n| n.rail.is_some() && n.addr.is_some())
    {
        return Some("no data NIC with an address".into());
    }
    if h.cut_off() || h.cut_off_incident.is_some() {
        return Some("cut off: no working data rail".into());
    }
    None
}

/// Why a job waiting for placement is not placed (`None` when it can be at
/// the leader's next decision), for `job show`: hosts still stopping the
/// old incarnation, the restart backoff (`now_ms`), or too few eligible
/// hosts with each other host's reason.
pub fn waiting_reason(st: &ClusterState, job: &Job, now_ms: u64) -> Option<String> {
    use crate::model::jobs::types::JobState;
    if !matches!(job.state, JobState::Pending | JobState::Restarting) {
        return None;
    }
    if !job.stopping.is_empty() {
        let hosts: Vec<&str> = job.stopping.keys().map(String::as_str).collect();
        return Some(format!(
            "waiting for {} to stop the ranks of incarnation {}",
            hosts.join(", "),
            job.incarnation
        ));
    }
    if job.not_before_ms > now_ms {
        return Some(format!(
            "restart backoff: {} ms left",
            job.not_before_ms - now_ms
        ));
    }
    let need = job.spec.host_count();
    let mut ok = Vec::new();
    let mut not = Vec::new();
    let candidates: Vec<&str> = if job.spec.hosts.is_empty() {
        st.hosts.keys().map(String::as_str).collect()
    } else {
        job.spec.hosts.iter().map(String::as_str).collect()
    };
    for h in candidates {
        match ineligible(st, h, &job.spec) {
            None => ok.push(h),
            Some(why) => not.push(format!("{h} {why}")),
        }
    }
    if ok.len() >= need {
        if place(st, job).is_some() {
            return None;
        }
        return Some(format!(
            "needs {need} hosts that pairwise share a working data rail; {} eligible, but {}",
            ok.len(),
            cut_pairs(st, &ok)
        ));
    }
    const SHOWN: usize = 8;
    let mut list = not
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if not.len() > SHOWN {
        list.push_str(&format!(", {} more", not.len() - SHOWN));
    }
    let plural = if need == 1 { "" } else { "s" };
    let mut why = format!(
        "needs {need} host{plural} ({} ranks, {} per host); {} eligible",
        job.spec.ranks,
        job.spec.ranks_per_host,
        ok.len()
    );
    if !list.is_empty() {
        why.push_str("; not eligible: ");
        why.push_str(&list);
    }
    Some(why)
}

/// A pair of `hosts` that the NIC states say share no working data rail,
/// if any. Hosts are grouped by their set of working rails (a handful of
/// sets for any number of hosts), so this is linear in the hosts.
fn rails_cut_pair<'a>(
    st: &ClusterState,
    hosts: impl IntoIterator<Item = &'a str>,
) -> Option<(String, String)> {
    let mut groups: BTreeMap<BTreeSet<u32>, &str> = BTreeMap::new();
    for h in hosts {
        if let Some(r) = st.hosts.get(h).and_then(crate::model::paths::judged_rails) {
            groups.entry(r).or_insert(h);
        }
    }
    let g: Vec<(&BTreeSet<u32>, &str)> = groups.iter().map(|(r, h)| (r, *h)).collect();
    for (i, (ra, a)) in g.iter().enumerate() {
        for (rb, b) in &g[i + 1..] {
            if ra.is_disjoint(rb) {
                let (a, b) = if a <= b { (a, b) } else { (b, a) };
                return Some(((*a).to_owned(), (*b).to_owned()));
            }
        }
    }
    None
}

/// Two hosts of `placement` that the NIC states say share no working data
/// rail, if any: a failure there is the path's, not the job's.
pub(in crate::model) fn placement_rails_cut(
    st: &ClusterState,
    placement: &[String],
) -> Option<(String, String)> {
    rails_cut_pair(st, placement.iter().map(String::as_str))
}

/// Two hosts of `placement` that share no working data rail, or that an
/// open path incident keeps apart, if any.
pub(in crate::model) fn placement_cut(
    st: &ClusterState,
    placement: &[String],
) -> Option<(String, String)> {
    if let Some(p) = placement_rails_cut(st, placement) {
        return Some(p);
    }
    let hosts: BTreeSet<&str> = placement.iter().map(String::as_str).collect();
    kept_apart(st)
        .into_iter()
        .find(|(a, b)| hosts.contains(a.as_str()) && hosts.contains(b.as_str()))
}

/// Why the job's current ranks cannot all talk, so cannot write a new
/// checkpoint (`None`: as far as railguard knows, they can): a host of its
/// placement is cut off, or two share no working rail (or are kept apart
/// on the ranks' evidence).
pub(in crate::model) fn ring_cut(st: &ClusterState, job: &Job) -> Option<String> {
    if let Some(h) = job
        .hosts()
        .into_iter()
        .find(|h| st.hosts.get(*h).is_some_and(|h| h.cut_off()))
    {
        return Some(format!("{h} is cut off"));
    }
    placement_cut(st, &job.placement).map(|(a, b)| format!("{a} and {b} cannot talk"))
}

/// The pairs of `hosts` that share no working rail or are kept apart, for
/// a reason: "h1 and h2 share none, …" (a few shown).
fn cut_pairs(st: &ClusterState, hosts: &[&str]) -> String {
    const SHOWN: usize = 4;
    // One pair per two groups of rail sets that do not meet, then the
    // pairs kept apart by an incident (each pair once, names in order).
    let mut groups: BTreeMap<BTreeSet<u32>, &str> = BTreeMap::new();
    for h in hosts {
        if let Some(r) = st.hosts.get(*h).and_then(crate::model::paths::judged_rails) {
            groups.entry(r).or_insert(h);
        }
    }
    let g: Vec<(&BTreeSet<u32>, &str)> = groups.iter().map(|(r, h)| (r, *h)).collect();
    let mut seen = BTreeSet::new();
    let mut pairs = Vec::new();
    for (i, (ra, a)) in g.iter().enumerate() {
        for (rb, b) in &g[i + 1..] {
            let (a, b) = if a <= b { (*a, *b) } else { (*b, *a) };
            if ra.is_disjoint(rb) && seen.insert((a.to_owned(), b.to_owned())) {
                pairs.push(format!("{a} and {b} share none"));
            }
        }
    }
    let set: BTreeSet<&str> = hosts.iter().copied().collect();
    for (a, b) in kept_apart(st) {
        if set.contains(a.as_str())
            && set.contains(b.as_str())
            && !seen.contains(&(a.clone(), b.clone()))
        {
            pairs.push(format!("{a} and {b} are kept apart (incident)"));
        }
    }
    let more = pairs.len().saturating_sub(SHOWN);
    pairs.truncate(SHOWN);
    if more > 0 {
        pairs.push(format!("{more} more"));
    }
    if pairs.is_empty() {
        "no choice of them does".into()
    } else {
        pairs.join(", ")
    }
}

/// Ranks of other live jobs on each host.
fn load<'a>(st: &'a ClusterState, except: &str) -> BTreeMap<&'a str, usize> {
    let mut l = BTreeMap::new();
    for j in st.jobs.values().filter(|j| j.name != except) {
        for h in &j.placement {
            *l.entry(h.as_str()).or_default() += 1;
        }
    }
    l
}

/// The pairs (smaller name first) with an open `no_common_rail`
/// incident: kept apart even when their NIC states look healthy (the
/// incident may stand on the ranks' evidence that they cannot talk).
fn kept_apart(st: &ClusterState) -> BTreeSet<(String, String)> {
    st.hosts
        .values()
        .flat_map(|h| &h.path_incidents)
        .filter_map(|id| st.incidents.get(id))
        .filter_map(|i| Some((i.host.clone(), i.peer.clone()?)))
        .map(|(a, b)| if a <= b { (a, b) } else { (b, a) })
        .collect()
}

/// The hosts chosen so far for a placement: their names and the distinct
/// sets of working rails among them, so a candidate is checked against a
/// handful of rail sets and the few pairs kept apart, not every host.
struct Chosen<'a> {
    st: &'a ClusterState,
    names: BTreeSet<String>,
    rail_sets: BTreeSet<BTreeSet<u32>>,
    apart: BTreeSet<(String, String)>,
    /// Only hosts with this rail working (the per-rail retry).
    rail: Option<u32>,
}

impl<'a> Chosen<'a> {
    fn new(st: &'a ClusterState, rail: Option<u32>) -> Self {
        Chosen {
            st,
            names: BTreeSet::new(),
            rail_sets: BTreeSet::new(),
            apart: kept_apart(st),
            rail,
        }
    }

    /// Whether `host` may join: it shares a working data rail with every
    /// host chosen ([`crate::model::paths`]: a job's collectives may connect
    /// any two of its ranks — gloo and NCCL build rings and trees across
    /// all of them — so every pair of its hosts must be able to talk), no
    /// open path incident keeps it apart from one, and it has the rail
    /// this attempt is limited to.
    fn fits(&self, host: &str) -> bool {
        if self.names.contains(host) {
            return false;
        }
        let mine = self
            .st
            .hosts
            .get(host)
            .and_then(crate::model::paths::judged_rails);
        if let Some(m) = &mine {
            if self.rail.is_some_and(|r| !m.contains(&r))
                || self.rail_sets.iter().any(|s| s.is_disjoint(m))
            {
                return false;
            }
        }
        !self.apart.iter().any(|(a, b)| {
            (a == host && self.names.contains(b)) || (b == host && self.names.contains(a))
        })
    }

    fn add(&mut self, host: &str) {
        self.names.insert(host.to_owned());
        if let Some(r) = self
            .st
            .hosts
            .get(host)
            .and_then(crate::model::paths::judged_rails)
        {
            self.rail_sets.insert(r);
        }
    }
}

/// Where the job's next incarnation would run, one host per rank (each
/// host `ranks_per_host` times in a row), such that every two of its hosts
/// share a working data rail: hosts of the previous placement that are
/// still eligible keep their ranks, in order, each unless it cannot talk
/// with one kept before it (of two that lost different rails, the later
/// one moves); the others go to eligible hosts that reach every host
/// chosen so far, with the fewest ranks of other jobs (spares first), then
/// in the spec's host order, then by name. When that greedy pass finds
/// none, the same again limited to the hosts with one rail working, rail
/// by rail (hosts that share a rail all reach each other). `None` when
/// there are not enough.
pub fn place(st: &ClusterState, job: &Job) -> Option<Vec<String>> {
    if let Some(p) = place_on(st, job, None) {
        return Some(p);
    }
    let rails: BTreeSet<u32> = st
        .hosts
        .values()
        .flat_map(|h| h.nics.values().filter_map(|n| n.rail))
        .collect();
    rails.into_iter().find_map(|r| place_on(st, job, Some(r)))
}

/// [`place`]'s pass, limited to hosts with `rail` working when given.
fn place_on(st: &ClusterState, job: &Job, rail: Option<u32>) -> Option<Vec<String>> {
    let per = job.spec.ranks_per_host.max(1) as usize;
    let n = job.spec.host_count();
    let mut out: Vec<Option<String>> = vec![None; n];
    let mut chosen = Chosen::new(st, rail);
    for (g, h) in job
        .previous_placement
        .iter()
        .step_by(per)
        .enumerate()
        .take(n)
    {
        if eligible(st, h, &job.spec) && chosen.fits(h) {
            chosen.add(h);
            out[g] = Some(h.clone());
        }
    }
    let load = load(st, &job.name);
    let order = |h: &str| {
        job.spec
            .hosts
            .iter()
            .position(|x| x == h)
            .unwrap_or(usize::MAX)
    };
    let mut spare: Vec<&str> = st
        .hosts
        .keys()
        .map(String::as_str)
        .filter(|h| !chosen.names.contains(*h) && eligible(st, h, &job.spec))
        .collect();
    spare.sort_by_key(|h| (load.get(h).copied().unwrap_or(0), order(h), *h));
    let mut spare = spare.into_iter();
    for slot in out.iter_mut().filter(|s| s.is_none()) {
        let h = spare.find(|h| chosen.fits(h))?;
        chosen.add(h);
        *slot = Some(h.to_owned());
    }
    let hosts: Vec<String> = out.into_iter().collect::<Option<_>>()?;
    Some(
        hosts
            .into_iter()
            .flat_map(|h| std::iter::repeat_n(h, per))
            .collect(),
    )
}

/// Whether `placement` puts the job's ranks `ranks_per_host` at a time on
/// distinct hosts, in a row.
pub(in crate::model) fn well_formed(placement: &[String], per: usize) -> bool {
    let per = per.max(1);
    let mut seen = BTreeSet::new();
    placement.len().is_multiple_of(per)
        && placement
            .chunks(per)
            .all(|c| c.iter().all(|h| *h == c[0]) && seen.insert(&c[0]))
}
