//! Examples for every command's `--help` (and its man page), one table so
//! none is forgotten: a test checks that every command has examples and
//! that each example parses.

use clap::Command;

/// Command path (words after `railguard`) → example lines.
pub const EXAMPLES: &[(&str, &[&str])] = &[
    ("", &["railguard status", "railguard -s 10.0.0.1:7400 node list", "railguard --context prod -w nic list"]),
    ("status", &["railguard status", "railguard -o json status"]),
    ("cluster init", &["railguard cluster init"]),
    ("cluster members", &["railguard cluster members"]),
    ("cluster add-member", &["railguard cluster add-member 4 10.0.0.4:7400"]),
    ("cluster remove-member", &["railguard cluster remove-member 4"]),
    ("cluster transfer-leader", &["railguard cluster transfer-leader 2"]),
    ("node list", &["railguard node list", "railguard -w --interval 5s node list"]),
    ("node show", &["railguard node show gpu-017"]),
    ("node cordon", &["railguard node cordon gpu-017"]),
    ("node uncordon", &["railguard node uncordon gpu-017"]),
    ("node drain", &["railguard node drain gpu-017 --reason \"replace optics\" --deadline 30m"]),
    ("node undrain", &["railguard node undrain gpu-017"]),
    ("node remove", &["railguard node remove gpu-017"]),
    ("node label", &["railguard node label gpu-017 rack=r12 zone=a", "railguard node label gpu-017 --remove zone"]),
    ("nic list", &["railguard nic list", "railguard nic list --state down", "railguard -o json nic list"]),
    ("nic failover", &["railguard nic failover gpu-017 rail0", "railguard nic failover gpu-017 rail0 --to rail1 --no-wait"]),
    ("nic failback", &["railguard nic failback gpu-017 rail0"]),
    ("job submit", &["railguard job submit train.toml"]),
    ("job list", &["railguard job list"]),
    ("job show", &["railguard job show llm-7b"]),
    ("job checkpoint", &["railguard job checkpoint llm-7b", "railguard job checkpoint llm-7b --wait 0s"]),
    ("job restart", &["railguard job restart llm-7b --reason \"bad loss spike\""]),
    ("job cancel", &["railguard job cancel llm-7b"]),
    ("job logs", &["railguard job logs llm-7b", "railguard job logs llm-7b --rank 3 --bytes 65536", "railguard job logs llm-7b -f"]),
    ("playbook list", &["railguard playbook list"]),
    ("playbook show", &["railguard playbook show nic-down"]),
    ("playbook apply", &["railguard playbook apply playbooks/library/*.toml"]),
    ("playbook delete", &["railguard playbook delete link-contention"]),
    ("playbook plan", &["railguard playbook plan nic-down.toml --incident nic_down --host gpu-017 --nic rail0"]),
    ("playbook runs", &["railguard playbook runs --open"]),
    ("qp list", &["railguard qp list --job llm-7b", "railguard qp list --host gpu-017"]),
    ("intents", &["railguard intents --open", "railguard intents --limit 200"]),
    ("incidents", &["railguard incidents --open"]),
    ("events", &["railguard events", "railguard events --follow", "railguard events --since 1200 --limit 500"]),
    ("history", &["railguard history --limit 20"]),
    ("clock", &["railguard clock", "railguard -o json clock"]),
    ("paths", &["railguard paths --top 10", "railguard paths --host gpu-017 --queueing"]),
    ("links", &["railguard links"]),
    ("shape list", &["railguard shape list", "railguard shape list gpu-017"]),
    ("shape clear", &["railguard shape clear gpu-017"]),
    ("pki init", &["railguard pki init --dir /root/railguard-ca"]),
    ("pki issue supervisor", &["railguard pki issue supervisor --member 1 --ca-dir /root/railguard-ca --out /etc/railguard/tls"]),
    ("pki issue agent", &["railguard pki issue agent --host gpu-017 --ca-dir /root/railguard-ca --out /tmp/gpu-017"]),
    ("pki issue admin", &["railguard pki issue admin --user ops --role operator --ca-dir /root/railguard-ca --out ~/.railguard"]),
    ("pki show", &["railguard pki show /etc/railguard/tls/supervisor-1.pem"]),
    ("pki revoke", &["railguard pki revoke 3f2a9c01d4 --reason \"laptop stolen\""]),
    ("context list", &["railguard context list"]),
    ("context show", &["railguard context show", "railguard context show prod"]),
    ("context use", &["railguard context use prod"]),
    ("completion", &["railguard completion bash > /usr/share/bash-completion/completions/railguard"]),
    ("man", &["railguard man --dir /usr/local/share/man/man1"]),
];

