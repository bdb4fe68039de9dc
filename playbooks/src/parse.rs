//! TOML text → validated [`Playbook`], every error located.
//!
//! Two layers: serde reads the text into `Raw*` structs whose leaves are
//! `toml::Spanned` (unknown fields and type errors come from here, with the
//! toml crate's span), then `Ctx` checks the meaning and builds the model,
//! collecting every problem it finds with its position.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::diag::{suggest, Diagnostic, PlaybookError, Source};
use crate::types::bounds::*;
use crate::types::{
    Action, Check, Condition, IncidentKind, Jump, Limits, MigrateTarget, Playbook, Step, Trigger,
};

type S<T> = Spanned<T>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlaybook {
    name: S<String>,
    #[serde(default)]
    description: Option<S<String>>,
    #[serde(default)]
    priority: Option<S<i64>>,
    #[serde(default)]
    trigger: Option<S<RawTrigger>>,
    #[serde(default)]
    guards: Option<S<Vec<S<String>>>>,
    #[serde(default)]
    steps: Option<S<Vec<S<RawStep>>>>,
    #[serde(default)]
    on_failure: Option<S<String>>,
    #[serde(default)]
    limits: Option<S<RawLimits>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTrigger {
    incidents: S<Vec<S<String>>>,
    #[serde(default)]
    labels: Option<S<BTreeMap<String, S<String>>>>,
    #[serde(default)]
    nic: Option<S<String>>,
    #[serde(default)]
    rail: Option<S<i64>>,
    #[serde(default)]
    job: Option<S<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStep {
    #[serde(default)]
    id: Option<S<String>>,
    action: S<String>,
    #[serde(default)]
    when: Option<S<String>>,
    #[serde(default)]
    timeout: Option<S<String>>,
    #[serde(default)]
    retries: Option<S<i64>>,
    #[serde(default)]
    next: Option<S<String>>,
    #[serde(default)]
    on_failure: Option<S<String>>,
    // Action parameters.
    #[serde(default)]
    to: Option<S<String>>,
    #[serde(default)]
    rate: Option<S<String>>,
    #[serde(default)]
    edge_hold: Option<S<String>>,
    #[serde(default)]
    deadline: Option<S<String>>,
    #[serde(default)]
    condition: Option<S<String>>,
    #[serde(default)]
    message: Option<S<String>>,
    #[serde(default)]
    webhook: Option<S<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    #[serde(default)]
    max_drained_hosts: Option<S<i64>>,
    #[serde(default)]
    max_drained_percent: Option<S<i64>>,
}

/// A parsed playbook and where its set-relevant parts are in its file.
#[derive(Clone, Debug, PartialEq)]
pub struct Located {
    pub playbook: Playbook,
    pub file: String,
    /// line:column of `name`.
    pub name_at: (usize, usize),
    /// line:column of the top-level `on_failure`, if any.
    pub on_failure_at: Option<(usize, usize)>,
}

/// Placeholders a notify message may use.
pub const PLACEHOLDERS: [&str; 8] = [
    "host", "nic", "rail", "job", "peer", "kind", "incident", "playbook",
];

/// Bounds of `reshape_rate`'s `edge_hold` queueing threshold.
pub const MIN_EDGE_HOLD: Duration = Duration::from_micros(100);
pub const MAX_EDGE_HOLD: Duration = Duration::from_secs(1);

const DURATION_HINT: &str = "durations look like \"30s\", \"10m\" or \"1h 30m\"";
const RATE_HINT: &str = "rates are bits per second, like \"400Mbit\", \"2.5Gbit\" or \"800kbit\"";
const RESERVED_IDS: [&str; 2] = ["end", "escalate"];

/// Parses and validates one playbook file.
pub fn parse(file: &str, text: &str) -> Result<Playbook, PlaybookError> {
    parse_located(file, text).map(|l| l.playbook)
}

/// Like [`parse`], keeping the positions set validation reports against.
pub fn parse_located(file: &str, text: &str) -> Result<Located, PlaybookError> {
    let src = Source { file, text };
    if text.len() > MAX_FILE_BYTES {
        return Err(PlaybookError(vec![src.diag(
            None,
            format!(
                "file is {} bytes, more than the {MAX_FILE_BYTES} allowed",
                text.len()
            ),
            Some("split it into several playbooks".into()),
        )]));
    }
    let raw: RawPlaybook = match toml::from_str(text) {
        Ok(r) => r,
        Err(e) => return Err(PlaybookError(vec![toml_diag(&src, &e)])),
    };
    let mut ctx = Ctx {
        src: src.clone(),
        diags: Vec::new(),
    };
    let playbook = ctx.playbook(&raw);
    if !ctx.diags.is_empty() || playbook.is_none() {
        let mut d = ctx.diags;
        d.sort_by_key(|d| (d.line, d.column));
        return Err(PlaybookError(d));
    }
    let name_at = src.line_col(raw.name.span().start);
    let on_failure_at = raw
        .on_failure
        .as_ref()
        .map(|s| src.line_col(s.span().start));
    Ok(Located {
        playbook: playbook.expect("checked above"),
        file: file.to_string(),
        name_at,
        on_failure_at,
    })
}

/// A serde/TOML error as a diagnostic, with hints for the common cases.
fn toml_diag(src: &Source<'_>, e: &toml::de::Error) -> Diagnostic {
    let msg = e.message().trim().to_string();
    let hint = if let Some(rest) = msg.strip_prefix("unknown field `") {
        let mut parts = rest.split('`');
        let field = parts.next().unwrap_or_default();
        // "…, expected one of `a`, `b`" or "…, expected `a`": every odd part.
        let expected: Vec<&str> = parts.skip(1).step_by(2).collect();
        if expected.is_empty() {
            "see playbooks/README.md for the fields".to_string()
        } else {
            suggest(field, &expected)
        }
    } else if let Some(rest) = msg.strip_prefix("missing field `") {
        let field = rest.split('`').next().unwrap_or_default();
        format!("add `{field} = …` (see playbooks/README.md)")
    } else if msg.starts_with("invalid type") {
        "check the value's type against playbooks/README.md".to_string()
    } else {
        "the file must be valid TOML (https://toml.io); see playbooks/README.md".to_string()
    };
    src.diag(e.span(), msg, Some(hint))
}

struct Ctx<'a> {
    src: Source<'a>,
    diags: Vec<Diagnostic>,
}

impl Ctx<'_> {
    fn err(&mut self, span: Range<usize>, message: String, hint: Option<String>) {
        self.diags.push(self.src.diag(Some(span), message, hint));
    }

    /// The byte range of `[off, off+len)` inside a string value, when the
    /// source text holds the value verbatim (no escapes); else the value.
    fn inner(&self, s: &S<String>, off: usize, len: usize) -> Range<usize> {
        let start = s.span().start + 1;
        match self.src.text.get(start..) {
            Some(rest) if rest.starts_with(s.get_ref().as_str()) => start + off..start + off + len,
            _ => s.span(),
        }
    }

    fn playbook(&mut self, raw: &RawPlaybook) -> Option<Playbook> {
        let name = self.name(&raw.name, "playbook name");
        let description = match &raw.description {
            Some(d) if d.get_ref().chars().count() > MAX_DESCRIPTION_LEN => {
                self.err(
                    d.span(),
                    format!("description is longer than {MAX_DESCRIPTION_LEN} characters"),
                    Some("shorten it; details belong in playbooks/README.md or a runbook".into()),
                );
                String::new()
            }
            Some(d) => d.get_ref().clone(),
            None => String::new(),
        };
        let priority = match &raw.priority {
            Some(p) => self.int_in(p, "priority", 0, i64::from(MAX_PRIORITY)) as u32,
            None => 0,
        };
        let trigger = raw.trigger.as_ref().map(|t| self.trigger(t));
        let mut guards = Vec::new();
        if let Some(g) = &raw.guards {
            if g.get_ref().len() > MAX_GUARDS {
                self.err(
                    g.span(),
                    format!(
                        "{} guards, more than the {MAX_GUARDS} allowed",
                        g.get_ref().len()
                    ),
                    Some("split the playbook, or fold guards into step `when`s".into()),
                );
            }
            for c in g.get_ref().iter().take(MAX_GUARDS) {
                if let Some(c) = self.condition(c) {
                    guards.push(c);
                }
            }
        }
        let on_failure = raw.on_failure.as_ref().map(|o| {
            let target = self.name(o, "escalation target");
            if target == name && !name.is_empty() {
                self.err(
                    o.span(),
                    format!("playbook \"{name}\" escalates to itself"),
                    Some("escalate to a different playbook, or remove on_failure".into()),
                );
            }
            target
        });
        let limits = raw
            .limits
            .as_ref()
            .map(|l| self.limits(l))
            .unwrap_or_default();
        let steps = self.steps(raw.steps.as_ref());
        Some(Playbook {
            name,
            description,
            priority,
            trigger,
            guards,
            steps,
            on_failure,
            limits,
        })
    }

    /// A name: `[a-z0-9][a-z0-9_-]*`, bounded.
    fn name(&mut self, s: &S<String>, what: &str) -> String {
        let v = s.get_ref();
        let ok_chars = v
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
        let starts_ok = v
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        if v.is_empty() || v.len() > MAX_NAME_LEN || !ok_chars || !starts_ok {
            self.err(
                s.span(),
                format!("invalid {what} \"{}\"", clip(v)),
                Some(format!(
                    "use 1 to {MAX_NAME_LEN} lowercase letters, digits, '-' or '_', starting with a letter or digit"
                )),
            );
        }
        v.clone()
    }

    /// A NIC, job or label text: non-empty, bounded, no whitespace or control.
    fn ident(&mut self, s: &S<String>, what: &str) -> String {
        let v = s.get_ref();
        if v.is_empty()
            || v.len() > MAX_NAME_LEN
            || v.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            self.err(
                s.span(),
                format!("invalid {what} \"{}\"", clip(v)),
                Some(format!("1 to {MAX_NAME_LEN} characters, no spaces")),
            );
        }
        v.clone()
    }

    fn int_in(&mut self, v: &S<i64>, what: &str, min: i64, max: i64) -> i64 {
        let x = *v.get_ref();
        if x < min || x > max {
            self.err(
                v.span(),
                format!("{what} {x} is out of range"),
                Some(format!("{what} must be between {min} and {max}")),
            );
            return min;
        }
        x
    }

    fn trigger(&mut self, t: &S<RawTrigger>) -> Trigger {
        let t = t.get_ref();
        let mut incidents = Vec::new();
        let list = t.incidents.get_ref();
        if list.is_empty() {
            self.err(
                t.incidents.span(),
                "trigger has no incident kinds".into(),
                Some(format!(
                    "name at least one of: {} (or drop [trigger] for an escalation-only playbook)",
                    kind_names().join(", ")
                )),
            );
        }
        if list.len() > MAX_TRIGGER_KINDS {
            self.err(
                t.incidents.span(),
                format!("more than {MAX_TRIGGER_KINDS} incident kinds"),
                Some("each kind may be listed once".into()),
            );
        }
        for k in list.iter().take(MAX_TRIGGER_KINDS) {
            match IncidentKind::from_name(k.get_ref()) {
                Some(kind) if incidents.contains(&kind) => self.err(
                    k.span(),
                    format!("incident kind \"{kind}\" is listed twice"),
                    Some("list each incident kind once".into()),
                ),
                Some(kind) => incidents.push(kind),
                None => self.err(
                    k.span(),
                    format!("unknown incident kind \"{}\"", clip(k.get_ref())),
                    Some(suggest(k.get_ref(), &kind_names())),
                ),
            }
        }
        let mut labels = BTreeMap::new();
        if let Some(l) = &t.labels {
            if l.get_ref().len() > MAX_LABELS {
                self.err(
                    l.span(),
                    format!("more than {MAX_LABELS} labels"),
                    Some("match on fewer, more specific labels".into()),
                );
            }
            for (k, v) in l.get_ref().iter().take(MAX_LABELS) {
                if k.is_empty() || k.len() > MAX_NAME_LEN {
                    self.err(
                        v.span(),
                        format!("invalid label name \"{}\"", clip(k)),
                        Some(format!("1 to {MAX_NAME_LEN} characters")),
                    );
                }
                let value = self.ident(v, "label value");
                labels.insert(k.clone(), value);
            }
        }
        let nic = t.nic.as_ref().map(|n| self.ident(n, "NIC name"));
        let rail = t
            .rail
            .as_ref()
            .map(|r| self.int_in(r, "rail", 0, 65_535) as u32);
        let job = t.job.as_ref().map(|j| self.ident(j, "job name"));
        Trigger {
            incidents,
            labels,
            nic,
            rail,
            job,
        }
    }

    fn limits(&mut self, l: &S<RawLimits>) -> Limits {
        let l = l.get_ref();
        let mut out = Limits::default();
        if let Some(h) = &l.max_drained_hosts {
            out.max_drained_hosts =
                self.int_in(h, "max_drained_hosts", 1, i64::from(MAX_DRAINED_HOSTS)) as u32;
        }
        if let Some(p) = &l.max_drained_percent {
            out.max_drained_percent = self.int_in(p, "max_drained_percent", 1, 100) as u32;
        }
        out
    }

    /// `[not] <check> [<duration>]`.
    fn condition(&mut self, s: &S<String>) -> Option<Condition> {
        let text = s.get_ref();
        let words: Vec<(usize, &str)> = split_words(text);
        let hint_all = || {
            let names: Vec<&str> = Check::NAMES.iter().map(|(n, _)| *n).collect();
            format!("conditions are [not] one of: {}", names.join(", "))
        };
        let mut i = 0;
        let negated = words.first().is_some_and(|(_, w)| *w == "not");
        if negated {
            i = 1;
        }
        let Some(&(off, word)) = words.get(i) else {
            self.err(s.span(), "empty condition".into(), Some(hint_all()));
            return None;
        };
        let span = self.inner(s, off, word.len());
        let Some(&(_, takes_arg)) = Check::NAMES.iter().find(|(n, _)| *n == word) else {
            let names: Vec<&str> = Check::NAMES.iter().map(|(n, _)| *n).collect();
            self.err(
                span,
                format!("unknown condition \"{}\"", clip(word)),
                Some(suggest(word, &names)),
            );
            return None;
        };
        let arg = words.get(i + 1);
        if let (false, Some(&(aoff, a))) = (takes_arg, arg) {
            let aspan = self.inner(s, aoff, a.len());
            self.err(
                aspan,
                format!("condition \"{word}\" takes no argument"),
                Some(format!("write just \"{word}\" (or \"not {word}\")")),
            );
            return None;
        }
        if let Some(&(extra_off, extra)) = words.get(i + 2) {
            let span = self.inner(s, extra_off, extra.len());
            self.err(
                span,
                format!("unexpected \"{}\" after condition \"{word}\"", clip(extra)),
                Some(hint_all()),
            );
            return None;
        }
        let check = match word {
            "host_ready" => Check::HostReady,
            "host_drained" => Check::HostDrained,
            "nic_up" => Check::NicUp,
            "nic_reusable" => Check::NicReusable,
            "backup_nic_healthy" => Check::BackupNicHealthy,
            "clock_synced" => Check::ClockSynced,
            "job_running" => Check::JobRunning,
            "incident_cleared" => Check::IncidentCleared,
            "job_checkpoint_younger_than" => {
                let Some(&(aoff, a)) = arg else {
                    self.err(
                        span,
                        "job_checkpoint_younger_than needs a duration".into(),
                        Some("write e.g. \"job_checkpoint_younger_than 10m\"".into()),
                    );
                    return None;
                };
                let aspan = self.inner(s, aoff, a.len());
                let d = self.duration_text(a, aspan, "checkpoint age", MIN_TIMEOUT, MAX_TIMEOUT)?;
                Check::JobCheckpointYoungerThan(d)
            }
            _ => unreachable!("every name in Check::NAMES is handled"),
        };
        Some(Condition { negated, check })
    }

    fn duration(
        &mut self,
        s: &S<String>,
        what: &str,
        min: Duration,
        max: Duration,
    ) -> Option<Duration> {
        self.duration_text(s.get_ref(), s.span(), what, min, max)
    }

    fn duration_text(
        &mut self,
        text: &str,
        span: Range<usize>,
        what: &str,
        min: Duration,
        max: Duration,
    ) -> Option<Duration> {
        match humantime::parse_duration(text) {
            Ok(d) if d < min || d > max => {
                self.err(
                    span,
                    format!("{what} \"{}\" is out of range", clip(text)),
                    Some(format!(
                        "{what} must be between {} and {}",
                        humantime::format_duration(min),
                        humantime::format_duration(max)
                    )),
                );
                None
            }
            Ok(d) => Some(d),
            Err(e) => {
                self.err(
                    span,
                    format!("bad duration \"{}\" for {what}: {e}", clip(text)),
                    Some(DURATION_HINT.into()),
                );
                None
            }
        }
    }

    fn rate(&mut self, s: &S<String>) -> Option<u64> {
        match parse_rate(s.get_ref()) {
            Ok(bps) if !(MIN_RATE_BPS..=MAX_RATE_BPS).contains(&bps) => {
                self.err(
                    s.span(),
                    format!("rate \"{}\" is out of range", clip(s.get_ref())),
                    Some("rates must be between 1kbit and 10Tbit".into()),
                );
                None
            }
            Ok(bps) => Some(bps),
            Err(why) => {
                self.err(
                    s.span(),
                    format!("bad rate \"{}\": {why}", clip(s.get_ref())),
                    Some(RATE_HINT.into()),
                );
                None
            }
        }
    }

    fn steps(&mut self, raw: Option<&S<Vec<S<RawStep>>>>) -> Vec<Step> {
        let Some(raw) = raw.filter(|r| !r.get_ref().is_empty()) else {
            let span = raw.map_or(0..0, |r| r.span());
            self.err(
                span,
                "playbook has no steps".into(),
                Some("add at least one [[steps]] table with an action".into()),
            );
            return Vec::new();
        };
        let list = raw.get_ref();
        if list.len() > MAX_STEPS {
            self.err(
                list[MAX_STEPS].get_ref().action.span(),
                format!("{} steps, more than the {MAX_STEPS} allowed", list.len()),
                Some("split the work: escalate to a second playbook".into()),
            );
            return Vec::new();
        }
        let before = self.diags.len();
        // Ids first (jumps refer to them), with the span naming each step.
        let mut ids: Vec<(String, Range<usize>)> = Vec::with_capacity(list.len());
        let mut seen: HashMap<String, Range<usize>> = HashMap::new();
        for (i, st) in list.iter().enumerate() {
            let st = st.get_ref();
            let (id, span) = match &st.id {
                Some(id) => {
                    let v = self.name(id, "step id");
                    if RESERVED_IDS.contains(&v.as_str()) {
                        self.err(
                            id.span(),
                            format!("step id \"{v}\" is reserved"),
                            Some(
                                "\"end\" and \"escalate\" are jump targets; pick another id".into(),
                            ),
                        );
                    }
                    (v, id.span())
                }
                None => (format!("step-{}", i + 1), st.action.span()),
            };
            if let Some(first) = seen.get(&id) {
                let (l, c) = self.src.line_col(first.start);
                self.err(
                    span.clone(),
                    format!("duplicate step id \"{id}\""),
                    Some(format!("first used at {l}:{c}; step ids must be unique")),
                );
            } else {
                seen.insert(id.clone(), span.clone());
            }
            ids.push((id, span));
        }

        let mut steps = Vec::with_capacity(list.len());
        // Successor edges for reachability: success, skip, failure.
        let mut edges: Vec<Vec<usize>> = vec![Vec::new(); list.len()];
        for (i, st) in list.iter().enumerate() {
            let st = st.get_ref();
            let action = self.action(st);
            let when = st.when.as_ref().and_then(|w| self.condition(w));
            let retries = st.retries.as_ref().map_or(0, |r| {
                self.int_in(r, "retries", 0, i64::from(MAX_RETRIES)) as u32
            });
            let timeout = self.step_timeout(st, action.as_ref());
            let next = st.next.as_ref().and_then(|n| self.jump(n, i, &ids, false));
            let on_failure = st
                .on_failure
                .as_ref()
                .and_then(|n| self.jump(n, i, &ids, true));
            match &next {
                Some(Jump::Step(t)) => edges[i].extend(ids.iter().position(|(id, _)| id == t)),
                Some(_) => {}
                None if i + 1 < list.len() => edges[i].push(i + 1),
                None => {}
            }
            if st.when.is_some() && i + 1 < list.len() {
                edges[i].push(i + 1);
            }
            if let Some(Jump::Step(t)) = &on_failure {
                edges[i].extend(ids.iter().position(|(id, _)| id == t));
            }
            if let Some(action) = action {
                steps.push(Step {
                    id: ids[i].0.clone(),
                    action,
                    when,
                    timeout,
                    retries,
                    next,
                    on_failure,
                });
            }
        }
        // Reachability only means something when the jumps are sound.
        if self.diags.len() == before {
            let mut reached = vec![false; list.len()];
            let mut stack = vec![0usize];
            while let Some(i) = stack.pop() {
                if std::mem::replace(&mut reached[i], true) {
                    continue;
                }
                stack.extend(edges[i].iter().copied().filter(|&j| !reached[j]));
            }
            for (i, r) in reached.iter().enumerate() {
                if !r {
                    self.err(
                        ids[i].1.clone(),
                        format!("step \"{}\" is unreachable", ids[i].0),
                        Some(
                            "no step continues into it (check the `next` of the steps before it), \
                             and no on_failure jumps to it"
                                .into(),
                        ),
                    );
                }
            }
        }
        steps
    }

    fn jump(
        &mut self,
        s: &S<String>,
        from: usize,
        ids: &[(String, Range<usize>)],
        failure: bool,
    ) -> Option<Jump> {
        let v = s.get_ref().as_str();
        match v {
            "end" => return Some(Jump::End),
            "escalate" if failure => return Some(Jump::Escalate),
            "escalate" => {
                self.err(
                    s.span(),
                    "`next` cannot be \"escalate\"".into(),
                    Some("use on_failure = \"escalate\" (the default), or next = \"end\"".into()),
                );
                return None;
            }
            _ => {}
        }
        match ids.iter().position(|(id, _)| id == v) {
            Some(j) if j <= from => {
                self.err(
                    s.span(),
                    format!("jump back to step \"{v}\""),
                    Some("jumps go forward only, so every playbook ends; wait_until and retries cover repetition".into()),
                );
                None
            }
            Some(_) => Some(Jump::Step(v.to_string())),
            None => {
                let mut cands: Vec<&str> = ids.iter().map(|(id, _)| id.as_str()).collect();
                cands.push("end");
                if failure {
                    cands.push("escalate");
                }
                self.err(
                    s.span(),
                    format!("jump to missing step \"{}\"", clip(v)),
                    Some(suggest(v, &cands)),
                );
                None
            }
        }
    }

    fn step_timeout(&mut self, st: &RawStep, action: Option<&Action>) -> Duration {
        let given = st.timeout.as_ref().and_then(|t| {
            self.duration(t, "timeout", MIN_TIMEOUT, MAX_TIMEOUT)
                .map(|d| (d, t))
        });
        match (action, given) {
            (Some(Action::WaitUntil { .. }), None) if st.timeout.is_none() => {
                self.err(
                    st.action.span(),
                    "wait_until needs a timeout".into(),
                    Some(
                        "add e.g. timeout = \"10m\": how long to wait before the step fails".into(),
                    ),
                );
                DEFAULT_TIMEOUT
            }
            (Some(Action::Drain { deadline }), Some((d, t))) if d < *deadline => {
                self.err(
                    t.span(),
                    "drain timeout is shorter than its deadline".into(),
                    Some("the timeout must leave the drain time to reach its deadline; omit it for deadline + 1m".into()),
                );
                d
            }
            (Some(Action::Drain { deadline }), None) => {
                (*deadline + Duration::from_secs(60)).min(MAX_TIMEOUT)
            }
            (_, Some((d, _))) => d,
            (_, None) => DEFAULT_TIMEOUT,
        }
    }

    fn action(&mut self, st: &RawStep) -> Option<Action> {
        let name = st.action.get_ref().as_str();
        let Some(&known) = Action::NAMES.iter().find(|n| **n == name) else {
            self.err(
                st.action.span(),
                format!("unknown action \"{}\"", clip(name)),
                Some(suggest(name, &Action::NAMES)),
            );
            return None;
        };
        let params: [(&str, &Option<S<String>>); 7] = [
            ("to", &st.to),
            ("rate", &st.rate),
            ("edge_hold", &st.edge_hold),
            ("deadline", &st.deadline),
            ("condition", &st.condition),
            ("message", &st.message),
            ("webhook", &st.webhook),
        ];
        let takes: &[&str] = match known {
            "migrate_qps" => &["to"],
            "reshape_rate" => &["rate", "edge_hold"],
            "drain" => &["deadline"],
            "wait_until" => &["condition"],
            "notify" => &["message", "webhook"],
            _ => &[],
        };
        let mut bad = false;
        for (p, v) in params {
            if let Some(v) = v {
                if !takes.contains(&p) {
                    let (l, c) = self.src.line_col(st.action.span().start);
                    let hint = if takes.is_empty() {
                        format!("{known} (at {l}:{c}) takes no parameters")
                    } else {
                        format!("{known} (at {l}:{c}) takes: {}", takes.join(", "))
                    };
                    self.err(
                        v.span(),
                        format!("`{p}` does not apply to action \"{known}\""),
                        Some(hint),
                    );
                    bad = true;
                }
            }
        }
        let need = |ctx: &mut Self, p: &str, v: &Option<S<String>>| {
            if v.is_none() {
                ctx.err(
                    st.action.span(),
                    format!("action \"{known}\" needs `{p}`"),
                    Some(param_hint(p).into()),
                );
            }
        };
        let action = match known {
            "migrate_qps" => {
                need(self, "to", &st.to);
                let to = st.to.as_ref()?;
                if to.get_ref() == "backup" {
                    Action::MigrateQps {
                        to: MigrateTarget::Backup,
                    }
                } else {
                    Action::MigrateQps {
                        to: MigrateTarget::Nic(self.ident(to, "NIC name")),
                    }
                }
            }
            "failback" => Action::Failback,
            "reshape_rate" => Action::ReshapeRate {
                bits_per_sec: match st.rate.as_ref() {
                    Some(r) => Some(self.rate(r)?),
                    None => None,
                },
                edge_hold: match st.edge_hold.as_ref() {
                    Some(d) => Some(self.duration(
                        d,
                        "edge_hold threshold",
                        MIN_EDGE_HOLD,
                        MAX_EDGE_HOLD,
                    )?),
                    None => None,
                },
            },
            "checkpoint_job" => Action::CheckpointJob,
            "restart_job" => Action::RestartJob,
            "cordon" => Action::Cordon,
            "return_to_service" => Action::ReturnToService,
            "drain" => {
                need(self, "deadline", &st.deadline);
                let d = st.deadline.as_ref()?;
                Action::Drain {
                    deadline: self.duration(d, "drain deadline", Duration::ZERO, MAX_TIMEOUT)?,
                }
            }
            "wait_until" => {
                need(self, "condition", &st.condition);
                Action::WaitUntil {
                    condition: self.condition(st.condition.as_ref()?)?,
                }
            }
            "exclude_from_owd" => Action::ExcludeFromOwd,
            "include_in_owd" => Action::IncludeInOwd,
            "notify" => {
                need(self, "message", &st.message);
                let m = st.message.as_ref()?;
                self.message(m);
                let webhook = st.webhook.as_ref().map(|w| self.webhook(w));
                Action::Notify {
                    message: m.get_ref().clone(),
                    webhook,
                }
            }
            _ => unreachable!("every name in Action::NAMES is handled"),
        };
        (!bad).then_some(action)
    }

    fn message(&mut self, m: &S<String>) {
        let text = m.get_ref();
        if text.trim().is_empty() || text.chars().count() > MAX_MESSAGE_LEN {
            self.err(
                m.span(),
                "notify message is empty or too long".into(),
                Some(format!("1 to {MAX_MESSAGE_LEN} characters")),
            );
            return;
        }
        let mut rest = text.as_str();
        let mut base = 0;
        while let Some(open) = rest.find(['{', '}']) {
            if rest.as_bytes()[open] == b'}' {
                let span = self.inner(m, base + open, 1);
                self.err(
                    span,
                    "unmatched '}' in notify message".into(),
                    Some(placeholder_hint()),
                );
                return;
            }
            let Some(close) = rest[open..].find('}') else {
                let span = self.inner(m, base + open, 1);
                self.err(
                    span,
                    "unclosed '{' in notify message".into(),
                    Some(placeholder_hint()),
                );
                return;
            };
            let key = &rest[open + 1..open + close];
            if !PLACEHOLDERS.contains(&key) {
                let span = self.inner(m, base + open, close + 1);
                self.err(
                    span,
                    format!("unknown placeholder {{{}}}", clip(key)),
                    Some(suggest(key, &PLACEHOLDERS)),
                );
                return;
            }
            base += open + close + 1;
            rest = &rest[open + close + 1..];
        }
    }

    fn webhook(&mut self, w: &S<String>) -> String {
        let v = w.get_ref();
        let after = v
            .strip_prefix("http://")
            .or_else(|| v.strip_prefix("https://"));
        let ok = after.is_some_and(|a| {
            !a.is_empty()
                && !a.starts_with('/')
                && !a.chars().any(|c| c.is_whitespace() || c.is_control())
        }) && v.len() <= MAX_URL_LEN;
        if !ok {
            self.err(
                w.span(),
                format!("bad webhook URL \"{}\"", clip(v)),
                Some(format!(
                    "an http:// or https:// URL with a host, at most {MAX_URL_LEN} characters"
                )),
            );
        }
        v.clone()
    }
}

