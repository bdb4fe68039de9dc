//! The railguard node agent. Not built yet: the agent issue (netlink link
//! tracker, flap damping, reliable report stream) fills this crate. Until
//! then the supervisor's agent API is exercised by test clients.
