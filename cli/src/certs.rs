//! `railguard pki …`: the cluster CA and certificates, offline (no
//! supervisor is contacted). `init` creates the CA, `issue` a certificate
//! for a supervisor, an agent or an admin, `show` describes a certificate
//! file. Files are written new with mode 0600; nothing is written on error.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::Context;
use clap::{Args, Subcommand};
use pki::{CertInfo, Identity, Issued, Role};
use serde::Serialize;

use crate::output::print_json;

/// `railguard pki …`.
#[derive(Subcommand, Debug)]
pub enum PkiCmd {
    /// Create the cluster CA in --dir: ca.pem (certificate) and ca.key
    /// (private key), mode 0600. Refuses to overwrite an existing CA.
    Init {
        /// Directory for ca.pem and ca.key (created if missing).
        #[arg(long)]
        dir: PathBuf,
        /// Validity in days.
        #[arg(long, default_value_t = 3650)]
        days: u32,
    },
    /// Issue a certificate signed by the CA: <out>/<kind>-<name>.pem and .key.
    #[command(subcommand)]
    Issue(IssueCmd),
    /// Describe a certificate file: holder, serial, validity, issuer, names.
    Show {
        /// A PEM certificate file (the first certificate is shown).
        file: PathBuf,
    },
    /// Revoke a certificate cluster-wide by its serial (needs a
    /// supervisor and the admin role): every supervisor refuses it from
    /// its next handshake and call on.
    Revoke {
        /// The serial `railguard pki show FILE` prints (lowercase hex).
        serial: String,
        /// Why (recorded in the history).
        #[arg(long, default_value = "revoked")]
        reason: String,
    },
}

/// `railguard pki issue …`: who the certificate is for.
#[derive(Subcommand, Debug)]
pub enum IssueCmd {
    /// A supervisor (server and client certificate; always valid for the
    /// name supervisor.railguard).
    Supervisor {
        /// Its Raft member id.
        #[arg(long)]
        member: u64,
        #[command(flatten)]
        common: IssueArgs,
    },
    /// A node agent (client certificate).
    Agent {
        /// The host name it registers under.
        #[arg(long)]
        host: String,
        #[command(flatten)]
        common: IssueArgs,
    },
    /// An admin user (client certificate) with a role.
    Admin {
        /// The user name recorded with its writes.
        #[arg(long)]
        user: String,
        /// viewer, operator or admin.
        #[arg(long, value_parser = parse_role)]
        role: Role,
        #[command(flatten)]
        common: IssueArgs,
    },
}

/// Options every `pki issue` takes.
#[derive(Args, Debug)]
pub struct IssueArgs {
    /// The CA directory (with ca.pem and ca.key).
    #[arg(long)]
    ca_dir: PathBuf,
    /// Directory for the certificate and key (created if missing).
    #[arg(long)]
    out: PathBuf,
    /// An extra subject alternative name (DNS name or IP address); repeat
    /// or separate with commas.
    #[arg(long = "san", value_delimiter = ',')]
    sans: Vec<String>,
    /// Validity in days.
    #[arg(long, default_value_t = 365)]
    days: u32,
}

fn parse_role(s: &str) -> Result<Role, String> {
    s.parse().map_err(|e: pki::PkiError| e.to_string())
}

/// A time as RFC 3339 (seconds) with how far it is from now.
fn when(t: SystemTime) -> String {
    let stamp = humantime::format_rfc3339_seconds(t);
    // Rounded to the nearest day: a 365-day certificate says 365.
    let days = |d: std::time::Duration| (d.as_secs() + 43_200) / 86_400;
    match t.duration_since(SystemTime::now()) {
        Ok(left) => format!("{stamp} (in {} days)", days(left)),
        Err(e) => format!("{stamp} ({} days ago)", days(e.duration())),
    }
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// What `init` and `issue` print with `--output json`.
#[derive(Serialize)]
struct IssuedView {
    identity: Option<Identity>,
    cert: PathBuf,
    key: PathBuf,
    serial: String,
    not_before: String,
    not_after: String,
}

fn print_issued(
    what: &str,
    identity: Option<Identity>,
    i: &Issued,
    json: bool,
) -> anyhow::Result<()> {
    if json {
        return print_json(&IssuedView {
            identity,
            cert: i.cert_path.clone(),
            key: i.key_path.clone(),
            serial: i.serial.to_string(),
            not_before: rfc3339(i.not_before),
            not_after: rfc3339(i.not_after),
        });
    }
    println!("{what}");
    println!("certificate: {} (mode 0600)", i.cert_path.display());
    println!("key:         {} (mode 0600)", i.key_path.display());
    println!("serial:      {}", i.serial);
    println!("expires:     {}", when(i.not_after));
    Ok(())
}

/// What `show` prints with `--output json`.
#[derive(Serialize)]
struct ShowView {
    identity: Option<Identity>,
    is_ca: bool,
    serial: String,
    not_before: String,
    not_after: String,
    expired: bool,
    subject: String,
    issuer: String,
    sans: Vec<String>,
}

fn print_show(file: &Path, c: &CertInfo, json: bool) -> anyhow::Result<()> {
    let expired = c.not_after < SystemTime::now();
    if json {
        return print_json(&ShowView {
            identity: c.identity.clone(),
            is_ca: c.is_ca,
            serial: c.serial.to_string(),
            not_before: rfc3339(c.not_before),
            not_after: rfc3339(c.not_after),
            expired,
            subject: c.subject.clone(),
            issuer: c.issuer.clone(),
            sans: c.sans.clone(),
        });
    }
    let holder = match &c.identity {
        Some(id) => id.to_string(),
        None => "cluster CA".into(),
    };
    println!("file:        {}", file.display());
    println!("holder:      {holder}");
    println!("serial:      {}", c.serial);
    println!("subject:     {}", c.subject);
    println!("issuer:      {}", c.issuer);
    println!("not before:  {}", rfc3339(c.not_before));
    println!(
        "expires:     {}{}",
        when(c.not_after),
        if expired { " EXPIRED" } else { "" }
    );
    if !c.sans.is_empty() {
        println!("names:       {}", c.sans.join(", "));
    }
    Ok(())
}

/// Runs a `railguard pki` command.
pub fn run(cmd: PkiCmd, json: bool) -> anyhow::Result<()> {
    match cmd {
        PkiCmd::Init { dir, days } => {
            let issued = pki::init_ca(&dir, days).context("cannot create the CA")?;
            print_issued(
                &format!("created the cluster CA in {}", dir.display()),
                None,
                &issued,
                json,
            )
        }
        PkiCmd::Issue(holder) => {
            let (identity, common) = match holder {
                IssueCmd::Supervisor { member, common } => (Identity::supervisor(member), common),
                IssueCmd::Agent { host, common } => (Identity::agent(host)?, common),
                IssueCmd::Admin { user, role, common } => (Identity::admin(user, role)?, common),
            };
            let issued = pki::issue(
                &common.ca_dir,
                &identity,
                &common.sans,
                common.days,
                &common.out,
            )
            .with_context(|| format!("cannot issue a certificate for {identity}"))?;
            print_issued(&format!("issued {identity}"), Some(identity), &issued, json)
        }
        PkiCmd::Show { file } => {
            let info = pki::show(&file)?;
            print_show(&file, &info, json)
        }
        PkiCmd::Revoke { .. } => {
            anyhow::bail!("pki revoke needs a supervisor (it is not an offline command)")
        }
    }
}