fn placeholder_hint() -> String {
    format!(
        "placeholders are {}",
        PLACEHOLDERS.map(|p| format!("{{{p}}}")).join(", ")
    )
}

fn param_hint(p: &str) -> &'static str {
    match p {
        "to" => "to = \"backup\" or a NIC name on the same host",
        "rate" => RATE_HINT,
        "edge_hold" => {
            "edge_hold = \"1ms\": hold a job's flow at the sender while its one-way delay exceeds the path's baseline by this much (100us..1s)"
        }
        "deadline" => "deadline = \"10m\": how long work may take to leave before it is stopped",
        "condition" => "condition = \"nic_reusable\" (any condition, optionally with `not`)",
        "message" => {
            "message = \"text, may use {host} {nic} {rail} {job} {peer} {kind} {incident} {playbook}\""
        }
        _ => "see playbooks/README.md",
    }
}

fn kind_names() -> Vec<&'static str> {
    IncidentKind::ALL.iter().map(|k| k.as_str()).collect()
}

/// Whitespace-separated words with their byte offsets.
fn split_words(s: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in s.char_indices() {
        match (c.is_whitespace(), start) {
            (true, Some(st)) => {
                out.push((st, &s[st..i]));
                start = None;
            }
            (false, None) => start = Some(i),
            _ => {}
        }
        if out.len() > 8 {
            return out;
        }
    }
    if let Some(st) = start {
        out.push((st, &s[st..]));
    }
    out
}

