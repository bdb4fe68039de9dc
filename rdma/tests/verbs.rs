//! The verbs backend on a machine without RDMA devices: every entry point
//! answers `NoDevices` with the clear message, and nothing panics. (On a
//! machine with devices, enumeration must succeed instead; the test checks
//! whichever situation it finds.)
#![cfg(feature = "verbs")]

use rdma::model::{Backend, RdmaError};
use rdma::verbs::{Context, VerbsBackend};

const CLEAR: &str =
    "no RDMA devices found (libibverbs lists none); the soft backend runs over plain NICs";

fn has_devices() -> bool {
    std::fs::read_dir("/sys/class/infiniband")
        .map(|mut d| d.next().is_some())
        .unwrap_or(false)
}

fn assert_no_devices<T: std::fmt::Debug>(what: &str, r: Result<T, RdmaError>) {
    match r {
        Err(e @ RdmaError::NoDevices) => assert_eq!(e.to_string(), CLEAR, "{what}"),
        other => panic!("{what}: expected NoDevices, got {other:?}"),
    }
}

#[test]
fn enumeration_without_devices_is_no_devices() {
    let b = VerbsBackend::new();
    assert_eq!(b.name(), "verbs");
    if has_devices() {
        let devs = b.devices().expect("devices exist, enumeration works");
        assert!(!devs.is_empty());
        assert!(devs.iter().all(|d| !d.ports.is_empty()));
        return;
    }
    assert_no_devices("devices()", b.devices());
    assert_no_devices("Context::open", Context::open("mlx5_0"));
    assert_no_devices("Context::open_all", Context::open_all());
}

/// `events()` answers `NoDevices` (skipped on a machine with devices).
fn events_say_no_devices() {
    if has_devices() {
        eprintln!("SKIPPED: this machine has RDMA devices");
        return;
    }
    assert_no_devices("events()", VerbsBackend::new().events().map(|_| ()));
}

#[tokio::test]
async fn events_without_devices_is_no_devices() {
    events_say_no_devices();
}

#[test]
fn events_without_devices_is_no_devices_even_outside_a_runtime() {
    events_say_no_devices();
}

#[test]
fn backend_is_usable_as_a_trait_object() {
    let b: Box<dyn Backend> = Box::new(VerbsBackend::new());
    // Either it works or it says why; it never panics.
    match b.devices() {
        Ok(d) => assert!(has_devices() && !d.is_empty()),
        Err(e) => assert!(matches!(e, RdmaError::NoDevices), "{e}"),
    }
}
