//! libibverbs backend (being built).
