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
        return None;
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

/// Where the job's next incarnation would run, one host per rank (each
/// host `ranks_per_host` times in a row): hosts of the previous placement
/// that are still eligible keep their ranks; the others go to eligible
/// hosts with the fewest ranks of other jobs (spares first), then in the
/// spec's host order, then by name. `None` when there are not enough.
pub fn place(st: &ClusterState, job: &Job) -> Option<Vec<String>> {
    let per = job.spec.ranks_per_host.max(1) as usize;
    let n = job.spec.host_count();
    let mut out: Vec<Option<String>> = vec![None; n];
    let mut used = BTreeSet::new();
    for (g, h) in job
        .previous_placement
        .iter()
        .step_by(per)
        .enumerate()
        .take(n)
    {
        if eligible(st, h, &job.spec) && used.insert(h.clone()) {
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
        *slot = Some(spare.next()?.to_owned());
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