/// Bounded echo of user text in messages.
fn clip(s: &str) -> String {
    const MAX: usize = 64;
    if s.chars().count() <= MAX {
        s.to_string()
    } else {
        let mut c: String = s.chars().take(MAX).collect();
        c.push('…');
        c
    }
}

/// "400Mbit", "2.5 Gbit", "800kbit", "1000bit" → bits per second.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return Err("no number".into());
    }
    let unit = unit.trim().to_ascii_lowercase();
    let mult: u64 = match unit.as_str() {
        "bit" => 1,
        "kbit" => 1_000,
        "mbit" => 1_000_000,
        "gbit" => 1_000_000_000,
        "tbit" => 1_000_000_000_000,
        "" => return Err("no unit".into()),
        "bps" | "kbps" | "mbps" | "gbps" | "tbps" => {
            return Err(format!(
                "\"{unit}\" is ambiguous (bits or bytes?); write bit, kbit, Mbit, Gbit or Tbit"
            ))
        }
        other => return Err(format!("unknown unit \"{}\"", clip(other))),
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() || frac.contains('.') || (num.contains('.') && frac.is_empty()) {
        return Err(format!("bad number \"{}\"", clip(num)));
    }
    if int.len() > 15 || frac.len() > 9 {
        return Err("number too long".into());
    }
    let int: u64 = int
        .parse()
        .map_err(|_| format!("bad number \"{}\"", clip(num)))?;
    let mut bps = int.checked_mul(mult).ok_or("too large")?;
    if !frac.is_empty() {
        let f: u64 = frac
            .parse()
            .map_err(|_| format!("bad number \"{}\"", clip(num)))?;
        let scale = 10u64.pow(frac.len() as u32);
        // mult ≤ 1e12 and f < 1e9: u128 keeps this exact.
        let part = u128::from(f) * u128::from(mult) / u128::from(scale);
        bps = bps.checked_add(part as u64).ok_or("too large")?;
    }
    Ok(bps)
}

#[cfg(test)]
mod tests {
    use crate::parse::*;

    #[test]
    fn rates() {
        assert_eq!(parse_rate("400Mbit"), Ok(400_000_000));
        assert_eq!(parse_rate("2.5Gbit"), Ok(2_500_000_000));
        assert_eq!(parse_rate("800 kbit"), Ok(800_000));
        assert_eq!(parse_rate("1000bit"), Ok(1000));
        assert!(parse_rate("400").is_err());
        assert!(parse_rate("400mbps").is_err());
        assert!(parse_rate("4.0.0gbit").is_err());
        assert!(parse_rate("99999999999999tbit").is_err());
        assert!(parse_rate("Mbit").is_err());
        assert!(parse_rate(".5Gbit").is_err());
    }

    #[test]
    fn words() {
        assert_eq!(
            split_words(" not  a b"),
            vec![(1, "not"), (6, "a"), (8, "b")]
        );
    }
}
