//! A QMP client speaking the wire format by hand (shared by the QMP tests).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

/// A QMP client speaking the wire format by hand (nothing hides what goes over it).
pub struct Qmp {
    /// The socket, for a test that writes bytes of its own.
    pub writer: UnixStream,
    reader: BufReader<UnixStream>,
    /// The events read so far, in order.
    pub events: Vec<Value>,
}

impl Qmp {
    /// Connects and reads the greeting; negotiates unless `raw`.
    pub fn connect(path: &Path, raw: bool) -> (Qmp, Value) {
        let stream = UnixStream::connect(path).expect("connect to the monitor");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut q = Qmp {
            writer: stream.try_clone().unwrap(),
            reader: BufReader::new(stream),
            events: Vec::new(),
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
            } else {
                return v;
            }
        }
    }

    pub fn call(&mut self, command: &str, arguments: Value) -> Value {
        let message = json!({"execute": command, "arguments": arguments});
        self.send(format!("{message}\n").as_bytes())
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
