//! The libibverbs backend (cargo feature `verbs`, through `rdma-sys`).
//!
//! Enumeration ([`VerbsBackend::devices`]) opens each device briefly and
//! queries its ports. Events ([`VerbsBackend::events`], [`Context::events`])
//! read a context's async event fd, made non-blocking and driven by tokio's
//! [`AsyncFd`]; every event is acknowledged right after it is read.
//!
//! Port and device events reach every open context of a device, but queue
//! pair and completion queue events reach only the context that created the
//! object: whoever creates QPs watches that context with [`Context::events`].
//!
//! Resources are RAII: a [`ProtectionDomain`], [`CompletionQueue`],
//! [`MemoryRegion`] or [`QueuePair`] keeps what it depends on alive (through
//! `Arc`s) and is destroyed in `Drop`, children before parents.
//!
//! On a machine without RDMA devices every entry point returns
//! [`RdmaError::NoDevices`].

use std::ffi::CStr;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, RawFd};
use std::os::raw::c_int;
use std::ptr::{addr_of, NonNull};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::StreamExt;
use rdma_sys as ffi;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::model::{
    AsyncEvent, AsyncEventKind, Backend, Device, EventStream, LinkLayer, Port, PortState, RdmaError,
};

/// The libibverbs backend.
#[derive(Debug, Default, Clone, Copy)]
pub struct VerbsBackend;

impl VerbsBackend {
    pub fn new() -> Self {
        VerbsBackend
    }
}

impl Backend for VerbsBackend {
    fn name(&self) -> &'static str {
        "verbs"
    }

    fn devices(&self) -> Result<Vec<Device>, RdmaError> {
        let list = DeviceList::get()?;
        let mut out = Vec::with_capacity(list.len());
        for dev in list.iter() {
            let name = device_name(dev);
            // SAFETY: `dev` is an entry of the live device list.
            let guid = u64::from_be(unsafe { ffi::ibv_get_device_guid(dev) });
            let ctx = Context::open_device(dev, &name)?;
            let ports = (1..=ctx.port_count()?)
                .map(|p| ctx.query_port(p))
                .collect::<Result<Vec<_>, _>>()?;
            tracing::debug!(device = %name, ports = ports.len(), "verbs device");
            out.push(Device {
                name,
                node_guid: (guid != 0).then_some(guid),
                ports,
            });
        }
        Ok(out)
    }

    fn events(&self) -> Result<EventStream, RdmaError> {
        let contexts = Context::open_all()?;
        let streams = contexts
            .iter()
            .map(Context::events)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(futures::stream::select_all(streams).boxed())
    }
}

/// The array `ibv_get_device_list` returns; freed on drop.
struct DeviceList {
    list: NonNull<*mut ffi::ibv_device>,
    len: usize,
}

impl DeviceList {
    /// The device list, or [`RdmaError::NoDevices`] when it is empty or the
    /// kernel has no RDMA support.
    fn get() -> Result<Self, RdmaError> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out pointer; a non-null result is owned by
        // the returned `DeviceList` and freed exactly once in its `Drop`.
        let raw = unsafe { ffi::ibv_get_device_list(&mut n) };
        let Some(list) = NonNull::new(raw) else {
            let err = io::Error::last_os_error();
            return match err.raw_os_error() {
                // No uverbs support in the kernel, or no sysfs class for it.
                Some(libc::ENOSYS) | Some(libc::ENOENT) | Some(libc::ENODEV) | None | Some(0) => {
                    tracing::debug!(error = %err, "ibv_get_device_list: no RDMA support");
                    Err(RdmaError::NoDevices)
                }
                _ => Err(RdmaError::Os {
                    op: "ibv_get_device_list",
                    device: "*".into(),
                    source: err,
                }),
            };
        };
        let this = DeviceList {
            list,
            len: usize::try_from(n).unwrap_or(0),
        };
        if this.len == 0 {
            return Err(RdmaError::NoDevices);
        }
        Ok(this)
    }

    fn len(&self) -> usize {
        self.len
    }

    fn iter(&self) -> impl Iterator<Item = *mut ffi::ibv_device> + '_ {
        // SAFETY: libibverbs returned `len` valid entries (plus a NULL
        // terminator) that live until `self` is dropped.
        (0..self.len).map(move |i| unsafe { *self.list.as_ptr().add(i) })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed once.
        // Contexts opened from it stay valid (libibverbs refcounts devices).
        unsafe { ffi::ibv_free_device_list(self.list.as_ptr()) };
    }
}

