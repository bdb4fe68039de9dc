//! RDMA device model and the resilient connection. Not built yet: the rdma
//! issue fills this crate (verbs backend over rdma-sys, soft backend over
//! NIC-bound sockets, queue-pair migration).
