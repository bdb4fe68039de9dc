//! `ringtrain`: deterministic data-parallel training over railguard's
//! resilient connections, the chaos scenarios' workload. See
//! `workloads::ringtrain` for the configuration, output lines and exit
//! codes.

fn main() {
    std::process::exit(workloads::ringtrain::main_entry());
}