fn device_name(dev: *mut ffi::ibv_device) -> String {
    // SAFETY: `dev` is a live list entry; the name is a NUL-terminated
    // string inside the device struct, copied before the list is freed.
    let p = unsafe { ffi::ibv_get_device_name(dev) };
    if p.is_null() {
        return String::from("?");
    }
    // SAFETY: non-null, NUL-terminated, valid while the list lives.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// An error from a verbs call that returns an errno value (or -1 and errno).
fn verbs_err(op: &'static str, device: &str, rc: c_int) -> RdmaError {
    let source = if rc > 0 {
        io::Error::from_raw_os_error(rc)
    } else {
        io::Error::last_os_error()
    };
    RdmaError::Os {
        op,
        device: device.into(),
        source,
    }
}

/// An open device (`struct ibv_context`); closed on drop.
pub struct Context {
    ctx: NonNull<ffi::ibv_context>,
    name: String,
    /// An event stream reads the async fd (at most one at a time).
    watched: AtomicBool,
}

// SAFETY: libibverbs contexts are thread-safe (the library locks
// internally); we only hand out the pointer to verbs calls.
unsafe impl Send for Context {}
// SAFETY: as above; `&Context` allows only thread-safe verbs calls.
unsafe impl Sync for Context {}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("name", &self.name).finish()
    }
}

impl Context {
    /// Opens the device called `name`.
    pub fn open(name: &str) -> Result<Arc<Context>, RdmaError> {
        let list = DeviceList::get()?;
        let dev = list
            .iter()
            .find(|d| device_name(*d) == name)
            .ok_or_else(|| RdmaError::NoSuchDevice(name.into()))?;
        Self::open_device(dev, name).map(Arc::new)
    }

    /// Opens every device.
    pub fn open_all() -> Result<Vec<Arc<Context>>, RdmaError> {
        let list = DeviceList::get()?;
        list.iter()
            .map(|d| Self::open_device(d, &device_name(d)).map(Arc::new))
            .collect()
    }

