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

/// Two hosts of `placement` that share no working data rail (or that an
/// open path incident keeps apart), if any.
pub(in crate::model) fn placement_cut(
    st: &ClusterState,
    placement: &[String],
) -> Option<(String, String)> {
    let hosts: Vec<&String> = placement
        .iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let rails: Vec<_> = hosts
        .iter()
        .map(|h| st.hosts.get(*h).and_then(crate::model::paths::judged_rails))
        .collect();
    let apart = kept_apart(st);
    for i in 0..hosts.len() {
        for j in i + 1..hosts.len() {
            if crate::model::paths::rails_cut(&rails[i], &rails[j])
                || apart_pair(&apart, hosts[i], hosts[j])
            {
                return Some((hosts[i].clone(), hosts[j].clone()));
            }
        }
    }
    None
}

/// Why the job's current ranks cannot all talk, so cannot write a new
/// checkpoint (`None`: as far as the NIC states tell, they can): a host
/// of its placement is cut off, or two share no working rail.
pub(in crate::model) fn ring_cut(st: &ClusterState, job: &Job) -> Option<String> {
    if let Some(h) = job
        .hosts()
        .into_iter()
        .find(|h| st.hosts.get(*h).is_some_and(|h| h.cut_off()))
    {
        return Some(format!("{h} is cut off"));
    }
    placement_cut(st, &job.placement)
        .map(|(a, b)| format!("{a} and {b} share no working data rail"))
}

/// The pairs of `hosts` that share no working rail, for a reason:
/// "h1 and h2 share none, …" (at most a few shown).
fn cut_pairs(st: &ClusterState, hosts: &[&str]) -> String {
    const SHOWN: usize = 4;
    let rails: Vec<_> = hosts
        .iter()
        .map(|h| st.hosts.get(*h).and_then(crate::model::paths::judged_rails))
        .collect();
    let apart = kept_apart(st);
    let mut pairs = Vec::new();
    'all: for (i, a) in hosts.iter().enumerate() {
        for (j, b) in hosts.iter().enumerate().skip(i + 1) {
            if crate::model::paths::rails_cut(&rails[i], &rails[j]) || apart_pair(&apart, a, b) {
                if pairs.len() == SHOWN {
                    pairs.push("more".to_owned());
                    break 'all;
                }
                pairs.push(format!("{a} and {b} share none"));
            }
        }
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
    st.incidents
        .values()
        .filter(|i| i.kind == crate::model::IncidentKind::NoCommonRail && i.closed_ms.is_none())
        .filter_map(|i| Some((i.host.clone(), i.peer.clone()?)))
        .map(|(a, b)| if a <= b { (a, b) } else { (b, a) })
        .collect()
}

/// Whether the pair is in `apart` (in either order).
fn apart_pair(apart: &BTreeSet<(String, String)>, a: &str, b: &str) -> bool {
    let (a, b) = if a <= b { (a, b) } else { (b, a) };
    apart.contains(&(a.to_owned(), b.to_owned()))
}

/// Hosts' working rails, each computed once per placement
/// ([`crate::model::paths::judged_rails`]), and the pairs kept apart.
struct Rails<'a> {
    st: &'a ClusterState,
    known: BTreeMap<String, Option<BTreeSet<u32>>>,
    apart: BTreeSet<(String, String)>,
}

impl Rails<'_> {
    fn of(&mut self, host: &str) -> Option<BTreeSet<u32>> {
        if let Some(r) = self.known.get(host) {
            return r.clone();
        }
        let r = self
            .st
            .hosts
            .get(host)
            .and_then(crate::model::paths::judged_rails);
        self.known.insert(host.to_owned(), r.clone());
        r
    }

    /// Whether `host` shares a working data rail with every host in
    /// `with` ([`crate::model::paths`]): a job's collectives may connect
    /// any two of its ranks (gloo and NCCL build rings and trees across
    /// all of them), so every pair of its hosts must be able to talk.
    fn reaches_all(&mut self, host: &str, with: &BTreeSet<String>) -> bool {
        let mine = self.of(host);
        with.iter().all(|o| {
            o == host
                || (!crate::model::paths::rails_cut(&mine, &self.of(o))
                    && !apart_pair(&self.apart, host, o))
        })
    }
}

/// Where the job's next incarnation would run, one host per rank (each
/// host `ranks_per_host` times in a row), such that every two of its hosts
/// share a working data rail: hosts of the previous placement that are
/// still eligible keep their ranks, in order, each unless it shares no
/// rail with one kept before it (of two that lost different rails, the
/// later one moves); the others go to eligible hosts that reach every host
/// chosen so far, with the fewest ranks of other jobs (spares first), then
/// in the spec's host order, then by name. `None` when there are not
/// enough (greedy: it does not search every combination).
pub fn place(st: &ClusterState, job: &Job) -> Option<Vec<String>> {
    let per = job.spec.ranks_per_host.max(1) as usize;
    let n = job.spec.host_count();
    let mut out: Vec<Option<String>> = vec![None; n];
    let mut used = BTreeSet::new();
    let mut rails = Rails {
        st,
        known: BTreeMap::new(),
        apart: kept_apart(st),
    };
    for (g, h) in job
        .previous_placement
        .iter()
        .step_by(per)
        .enumerate()
        .take(n)
    {
        if eligible(st, h, &job.spec) && !used.contains(h) && rails.reaches_all(h, &used) {
            used.insert(h.clone());
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
        .filter(|h| !used.contains(*h) && eligible(st, h, &job.spec))
        .collect();
    spare.sort_by_key(|h| (load.get(h).copied().unwrap_or(0), order(h), *h));
    let mut spare = spare.into_iter();
    for slot in out.iter_mut().filter(|s| s.is_none()) {
        let h = spare.find(|h| rails.reaches_all(h, &used))?;
        used.insert(h.to_owned());
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
