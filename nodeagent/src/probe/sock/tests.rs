//! Unit tests of `probe::sock`.

use super::*;

#[test]
fn the_receive_buffer_holds_the_error_queue_too() {
    let s = TsSocket::open("lo", Ipv4Addr::LOCALHOST, 0, TsMode::Software).unwrap();
    let mut got: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a valid fd and an int-sized out buffer.
    let rc = unsafe {
        libc::getsockopt(
            s.fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&mut got as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0);
    // The kernel reports twice what was set; without root the setting
    // is capped by net.core.rmem_max.
    // SAFETY: geteuid(2) has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        assert!(got >= 2 * RCVBUF_BYTES, "receive buffer {got} bytes");
    } else {
        assert!(got > 0);
    }
}