    fn open_device(dev: *mut ffi::ibv_device, name: &str) -> Result<Context, RdmaError> {
        // SAFETY: `dev` is an entry of a live device list; the context is
        // owned by the returned `Context` and closed once in its `Drop`.
        let raw = unsafe { ffi::ibv_open_device(dev) };
        let ctx = NonNull::new(raw).ok_or_else(|| RdmaError::last_os("ibv_open_device", name))?;
        Ok(Context {
            ctx,
            name: name.into(),
            watched: AtomicBool::new(false),
        })
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn port_count(&self) -> Result<u8, RdmaError> {
        // SAFETY: all-zero is a valid `ibv_device_attr` (plain integers).
        let mut attr: ffi::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context, valid out pointer.
        let rc = unsafe { ffi::ibv_query_device(self.ctx.as_ptr(), &mut attr) };
        if rc != 0 {
            return Err(verbs_err("ibv_query_device", &self.name, rc));
        }
        Ok(attr.phys_port_cnt)
    }

    /// Queries one port (1-based): state, link layer, GID 0 and netdev.
    pub fn query_port(&self, num: u8) -> Result<Port, RdmaError> {
        // SAFETY: all-zero is a valid `ibv_port_attr` (plain integers), and
        // the C inline wrapper zeroes it too before the compat call.
        let mut attr: ffi::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context, valid out pointer; `___ibv_query_port` is
        // rdma-sys's port of the C inline `ibv_query_port` (which picks the
        // extended or the compat entry point).
        let rc = unsafe { ffi::___ibv_query_port(self.ctx.as_ptr(), num, &mut attr) };
        if rc != 0 {
            return Err(verbs_err("ibv_query_port", &self.name, rc));
        }
        Ok(Port {
            num,
            state: port_state(attr.state),
            link_layer: link_layer(attr.link_layer),
            gid: self.query_gid(num, 0),
            netdev: port_netdev(&self.name, num),
        })
    }

    /// GID `index` of port `num`, None if it cannot be read.
    pub fn query_gid(&self, num: u8, index: c_int) -> Option<[u8; 16]> {
        let mut gid = ffi::ibv_gid { raw: [0; 16] };
        // SAFETY: live context, valid out pointer.
        let rc = unsafe { ffi::ibv_query_gid(self.ctx.as_ptr(), num, index, &mut gid) };
        if rc != 0 {
            tracing::debug!(device = %self.name, port = num, index, rc, "ibv_query_gid failed");
            return None;
        }
        // SAFETY: every bit pattern is a valid `[u8; 16]`.
        Some(unsafe { gid.raw })
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(self: &Arc<Self>) -> Result<Arc<ProtectionDomain>, RdmaError> {
        // SAFETY: live context; the PD is owned by the returned value and
        // deallocated in its `Drop`, which keeps the context alive.
        let raw = unsafe { ffi::ibv_alloc_pd(self.ctx.as_ptr()) };
        let pd = NonNull::new(raw).ok_or_else(|| RdmaError::last_os("ibv_alloc_pd", &self.name))?;
        Ok(Arc::new(ProtectionDomain {
            raw: pd,
            ctx: Arc::clone(self),
        }))
    }

    /// Creates a completion queue with at least `entries` entries (no
    /// completion channel; poll it).
    pub fn create_cq(self: &Arc<Self>, entries: u32) -> Result<Arc<CompletionQueue>, RdmaError> {
        let cqe = c_int::try_from(entries)
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| RdmaError::InvalidArgument(format!("CQ size {entries}")))?;
        // SAFETY: live context; null context/channel and vector 0 are valid;
        // the CQ is destroyed in `CompletionQueue::drop`.
        let raw = unsafe {
            ffi::ibv_create_cq(
                self.ctx.as_ptr(),
                cqe,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        let cq =
            NonNull::new(raw).ok_or_else(|| RdmaError::last_os("ibv_create_cq", &self.name))?;
        Ok(Arc::new(CompletionQueue {
            raw: cq,
            ctx: Arc::clone(self),
        }))
    }

    /// The async events of this context: port and device events, plus
    /// events of the QPs and CQs created through it. Must be called within a
    /// tokio runtime. If the event fd fails, the stream yields `DeviceFatal`
    /// (the device can no longer be watched) and ends. One stream per
    /// context at a time (events are consumed when read); another call
    /// while one is alive is an `InvalidArgument`.
    pub fn events(self: &Arc<Self>) -> Result<EventStream, RdmaError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(RdmaError::NoRuntime("verbs events"));
        }
        if self.watched.swap(true, Ordering::AcqRel) {
            return Err(RdmaError::InvalidArgument(format!(
                "{}: an event stream already reads this context",
                self.name
            )));
        }
        // From here on, dropping `guard` (or the `AsyncFd` holding it)
        // releases the context for another stream.
        let guard = EventFd(Arc::clone(self));
        let fd = self.async_fd();
        set_nonblocking(fd).map_err(|source| RdmaError::Os {
            op: "fcntl(async_fd, O_NONBLOCK)",
            device: self.name.clone(),
            source,
        })?;
        // SAFETY: the fd is the context's async fd, open until the context
        // is closed; `EventFd` holds an `Arc` of the context, so it stays
        // open (and the same fd) for as long as the `AsyncFd` exists.
        let afd =
            unsafe { AsyncFd::register_with_interest(guard, Interest::READABLE) }.map_err(|e| {
                RdmaError::Os {
                    op: "register async_fd",
                    device: self.name.clone(),
                    source: e.into(),
                }
            })?;
        tracing::debug!(device = %self.name, fd, "watching verbs async events");
        let stream = futures::stream::unfold(Some(afd), |state| async move {
            let afd = state?;
            let device = afd.get_ref().0.name.clone();
            loop {
                let result = match afd.readable().await {
                    Ok(mut guard) => match guard.try_io(|a| a.get_ref().0.get_async_event()) {
                        Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Ok(r) => r,
                        Err(_would_block) => continue,
                    },
                    Err(e) => Err(e),
                };
                return Some(match result {
                    Ok(kind) => {
                        tracing::debug!(device = %device, kind = ?kind, "verbs async event");
                        (AsyncEvent { device, kind }, Some(afd))
                    }
                    Err(error) => {
                        tracing::error!(device = %device, %error, "verbs async event fd failed; reporting the device as fatal");
                        let kind = AsyncEventKind::DeviceFatal;
                        (AsyncEvent { device, kind }, None)
                    }
                });
            }
        });
        Ok(stream.boxed())
    }

    fn async_fd(&self) -> RawFd {
        // SAFETY: live context; `async_fd` is a plain field set at open.
        unsafe { (*self.ctx.as_ptr()).async_fd }
    }

    /// Reads and acknowledges one async event (`WouldBlock` when none).
    fn get_async_event(&self) -> io::Result<AsyncEventKind> {
        let mut ev = MaybeUninit::<ffi::ibv_async_event>::uninit();
        let p = ev.as_mut_ptr();
        // SAFETY: live context, valid out pointer to uninitialised memory
        // that libibverbs fills on success.
        if unsafe { ffi::ibv_get_async_event(self.ctx.as_ptr(), p) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the event was filled in. `event_type` is read as the raw
        // u32 the C enum is, never as rdma-sys's Rust enum (a code that enum
        // lacks would be undefined behaviour). The union `element` is read
        // only as the member the code selects; both sit at offset 0.
        let code = unsafe { addr_of!((*p).event_type).cast::<u32>().read() };
        let (port, qp_num) = match element_of(code) {
            Element::Port => {
                // SAFETY: port events carry `element.port_num` (a c_int).
                let port = unsafe { addr_of!((*p).element).cast::<c_int>().read() };
                (port, 0)
            }
            Element::Qp => {
                // SAFETY: QP events carry `element.qp`; the QP cannot be
                // destroyed before this event is acknowledged, below.
                let qp = unsafe { addr_of!((*p).element).cast::<*mut ffi::ibv_qp>().read() };
                // SAFETY: non-null `qp` points to a live QP (see above).
                let num = if qp.is_null() {
                    0
                } else {
                    unsafe { (*qp).qp_num }
                };
                (0, num)
            }
            Element::Other => (0, 0),
        };
        // SAFETY: acknowledges the event just read, exactly once.
        unsafe { ffi::ibv_ack_async_event(p) };
        let kind = event_kind(code, port, qp_num);
        if let AsyncEventKind::Other { .. } = kind {
            tracing::debug!(device = %self.name, code, port, "verbs async event without a model kind");
        }
        Ok(kind)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every child resource holds an `Arc<Context>`, so none is
        // left; the context is closed exactly once.
        let rc = unsafe { ffi::ibv_close_device(self.ctx.as_ptr()) };
        if rc != 0 {
            tracing::warn!(device = %self.name, rc, "ibv_close_device failed");
        }
    }
}

/// The async event fd of a context, for [`AsyncFd`]: keeps the context
/// open and marks it watched until dropped.
struct EventFd(Arc<Context>);

impl Drop for EventFd {
    fn drop(&mut self) {
        self.0.watched.store(false, Ordering::Release);
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.async_fd()
    }
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on an fd the context owns; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Which member of `ibv_async_event.element` a code uses.
#[derive(Debug, PartialEq, Eq)]
enum Element {
    Port,
    Qp,
    Other,
}

mod code {
    use rdma_sys::ibv_event_type as t;
    pub const CQ_ERR: u32 = t::IBV_EVENT_CQ_ERR as u32;
    pub const QP_FATAL: u32 = t::IBV_EVENT_QP_FATAL as u32;
    pub const QP_REQ_ERR: u32 = t::IBV_EVENT_QP_REQ_ERR as u32;
    pub const QP_ACCESS_ERR: u32 = t::IBV_EVENT_QP_ACCESS_ERR as u32;
    pub const COMM_EST: u32 = t::IBV_EVENT_COMM_EST as u32;
    pub const SQ_DRAINED: u32 = t::IBV_EVENT_SQ_DRAINED as u32;
    pub const PATH_MIG: u32 = t::IBV_EVENT_PATH_MIG as u32;
    pub const PATH_MIG_ERR: u32 = t::IBV_EVENT_PATH_MIG_ERR as u32;
    pub const DEVICE_FATAL: u32 = t::IBV_EVENT_DEVICE_FATAL as u32;
    pub const PORT_ACTIVE: u32 = t::IBV_EVENT_PORT_ACTIVE as u32;
    pub const PORT_ERR: u32 = t::IBV_EVENT_PORT_ERR as u32;
    pub const LID_CHANGE: u32 = t::IBV_EVENT_LID_CHANGE as u32;
    pub const PKEY_CHANGE: u32 = t::IBV_EVENT_PKEY_CHANGE as u32;
    pub const SM_CHANGE: u32 = t::IBV_EVENT_SM_CHANGE as u32;
    pub const QP_LAST_WQE_REACHED: u32 = t::IBV_EVENT_QP_LAST_WQE_REACHED as u32;
    pub const CLIENT_REREGISTER: u32 = t::IBV_EVENT_CLIENT_REREGISTER as u32;
    pub const GID_CHANGE: u32 = t::IBV_EVENT_GID_CHANGE as u32;
}

fn element_of(code: u32) -> Element {
    match code {
        code::PORT_ACTIVE
        | code::PORT_ERR
        | code::LID_CHANGE
        | code::PKEY_CHANGE
        | code::SM_CHANGE
        | code::CLIENT_REREGISTER
        | code::GID_CHANGE => Element::Port,
        code::QP_FATAL
        | code::QP_REQ_ERR
        | code::QP_ACCESS_ERR
        | code::COMM_EST
        | code::SQ_DRAINED
        | code::PATH_MIG
        | code::PATH_MIG_ERR
        | code::QP_LAST_WQE_REACHED => Element::Qp,
        _ => Element::Other,
    }
}

/// Maps a raw event code (with the port or QP number it carries) to the
/// model; unknown codes and out-of-range ports become `Other`.
fn event_kind(code: u32, port: c_int, qp_num: u32) -> AsyncEventKind {
    let port = u8::try_from(port).ok().filter(|p| *p != 0);
    match (code, port) {
        (code::PORT_ACTIVE, Some(port)) => AsyncEventKind::PortActive { port },
        (code::PORT_ERR, Some(port)) => AsyncEventKind::PortError { port },
        (code::LID_CHANGE, Some(port)) => AsyncEventKind::LidChange { port },
        (code::GID_CHANGE, Some(port)) => AsyncEventKind::GidChange { port },
        (code::DEVICE_FATAL, _) => AsyncEventKind::DeviceFatal,
        (code::QP_FATAL, _) => AsyncEventKind::QpFatal { qp_num },
        (code::QP_REQ_ERR, _) => AsyncEventKind::QpRequestError { qp_num },
        (code::QP_ACCESS_ERR, _) => AsyncEventKind::QpAccessError { qp_num },
        (code::CQ_ERR, _) => AsyncEventKind::CqError,
        (code, _) => AsyncEventKind::Other { code },
    }
}

fn port_state(raw: ffi::ibv_port_state::Type) -> PortState {
    use ffi::ibv_port_state as s;
    match raw {
        s::IBV_PORT_DOWN => PortState::Down,
        s::IBV_PORT_INIT => PortState::Init,
        s::IBV_PORT_ARMED => PortState::Armed,
        s::IBV_PORT_ACTIVE => PortState::Active,
        s::IBV_PORT_ACTIVE_DEFER => PortState::ActiveDefer,
        other => PortState::Unknown(other),
    }
}

/// `IBV_LINK_LAYER_*`; unspecified (0) means InfiniBand, as in libibverbs.
fn link_layer(raw: u8) -> LinkLayer {
    match raw {
        0 | 1 => LinkLayer::InfiniBand,
        2 => LinkLayer::Ethernet,
        other => LinkLayer::Unknown(other),
    }
}

/// The netdev behind GID 0 of a port (RoCE), from sysfs; None for IB ports.
fn port_netdev(device: &str, port: u8) -> Option<String> {
    let path = format!("/sys/class/infiniband/{device}/ports/{port}/gid_attrs/ndevs/0");
    let s = std::fs::read_to_string(path).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

/// A verbs object that belongs to one context: its handle and the context
/// it keeps open. Only thread-safe verbs calls reach the handle, so the
/// object is `Send + Sync`; it is released exactly once, on drop, after
/// every object that depends on it (each of those holds an `Arc` of it).
macro_rules! context_object {
    ($(#[$doc:meta])* $name:ident($raw:ident), released by $release:ident) => {
        $(#[$doc])*
        pub struct $name {
            raw: NonNull<ffi::$raw>,
            ctx: Arc<Context>,
        }

        // SAFETY: the handle is used only through thread-safe verbs calls.
        unsafe impl Send for $name {}
        // SAFETY: as above; `&self` reaches no mutable state of ours.
        unsafe impl Sync for $name {}

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("device", &self.ctx.name)
                    .finish()
            }
        }

        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: a live handle, released once; every object using
                // it holds an `Arc` of this one, so none is left.
                let rc = unsafe { ffi::$release(self.raw.as_ptr()) };
                if rc != 0 {
                    tracing::warn!(
                        device = %self.ctx.name,
                        rc,
                        call = stringify!($release),
                        "releasing a verbs object failed"
                    );
                }
            }
        }
    };
}

context_object! {
    /// A protection domain; deallocated on drop.
    ProtectionDomain(ibv_pd), released by ibv_dealloc_pd
}

context_object! {
    /// A completion queue (polled, no completion channel); destroyed on drop.
    CompletionQueue(ibv_cq), released by ibv_destroy_cq
}

/// Memory access rights of a [`MemoryRegion`] (`IBV_ACCESS_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Access(u32);

impl Access {
    pub const LOCAL_WRITE: Access = Access(ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0);
    pub const REMOTE_WRITE: Access = Access(ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0);
    pub const REMOTE_READ: Access = Access(ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0);
    pub const REMOTE_ATOMIC: Access = Access(ffi::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0);

    /// The raw flag bits.
    pub fn bits(self) -> u32 {
        self.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl ProtectionDomain {
    /// The context this PD belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Allocates a zeroed buffer of `len` bytes and registers it.
    pub fn register(
        self: &Arc<Self>,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, RdmaError> {
        if len == 0 {
            return Err(RdmaError::InvalidArgument(
                "cannot register an empty buffer".into(),
            ));
        }
        let access_bits = c_int::try_from(access.0)
            .map_err(|_| RdmaError::InvalidArgument(format!("access flags {:#x}", access.0)))?;
        let mut buf = vec![0u8; len].into_boxed_slice();
        // SAFETY: live PD; `buf` is a heap allocation that never moves and
        // outlives the registration (`MemoryRegion::drop` deregisters before
        // the buffer is freed). No IBV_ACCESS_OPTIONAL_RANGE, so the plain
        // entry point is what the C `ibv_reg_mr` macro would call.
        let raw = unsafe {
            ffi::ibv_reg_mr(self.raw.as_ptr(), buf.as_mut_ptr().cast(), len, access_bits)
        };
        let mr =
            NonNull::new(raw).ok_or_else(|| RdmaError::last_os("ibv_reg_mr", &self.ctx.name))?;
        Ok(MemoryRegion {
            mr,
            buf,
            pd: Arc::clone(self),
        })
    }

    /// Creates a reliable-connected (RC) queue pair. The CQs must belong to
    /// the same context as the PD.
    pub fn create_rc_qp(
        self: &Arc<Self>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        caps: QpCaps,
    ) -> Result<QueuePair, RdmaError> {
        if !Arc::ptr_eq(&send_cq.ctx, &self.ctx) || !Arc::ptr_eq(&recv_cq.ctx, &self.ctx) {
            return Err(RdmaError::InvalidArgument(
                "QP, PD and CQs must belong to the same context".into(),
            ));
        }
        // SAFETY: all-zero is valid for `ibv_qp_init_attr` (null pointers,
        // zero integers); the fields that matter are set below.
        let mut init: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = send_cq.raw.as_ptr();
        init.recv_cq = recv_cq.raw.as_ptr();
        init.qp_type = ffi::ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = 0;
        init.cap = ffi::ibv_qp_cap {
            max_send_wr: caps.max_send_wr,
            max_recv_wr: caps.max_recv_wr,
            max_send_sge: caps.max_send_sge,
            max_recv_sge: caps.max_recv_sge,
            max_inline_data: caps.max_inline_data,
        };
        // SAFETY: live PD and CQs of the same context (checked above), a
        // valid init attr; the QP is destroyed in `QueuePair::drop`, which
        // keeps the PD and CQs alive until then.
        let raw = unsafe { ffi::ibv_create_qp(self.raw.as_ptr(), &mut init) };
        let qp =
            NonNull::new(raw).ok_or_else(|| RdmaError::last_os("ibv_create_qp", &self.ctx.name))?;
        let qp = QueuePair {
            qp,
            caps: QpCaps {
                max_send_wr: init.cap.max_send_wr,
                max_recv_wr: init.cap.max_recv_wr,
                max_send_sge: init.cap.max_send_sge,
                max_recv_sge: init.cap.max_recv_sge,
                max_inline_data: init.cap.max_inline_data,
            },
            _pd: Arc::clone(self),
            _send_cq: Arc::clone(send_cq),
            _recv_cq: Arc::clone(recv_cq),
        };
        tracing::debug!(device = %self.ctx.name, qp_num = qp.qp_num(), "created RC QP");
        Ok(qp)
    }
}

/// A registered buffer; deregistered (then freed) on drop.
pub struct MemoryRegion {
    mr: NonNull<ffi::ibv_mr>,
    buf: Box<[u8]>,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: the MR handle is used only through thread-safe verbs calls; the
// buffer is ordinary owned memory.
unsafe impl Send for MemoryRegion {}
// SAFETY: shared access gives only `&[u8]` and the keys.
unsafe impl Sync for MemoryRegion {}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("device", &self.pd.ctx.name)
            .field("len", &self.buf.len())
            .field("lkey", &self.lkey())
            .field("rkey", &self.rkey())
            .finish()
    }
}

impl MemoryRegion {
    pub fn lkey(&self) -> u32 {
        // SAFETY: live MR; plain field.
        unsafe { (*self.mr.as_ptr()).lkey }
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: live MR; plain field.
        unsafe { (*self.mr.as_ptr()).rkey }
    }

    /// The buffer's address as a peer uses it in RDMA operations.
    pub fn addr(&self) -> u64 {
        self.buf.as_ptr() as u64
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The buffer. Only meaningful while no RDMA operation on it is in flight.
    pub fn as_slice(&self) -> &[u8] {
        &self.buf
    }

    /// The buffer, mutably. Only meaningful while no RDMA operation on it
    /// is in flight.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.buf
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: live MR, deregistered once, before `buf` is freed (fields
        // drop after this body).
        let rc = unsafe { ffi::ibv_dereg_mr(self.mr.as_ptr()) };
        if rc != 0 {
            // The NIC may still reach the buffer: leak it rather than free
            // memory that could be written into.
            tracing::error!(device = %self.pd.ctx.name, rc, "ibv_dereg_mr failed; leaking the buffer");
            std::mem::forget(std::mem::take(&mut self.buf));
        }
    }
}

/// Queue pair capacities (requested, or as granted by the device).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        }
    }
}

/// An RC queue pair (in the RESET state); destroyed on drop.
pub struct QueuePair {
    qp: NonNull<ffi::ibv_qp>,
    caps: QpCaps,
    _pd: Arc<ProtectionDomain>,
    _send_cq: Arc<CompletionQueue>,
    _recv_cq: Arc<CompletionQueue>,
}

// SAFETY: QPs are used only through thread-safe verbs calls.
unsafe impl Send for QueuePair {}
// SAFETY: shared access reads only immutable fields.
unsafe impl Sync for QueuePair {}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair")
            .field("qp_num", &self.qp_num())
            .field("caps", &self.caps)
            .finish()
    }
}

impl QueuePair {
    /// The QP number peers address.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: live QP; `qp_num` is set at creation and never changes.
        unsafe { (*self.qp.as_ptr()).qp_num }
    }

