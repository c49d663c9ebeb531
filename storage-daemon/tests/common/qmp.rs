//! A QMP client speaking the wire format by hand, and a daemon started with a monitor from a
//! qemu-storage-daemon command line (shared by the QMP tests).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use aio_test_support::launch::{Daemon as Launched, Launch};

use serde_json::{json, Value};

/// A QMP client speaking the wire format by hand (nothing hides what goes over it).
pub struct Qmp {
    /// The socket, for a test that writes bytes of its own.
    pub writer: UnixStream,
    reader: BufReader<UnixStream>,
    /// The events read so far, in order.
    pub events: Vec<Value>,
    /// Greetings read after the first, set aside as events are: qemu-storage-daemon 10.0.2
    /// once sent its greeting twice on one connection (seen in a CI run of the resize test),
    /// and a reply must not be taken for it. Ours must send one: its test checks this is 0.
    pub repeated_greetings: usize,
}

impl Qmp {
    /// Connects and reads the greeting; negotiates unless `raw`.
    pub fn connect(path: &Path, raw: bool) -> (Qmp, Value) {
        let stream = UnixStream::connect(path).expect("connect to the monitor");
        Qmp::over(stream, raw)
    }

    /// Reads the greeting on a connection made otherwise (the daemon connected to a socket
    /// the test listens on); negotiates unless `raw`.
    pub fn over(stream: UnixStream, raw: bool) -> (Qmp, Value) {
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut q = Qmp {
            writer: stream.try_clone().unwrap(),
            reader: BufReader::new(stream),
            events: Vec::new(),
            repeated_greetings: 0,
        };
        let greeting = q.line().expect("a greeting");
        if !raw {
            assert_eq!(q.call("qmp_capabilities", json!({})), json!({"return": {}}));
        }
        (q, greeting)
    }

    pub fn line(&mut self) -> Option<Value> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(serde_json::from_str(&line).expect("the daemon sends JSON")),
        }
    }

    /// Reads until an event that `matches` has come (kept with the others in `events`);
    /// returns it. Panics when the connection ends first (the read times out after 20 s).
    pub fn wait_event(&mut self, matches: impl Fn(&Value) -> bool) -> Value {
        if let Some(e) = self.events.iter().find(|e| matches(e)) {
            return e.clone();
        }
        loop {
            let v = self
                .line()
                .unwrap_or_else(|| panic!("the awaited event never came: {:?}", self.events));
            assert!(v.get("event").is_some(), "not an event: {v}");
            self.events.push(v.clone());
            if matches(&v) {
                return v;
            }
        }
    }

    /// Sends `bytes` and reads the next reply (events kept aside).
    pub fn send(&mut self, bytes: &[u8]) -> Value {
        self.writer.write_all(bytes).unwrap();
        self.reply()
    }

    pub fn reply(&mut self) -> Value {
        loop {
            let v = self.line().expect("a reply");
            if v.get("event").is_some() {
                self.events.push(v);
            } else if v.get("QMP").is_some() {
                self.repeated_greetings += 1;
            } else {
                return v;
            }
        }
    }

    pub fn call(&mut self, command: &str, arguments: Value) -> Value {
        let message = json!({"execute": command, "arguments": arguments});
        self.send(format!("{message}\n").as_bytes())
    }

    /// `call`, retried while it is refused with "still in use": a client that has just
    /// hung up (a `qemu-img` that exited, a dropped vhost-user connection) is noticed by
    /// the daemon's own thread, after the client's side is already gone, in QEMU too.
    /// Gives up after 20 s and returns the last reply.
    pub fn call_once_clients_gone(&mut self, command: &str, arguments: Value) -> Value {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let reply = self.call(command, arguments.clone());
            let in_use = reply["error"]["desc"]
                .as_str()
                .is_some_and(|d| d.contains("still in use"));
            if !in_use || std::time::Instant::now() > deadline {
                return reply;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// [`Qmp::call_once_clients_gone`], which must succeed; its `return`.
    pub fn ok_once_clients_gone(&mut self, command: &str, arguments: Value) -> Value {
        let reply = self.call_once_clients_gone(command, arguments.clone());
        match reply.get("return") {
            Some(r) => r.clone(),
            None => panic!("{command} {arguments}: {reply}"),
        }
    }

    /// `call`, which must succeed; its `return`.
    pub fn ok(&mut self, command: &str, arguments: Value) -> Value {
        let reply = self.call(command, arguments.clone());
        match reply.get("return") {
            Some(r) => r.clone(),
            None => panic!("{command} {arguments}: {reply}"),
        }
    }

    /// `call`, which must fail; its error class and text.
    pub fn error(&mut self, command: &str, arguments: Value) -> (String, String) {
        let reply = self.call(command, arguments.clone());
        let e = reply
            .get("error")
            .unwrap_or_else(|| panic!("{command} {arguments} succeeded: {reply}"));
        (
            e["class"].as_str().unwrap().to_string(),
            e["desc"].as_str().unwrap().to_string(),
        )
    }
}

/// Starts `program` with a raw image exported on an iothread, and a monitor.
pub fn start(program: &str, dir: &Path, raw: &Path) -> (Launched, PathBuf, PathBuf) {
    let (disk, monitor) = (dir.join("disk.sock"), dir.join("qmp.sock"));
    let args = [
        "--object".to_string(),
        "iothread,id=io0,poll-max-ns=16384".to_string(),
        "--blockdev".to_string(),
        format!(
            "driver=file,node-name=file0,filename={},cache.direct=on,aio=threads",
            raw.display()
        ),
        "--export".to_string(),
        format!(
            "type=vhost-user-blk,id=exp0,node-name=file0,addr.type=unix,addr.path={},\
             writable=on,iothread=io0",
            disk.display()
        ),
        "--chardev".to_string(),
        format!("socket,id=m0,path={},server=on,wait=off", monitor.display()),
        "--monitor".to_string(),
        "chardev=m0".to_string(),
    ];
    let daemon = Launch::new(program)
        .args(args)
        .label(program)
        .log_to(dir.join("log"))
        .socket(disk.clone())
        .socket(monitor.clone())
        .socket_wait(Duration::from_secs(20))
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    (daemon, disk, monitor)
}

/// Writes a block through the disk at `socket` and reads it back.
pub fn disk_works(socket: &Path) {
    let mut c = crate::common::connect(socket, 1, 4096).unwrap();
    c.fill_buf(0, 4096, 0x3c);
    c.write(0, 8192, 0, 4096, 1);
    assert_eq!(c.wait(0, 1), [(1, 0)]);
    c.fill_buf(0, 4096, 0);
    c.read(0, 8192, 0, 4096, 2);
    assert_eq!(c.wait(0, 1), [(2, 0)]);
    assert!(c.read_buf(0, 4096).iter().all(|&b| b == 0x3c));
}
