//! The iothread objects over QMP: `query-iothreads`, `qom-get` / `qom-set` of their polling,
//! `object-add` / `object-del` while the daemon runs.
//!
//! This module owns what those commands answer and change; starting and stopping a thread
//! is the daemon's [`IoThreadSet`](crate::daemon::IoThreadSet).
//!
//! * `object-add` takes the graph's object types (QEMU's text for any other type): an
//!   `iothread` (`poll-max-ns`, `poll-grow`, `poll-shrink`) an export added later may name,
//!   `tls-creds-x509` for `nbd-server-start`.
//! * `object-del` refuses an iothread a live export names; otherwise its thread stops (and
//!   is waited for) before the reply.

use serde_json::{json, Value};

use super::commands::{Command, State};
use super::wire::{Args, ErrorClass, QmpError};
use crate::blockdev::keyval::Opts;
use crate::blockdev::object::{Object, ObjectType};

/// The iothread objects' commands (and `object-add` / `-del` of every object type).
pub(super) const COMMANDS: &[Command] = &[
    Command {
        name: "query-iothreads",
        run: |state, _, args| args.finish().map(|()| state.query_iothreads()),
    },
    Command {
        name: "qom-get",
        run: |state, _, args| state.qom_get(args),
    },
    Command {
        name: "qom-set",
        run: |state, _, args| state.qom_set(args),
    },
    Command {
        name: "object-add",
        run: |state, _, args| state.object_add(args),
    },
    Command {
        name: "object-del",
        run: |state, _, args| state.object_del(args),
    },
];

/// The calling thread's id (what QEMU reports as an iothread's `thread-id`).
pub(super) fn gettid() -> i64 {
    // SAFETY: gettid takes no argument and cannot fail.
    i64::from(unsafe { libc::gettid() })
}

impl State {
    fn query_iothreads(&self) -> Value {
        Value::Array(
            self.graph
                .objects
                .iter()
                .map(|t| {
                    json!({
                        "id": t.id,
                        "thread-id": self.thread_ids.get(t.thread).copied().unwrap_or(0),
                        "poll-max-ns": t.poll.max_ns,
                        "poll-grow": t.poll.grow,
                        "poll-shrink": t.poll.shrink,
                        "aio-max-batch": 0,
                    })
                })
                .collect(),
        )
    }

    /// The iothread object at QOM path `/objects/ID`, by its place in the list.
    fn object_at(&self, path: &str) -> Result<usize, QmpError> {
        path.strip_prefix("/objects/")
            .and_then(|id| self.graph.objects.iter().position(|t| t.id == id))
            .ok_or_else(|| QmpError {
                class: ErrorClass::DeviceNotFound,
                desc: format!("Device '{path}' not found"),
            })
    }

    fn qom_get(&self, mut args: Args) -> Result<Value, QmpError> {
        let path = args.str("path")?;
        let property = args.str("property")?;
        args.finish()?;
        let poll = self.graph.objects[self.object_at(&path)?].poll;
        match property.as_str() {
            "poll-max-ns" => Ok(json!(poll.max_ns)),
            "poll-grow" => Ok(json!(poll.grow)),
            "poll-shrink" => Ok(json!(poll.shrink)),
            "aio-max-batch" => Ok(json!(0)),
            _ => Err(QmpError::generic(format!(
                "Property 'iothread.{property}' not found"
            ))),
        }
    }

    fn qom_set(&mut self, mut args: Args) -> Result<Value, QmpError> {
        let path = args.str("path")?;
        let property = args.str("property")?;
        let value = args.value("value")?;
        args.finish()?;
        let k = self.object_at(&path)?;
        let number = value
            .as_u64()
            .ok_or_else(|| QmpError::generic(format!("Parameter '{property}' expects uint64")))?;
        let mut poll = self.graph.objects[k].poll;
        match property.as_str() {
            "poll-max-ns" => poll.max_ns = number,
            "poll-grow" => poll.grow = number,
            "poll-shrink" => poll.shrink = number,
            _ => {
                return Err(QmpError::generic(format!(
                    "Property 'iothread.{property}' not found"
                )))
            }
        }
        let thread = self.graph.objects[k].thread;
        self.iothreads.handles()[thread].set_poll_params(poll)?;
        self.graph.objects[k].poll = poll;
        Ok(json!({}))
    }

    /// `object-add` of a type in the graph's object table (QEMU's text for any other type);
    /// an iothread is started, credentials are kept for a later `nbd-server-start`.
    fn object_add(&mut self, args: Args) -> Result<Value, QmpError> {
        match args.0.get("qom-type") {
            Some(Value::String(k)) if ObjectType::find(k).is_some() => {}
            Some(Value::String(k)) => {
                return Err(QmpError::generic(format!("invalid object type: {k}")))
            }
            Some(_) => {
                return Err(QmpError::generic(
                    "Invalid parameter type for 'qom-type', expected: string",
                ))
            }
            None => return Err(QmpError::generic("Parameter 'qom-type' is missing")),
        }
        if let Some(Value::String(id)) = args.0.get("id") {
            if self.graph.objects.iter().any(|t| &t.id == id) {
                return Err(QmpError::generic(format!(
                    "attempt to add duplicate property '{id}' to object (type 'container')"
                )));
            }
        }
        let opts = Opts::from_json("object-add", &args.0)?;
        let mut graph = self.graph.clone();
        let added = graph.object(opts)?;
        if let Object::IoThread(t) = added {
            let thread = self.iothreads.add(t.poll)?;
            graph.objects.last_mut().expect("just added").thread = thread;
            let tid = self.iothreads.handles()[thread]
                .call(|_, _| gettid())
                .unwrap_or(0);
            if self.thread_ids.len() <= thread {
                self.thread_ids.resize(thread + 1, 0);
            }
            self.thread_ids[thread] = tid;
        }
        self.graph = graph;
        Ok(json!({}))
    }

    /// `object-del id=...` of an iothread no live export names.
    fn object_del(&mut self, mut args: Args) -> Result<Value, QmpError> {
        let id = args.str("id")?;
        args.finish()?;
        let Some(k) = self.graph.objects.iter().position(|t| t.id == id) else {
            return Err(QmpError::generic(format!("object '{id}' not found")));
        };
        let in_use = self
            .graph
            .exports
            .iter()
            .any(|e| e.disk.is_some() && e.iothread.as_deref() == Some(id.as_str()));
        if in_use {
            return Err(QmpError::generic(format!(
                "object '{id}' is in use, can not be deleted"
            )));
        }
        let removed = self.graph.objects.remove(k);
        self.iothreads.remove(removed.thread)?;
        Ok(json!({}))
    }
}
