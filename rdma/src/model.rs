//! Device, port and async-event model (being built).
