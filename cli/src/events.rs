//! `railguard events`, `incidents`, `intents` and `history`: the event log
//! (also followed live), incidents, the leader's intents with their
//! outcome, and recorded admin operations.

use supervisor::api::{AdminReply, AdminRequest};
use supervisor::client::AdminClient;
use supervisor::model::{AdminRecord, ClusterEvent, Incident, Intent, IntentStatus, Outcome};

use crate::output::{fmt_ms, table};

/// `railguard events --follow`: from `since`, or the newest `limit` events
/// first when it is not given.
pub async fn follow(
    client: &AdminClient,
    since: Option<u64>,
    limit: u32,
    json: bool,
) -> anyhow::Result<()> {
    let since = match since {
        Some(s) => s,
        None => {
            let req = AdminRequest::Events {
                since: 0,
                limit,
                newest: true,
            };
            match client.call(req, false).await? {
                AdminReply::Events { events, .. } if events.is_empty() => 0,
                // The stream starts after `since`, so it shows these first.
                AdminReply::Events { events, .. } => {
                    events.first().map_or(0, |e| e.seq.saturating_sub(1))
                }
                other => anyhow::bail!("unexpected reply: {other:?}"),
            }
        }
    };
    client
        .follow(since, |e| {
            if json {
                println!("{}", serde_json::to_string(&e).unwrap_or_default());
            } else {
                print_event(&e.record);
            }
            true
        })
        .await?;
    Ok(())
}

pub fn print_event(e: &ClusterEvent) {
    println!(
        "{:>6}  {}  {:<10} {}",
        e.seq,
        fmt_ms(e.at_ms),
        e.host.as_deref().unwrap_or("-"),
        e.what
    );
}

/// `railguard events`; says on stderr how many matching events it left
/// out.
pub fn print_events(events: &[ClusterEvent], omitted: u64) {
    if events.is_empty() {
        println!("no events");
    }
    for e in events {
        print_event(e);
    }
    if omitted > 0 {
        let (first, last) = (
            events.first().map_or(0, |e| e.seq),
            events.last().map_or(0, |e| e.seq),
        );
        eprintln!(
            "({omitted} more events not shown: {first}..{last} are listed; --limit N or --since SEQ for others)"
        );
    }
}

pub fn print_incidents(incidents: &[Incident]) {
    if incidents.is_empty() {
        println!("no incidents");
        return;
    }
    table!(
        incidents,
        "{:>5}  {:<14} {:<11} {:<8} {:<26} {:<26} {}",
        ["ID", "KIND", "HOST", "NIC", "OPENED", "CLOSED", "DETAIL"],
        |i| [
            i.id,
            i.kind,
            // A path incident names two hosts.
            match &i.peer {
                Some(p) => format!("{},{p}", i.host),
                None => i.host.clone(),
            },
            i.nic.as_deref().unwrap_or("-"),
            fmt_ms(i.opened_ms),
            i.closed_ms.map(fmt_ms).unwrap_or_else(|| "open".into()),
            i.detail
        ],
    );
}

/// `railguard history`.
pub fn print_history(records: &[AdminRecord]) {
    for r in records {
        println!(
            "{}  {:<10} {:>8}  {}",
            fmt_ms(r.at_ms),
            r.actor,
            r.log_index,
            r.op.summary()
        );
    }
}

pub fn intent_status(i: &Intent) -> String {
    match &i.status {
        IntentStatus::Open => "open".into(),
        IntentStatus::Closed(Outcome::Done) => "done".into(),
        IntentStatus::Closed(Outcome::Failed { .. }) => "failed".into(),
        IntentStatus::Closed(Outcome::Cancelled { .. }) => "cancelled".into(),
    }
}

/// `intent 7: failover of h0/rail0 to rail1: done (moved 3 connections)`.
pub fn intent_line(i: &Intent) -> String {
    let why = match &i.status {
        IntentStatus::Closed(Outcome::Failed { error }) => error.clone(),
        IntentStatus::Closed(Outcome::Cancelled { why }) => why.clone(),
        _ => i.detail.clone(),
    };
    let why = if why.is_empty() {
        String::new()
    } else {
        format!(" ({why})")
    };
    format!("intent {}: {}: {}{why}", i.id, i.action, intent_status(i))
}

/// What an intent's table row says last: why it failed or was cancelled,
/// else its detail.
fn intent_detail(i: &Intent) -> &str {
    match &i.status {
        IntentStatus::Closed(Outcome::Failed { error }) => error.as_str(),
        IntentStatus::Closed(Outcome::Cancelled { why }) => why.as_str(),
        _ => i.detail.as_str(),
    }
}

/// The widest the intents table's action column gets (longer sentences
/// are cut with `…`; `-o json` has them whole).
const MAX_ACTION_WIDTH: usize = 72;

pub fn print_intents(intents: &[Intent]) {
    if intents.is_empty() {
        println!("no intents");
        return;
    }
    // The action column is as wide as its longest sentence (up to a
    // bound), so no row pushes the others out of line.
    let width = intents
        .iter()
        .map(|i| i.action.to_string().chars().count())
        .max()
        .unwrap_or(0)
        .clamp(6, MAX_ACTION_WIDTH);
    let action = |s: String| {
        let mut s: String = if s.chars().count() > width {
            s.chars().take(width - 1).chain(['…']).collect()
        } else {
            s
        };
        let pad = width.saturating_sub(s.chars().count());
        s.extend(std::iter::repeat_n(' ', pad));
        s
    };
    table!(
        intents,
        "{:>5}  {} {:<9} {:<26} {:<26} {}",
        [
            "ID",
            action("ACTION".into()),
            "STATUS",
            "OPENED",
            "CLOSED",
            "DETAIL"
        ],
        |i| [
            i.id,
            action(i.action.to_string()),
            intent_status(i),
            fmt_ms(i.opened_ms),
            i.closed_ms.map(fmt_ms).unwrap_or_else(|| "-".into()),
            intent_detail(i)
        ],
    );
}