    /// The capacities the device granted.
    pub fn caps(&self) -> QpCaps {
        self.caps
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: live QP, destroyed once; PD and CQs outlive it (fields
        // drop after this body).
        let rc = unsafe { ffi::ibv_destroy_qp(self.qp.as_ptr()) };
        if rc != 0 {
            tracing::warn!(qp_num = self.qp_num(), rc, "ibv_destroy_qp failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_codes_map_to_the_model() {
        assert_eq!(
            event_kind(code::PORT_ACTIVE, 1, 0),
            AsyncEventKind::PortActive { port: 1 }
        );
        assert_eq!(
            event_kind(code::PORT_ERR, 2, 0),
            AsyncEventKind::PortError { port: 2 }
        );
        assert_eq!(
            event_kind(code::LID_CHANGE, 1, 0),
            AsyncEventKind::LidChange { port: 1 }
        );
        assert_eq!(
            event_kind(code::GID_CHANGE, 1, 0),
            AsyncEventKind::GidChange { port: 1 }
        );
        assert_eq!(
            event_kind(code::DEVICE_FATAL, 0, 0),
            AsyncEventKind::DeviceFatal
        );
        assert_eq!(
            event_kind(code::QP_FATAL, 0, 42),
            AsyncEventKind::QpFatal { qp_num: 42 }
        );
        assert_eq!(
            event_kind(code::QP_REQ_ERR, 0, 7),
            AsyncEventKind::QpRequestError { qp_num: 7 }
        );
        assert_eq!(
            event_kind(code::QP_ACCESS_ERR, 0, 7),
            AsyncEventKind::QpAccessError { qp_num: 7 }
        );
        assert_eq!(event_kind(code::CQ_ERR, 0, 0), AsyncEventKind::CqError);
        assert_eq!(
            event_kind(code::SM_CHANGE, 1, 0),
            AsyncEventKind::Other {
                code: code::SM_CHANGE
            }
        );
        // Codes newer than the bindings, and ports out of range.
        assert_eq!(event_kind(4242, 1, 0), AsyncEventKind::Other { code: 4242 });
        assert_eq!(
            event_kind(code::PORT_ERR, 300, 0),
            AsyncEventKind::Other {
                code: code::PORT_ERR
            }
        );
        assert_eq!(
            event_kind(code::PORT_ACTIVE, 0, 0),
            AsyncEventKind::Other {
                code: code::PORT_ACTIVE
            }
        );
    }

    #[test]
    fn codes_select_the_right_union_member() {
        assert_eq!(element_of(code::PORT_ERR), Element::Port);
        assert_eq!(element_of(code::CLIENT_REREGISTER), Element::Port);
        assert_eq!(element_of(code::QP_FATAL), Element::Qp);
        assert_eq!(element_of(code::COMM_EST), Element::Qp);
        assert_eq!(element_of(code::CQ_ERR), Element::Other);
        assert_eq!(element_of(code::DEVICE_FATAL), Element::Other);
        assert_eq!(element_of(9999), Element::Other);
    }

    #[test]
    fn port_attributes_map_to_the_model() {
        use ffi::ibv_port_state as s;
        assert_eq!(port_state(s::IBV_PORT_ACTIVE), PortState::Active);
        assert_eq!(port_state(s::IBV_PORT_DOWN), PortState::Down);
        assert_eq!(port_state(s::IBV_PORT_NOP), PortState::Unknown(0));
        assert_eq!(port_state(77), PortState::Unknown(77));
        assert_eq!(link_layer(0), LinkLayer::InfiniBand);
        assert_eq!(link_layer(1), LinkLayer::InfiniBand);
        assert_eq!(link_layer(2), LinkLayer::Ethernet);
        assert_eq!(link_layer(9), LinkLayer::Unknown(9));
    }

    #[test]
    fn raw_event_type_is_a_u32_at_the_expected_offset() {
        // The u32 read in `get_async_event` relies on this layout.
        assert_eq!(std::mem::size_of::<ffi::ibv_event_type>(), 4);
        assert_eq!(std::mem::size_of::<ffi::ibv_async_event>(), 16);
    }
}
