//! Sequencing and replay core of the resilient connection (being built).
