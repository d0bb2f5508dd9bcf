//! The rendezvous store's wire protocol from arbitrary bytes: a client that
//! sends anything (before, during or instead of the handshake) to a live
//! store. The server must drop it or answer it, keep serving its members,
//! and never count it as a rank.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::OnceLock;
use std::time::Duration;

use polychip_comm::auth::JobAuth;
use polychip_comm::env::RankInfo;
use polychip_comm::store::Store;
use polychip_comm::tcp_store::TcpStore;

fn store() -> &'static TcpStore {
    static STORE: OnceLock<TcpStore> = OnceLock::new();
    STORE.get_or_init(|| {
        let mut info = RankInfo::single();
        info.world_size = 2;
        let auth = JobAuth::new("fuzzing the store wire", "fuzz").unwrap();
        TcpStore::connect_with(&info, &auth, Duration::from_secs(10)).unwrap()
    })
}

/// One input.
pub fn run(data: &[u8]) {
    let s = store();
    let Ok(mut c) = TcpStream::connect(("127.0.0.1", s.port())) else {
        return;
    };
    let _ = c.set_read_timeout(Some(Duration::from_millis(20)));
    let _ = c.write_all(data);
    let mut buf = [0u8; 256];
    let _ = c.read(&mut buf);
    drop(c);
    // The store still answers its own rank.
    s.set("fuzz/alive", b"1").unwrap();
    assert_eq!(s.get("fuzz/alive", Duration::from_secs(5)).unwrap(), b"1");
}