/// `cmd` (the whole `railguard` tree) with each command's examples after
/// its help.
pub fn with_examples(cmd: Command) -> Command {
    attach(cmd, "")
}

fn attach(mut cmd: Command, path: &str) -> Command {
    if let Some((_, lines)) = EXAMPLES.iter().find(|(p, _)| *p == path) {
        let text: String = std::iter::once("Examples:".to_owned())
            .chain(lines.iter().map(|l| format!("  {l}")))
            .collect::<Vec<_>>()
            .join("\n");
        cmd = cmd.after_help(text);
    }
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_owned())
        .collect();
    for name in names {
        let sub_path = if path.is_empty() {
            name.clone()
        } else {
            format!("{path} {name}")
        };
        cmd = cmd.mut_subcommand(&name, |s| attach(s, &sub_path));
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    /// Every command path of the tree that is not a group (clap's own
    /// `help` left out).
    fn leaves(cmd: &Command, path: &str, out: &mut Vec<String>) {
        let subs: Vec<&Command> = cmd
            .get_subcommands()
            .filter(|s| s.get_name() != "help")
            .collect();
        if subs.is_empty() {
            out.push(path.to_owned());
        }
        for s in subs {
            let p = if path.is_empty() {
                s.get_name().to_owned()
            } else {
                format!("{path} {}", s.get_name())
            };
            leaves(s, &p, out);
        }
    }

    #[test]
    fn every_command_has_examples_and_each_example_parses() {
        let tree = crate::Cli::command();
        let mut all = Vec::new();
        leaves(&tree, "", &mut all);
        assert!(all.len() > 40, "{all:?}");
        for path in &all {
            assert!(
                EXAMPLES.iter().any(|(p, _)| p == path),
                "`railguard {path}` has no examples"
            );
        }
        for (path, lines) in EXAMPLES {
            assert!(
                path.is_empty() || all.contains(&path.to_string()),
                "examples for `{path}`, which is not a command"
            );
            for line in *lines {
                // A shell line: drop a redirection, split like a shell
                // would for these simple quotes.
                let line = line.split(" > ").next().unwrap_or(line);
                let words = shell_words(line);
                let r = crate::Cli::try_parse_from(&words);
                assert!(r.is_ok(), "`{line}` does not parse: {}", r.err().unwrap());
                assert!(
                    words.join(" ").contains(path),
                    "`{line}` is not an example of `{path}`"
                );
            }
        }
        // And they show in --help.
        let mut full = with_examples(crate::Cli::command());
        let help = full
            .find_subcommand_mut("node")
            .and_then(|n| n.find_subcommand_mut("drain"))
            .map(|d| d.render_long_help().to_string())
            .unwrap();
        assert!(
            help.contains("Examples:\n  railguard node drain gpu-017"),
            "{help}"
        );
    }

    /// Splits at spaces, keeping "double-quoted words" together.
    fn shell_words(s: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut cur = String::new();
        let mut quoted = false;
        for c in s.chars() {
            match c {
                '"' => quoted = !quoted,
                ' ' if !quoted => {
                    if !cur.is_empty() {
                        out.push(std::mem::take(&mut cur));
                    }
                }
                c => cur.push(c),
            }
        }
        if !cur.is_empty() {
            out.push(cur);
        }
        out
    }
}
