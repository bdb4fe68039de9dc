//! Declarative remediation playbooks. Not built yet: the playbooks issue
//! fills this crate; the supervisor's reconciler already records intents.
