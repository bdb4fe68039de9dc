//! Human rendering of every admin reply: dispatches to the printer of the
//! reply's command group.

use supervisor::api::AdminReply;

use crate::output::print_json;
use crate::{clock, events, jobs, links, members, nics, nodes, playbooks};

/// Prints a reply as the human table of its command.
pub fn render(reply: &AdminReply) {
    match reply {
        AdminReply::Status(s) => members::print_status(s),
        AdminReply::Members { members } => members::print_members(members),
        AdminReply::Hosts { hosts } => nodes::print_hosts(hosts),
        AdminReply::Host { host, jobs } => nodes::print_host(host, jobs),
        AdminReply::Incidents { incidents } => events::print_incidents(incidents),
        AdminReply::Nics { nics } => nics::print_nics(nics),
        AdminReply::Events { events, omitted } => events::print_events(events, *omitted),
        AdminReply::History { records } => events::print_history(records),
        AdminReply::Committed { log_index, detail } => {
            if *log_index > 0 {
                println!("ok (log index {log_index}): {detail}");
            } else {
                println!("ok: {detail}");
            }
        }
        AdminReply::Qps { qps, truncated } => nics::print_qps(qps, *truncated),
        AdminReply::Intents { intents } => events::print_intents(intents),
        AdminReply::Intent { intent } => println!("{}", events::intent_line(intent)),
        AdminReply::IntentOpened {
            id,
            log_index,
            detail,
        } => println!("intent {id} opened (log index {log_index}): {detail}"),
        AdminReply::Clock(v) => clock::print_clock(v),
        AdminReply::Paths(v) => clock::print_paths(v),
        AdminReply::Queueing(v) => clock::print_queueing(v),
        AdminReply::Links(v) => links::print_links(v),
        AdminReply::Shapes { shapes } => links::print_shapes(shapes),
        AdminReply::Jobs { jobs } => jobs::print_jobs(jobs),
        AdminReply::Playbooks { playbooks, version } => {
            playbooks::print_playbooks(playbooks, *version)
        }
        AdminReply::Playbook { playbook } => playbooks::print_playbook(playbook),
        AdminReply::PlaybookPlan { plan, matched_now } => {
            playbooks::print_plan(plan, matched_now.as_deref())
        }
        AdminReply::PlaybookRuns { runs, truncated } => playbooks::print_runs(runs, *truncated),
        AdminReply::Job { job, waiting } => jobs::print_job(job, waiting.as_deref()),
        AdminReply::JobLogs {
            host,
            incarnation,
            text,
            ..
        } => jobs::print_job_logs(host, *incarnation, text),
    }
}

/// Prints `reply` as JSON or as its table.
pub fn show(reply: &AdminReply, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(reply);
    }
    render(reply);
    Ok(())
}
