//! `ringtrain`: deterministic data-parallel training over railguard's
//! resilient connections, the chaos scenarios' workload. See
//! `chaos_tests::ringtrain` for the configuration, output lines and exit
//! codes.

fn main() {
    std::process::exit(chaos_tests::ringtrain::main_entry());
}
