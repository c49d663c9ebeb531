//! QMP's wire format, as QEMU speaks it: a stream of JSON objects each way; the greeting;
//! `{"execute": ..., "arguments": {...}, "id": ...}` answered by `{"return": ...}` or
//! `{"error": {"class": ..., "desc": ...}}` with the `id` echoed; events with a timestamp.
//!
//! This module owns the splitting of a client's bytes into messages, the checks of a
//! message's shape and of a command's arguments (with QEMU's error texts), and the shape of
//! what goes back; what a command does is `commands`'.

use serde_json::{json, Map, Value};

/// The longest message a client may send: a larger one is an error and ends the connection
/// (QEMU's parser has limits of the same kind).
pub(crate) const MAX_MESSAGE: usize = 1 << 20;

/// QEMU's error classes (`ErrorClass` in its schema).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorClass {
    /// Everything without a class of its own.
    GenericError,
    /// An unknown command, or one not allowed yet (before capabilities negotiation).
    CommandNotFound,
    /// A device that does not exist.
    DeviceNotFound,
    /// A block job that does not exist (`block-job-*` verbs).
    DeviceNotActive,
}

/// A command's failure: its class and QEMU's kind of text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QmpError {
    pub(crate) class: ErrorClass,
    pub(crate) desc: String,
}

/// An error of a layer under QMP (the graph's, the daemon's, the system's) is a
/// `GenericError` with its text, as QEMU's `error_setg` makes one.
impl<E: std::error::Error> From<E> for QmpError {
    fn from(e: E) -> Self {
        QmpError::generic(e.to_string())
    }
}

impl QmpError {
    /// A `GenericError`.
    pub(crate) fn generic(desc: impl Into<String>) -> Self {
        QmpError {
            class: ErrorClass::GenericError,
            desc: desc.into(),
        }
    }

    /// A `CommandNotFound`.
    pub(crate) fn command_not_found(desc: impl Into<String>) -> Self {
        QmpError {
            class: ErrorClass::CommandNotFound,
            desc: desc.into(),
        }
    }
}

/// A client's bytes, split into JSON values as they complete.
#[derive(Debug, Default)]
pub(crate) struct Splitter {
    buf: Vec<u8>,
}

impl Splitter {
    /// Appends bytes read from the client.
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// How many bytes wait for the end of a message.
    pub(crate) fn pending(&self) -> usize {
        self.buf.len()
    }

    /// The next complete value; `Some(Err)` for bytes that are not JSON (skipped to the end
    /// of their line, as QEMU's parser recovers); None until more bytes come.
    pub(crate) fn next_value(&mut self) -> Option<Result<Value, String>> {
        let start = self.buf.iter().position(|b| !b.is_ascii_whitespace());
        let Some(start) = start else {
            self.buf.clear();
            return None;
        };
        let mut values =
            serde_json::Deserializer::from_slice(&self.buf[start..]).into_iter::<Value>();
        match values.next()? {
            Ok(value) => {
                let used = start + values.byte_offset();
                self.buf.drain(..used);
                Some(Ok(value))
            }
            Err(e) if e.is_eof() => None,
            Err(e) => {
                let skip = self.buf[start..]
                    .iter()
                    .position(|&b| b == b'\n')
                    .map_or(self.buf.len(), |n| start + n + 1);
                self.buf.drain(..skip);
                Some(Err(format!("JSON parse error, {e}")))
            }
        }
    }
}

/// One command as a client sent it.
#[derive(Debug)]
pub(crate) struct Request {
    /// The `id` to echo, if any.
    pub(crate) id: Option<Value>,
    /// The command's name.
    pub(crate) execute: String,
    /// Its arguments (empty when none were given).
    pub(crate) arguments: Map<String, Value>,
}

/// Checks a message's shape as QEMU does; an error keeps the `id` when there was one.
pub(crate) fn request(value: Value) -> Result<Request, (Option<Value>, QmpError)> {
    let Value::Object(mut message) = value else {
        return Err((None, QmpError::generic("QMP input must be a JSON object")));
    };
    let id = message.remove("id");
    let fail = |desc: &str| Err((id.clone(), QmpError::generic(desc)));
    let execute = match message.remove("execute") {
        Some(Value::String(name)) => name,
        Some(_) => return fail("QMP input member 'execute' must be a string"),
        None if message.contains_key("exec-oob") => {
            return fail("QMP input member 'exec-oob' is not served: out-of-band is not offered")
        }
        None => return fail("QMP input lacks member 'execute'"),
    };
    let arguments = match message.remove("arguments") {
        None => Map::new(),
        Some(Value::Object(arguments)) => arguments,
        Some(_) => return fail("QMP input member 'arguments' must be an object"),
    };
    if let Some(key) = message.keys().next() {
        return fail(&format!("QMP input member '{key}' is unexpected"));
    }
    Ok(Request {
        id,
        execute,
        arguments,
    })
}

/// `{"return": value}`, with the request's `id`.
pub(crate) fn success(id: Option<Value>, value: Value) -> Value {
    let mut reply = Map::new();
    reply.insert("return".into(), value);
    if let Some(id) = id {
        reply.insert("id".into(), id);
    }
    Value::Object(reply)
}

/// `{"error": {"class": ..., "desc": ...}}`, with the request's `id`.
pub(crate) fn failure(id: Option<Value>, error: &QmpError) -> Value {
    let class = match error.class {
        ErrorClass::GenericError => "GenericError",
        ErrorClass::CommandNotFound => "CommandNotFound",
        ErrorClass::DeviceNotFound => "DeviceNotFound",
        ErrorClass::DeviceNotActive => "DeviceNotActive",
    };
    let mut reply = Map::new();
    reply.insert("error".into(), json!({"class": class, "desc": error.desc}));
    if let Some(id) = id {
        reply.insert("id".into(), id);
    }
    Value::Object(reply)
}

/// The greeting a client gets on connecting: our version, no capabilities offered.
pub(crate) fn greeting() -> Value {
    json!({"QMP": {"version": version(), "capabilities": []}})
}

/// `query-version`'s answer: this crate's version in QEMU's shape.
pub(crate) fn version() -> Value {
    let part = |s: &str| s.parse::<u64>().unwrap_or(0);
    json!({
        "qemu": {
            "major": part(env!("CARGO_PKG_VERSION_MAJOR")),
            "minor": part(env!("CARGO_PKG_VERSION_MINOR")),
            "micro": part(env!("CARGO_PKG_VERSION_PATCH")),
        },
        "package": concat!("aio-storage-daemon ", env!("CARGO_PKG_VERSION")),
    })
}

/// A command's arguments, taken one by one; what is left is refused ([`Args::finish`]).
/// Errors name an argument by its path from the command's arguments, as QEMU's input
/// visitor does (`actions[0].data.name` for a transaction action's): the second field is
/// the path of the object these arguments are (empty for a command's own).
pub(crate) struct Args(pub(crate) Map<String, Value>, String);

impl Args {
    /// A command's own arguments.
    pub(crate) fn new(arguments: Map<String, Value>) -> Args {
        Args(arguments, String::new())
    }

    /// The members of the object at `path` inside a command's arguments.
    pub(crate) fn nested(members: Map<String, Value>, path: String) -> Args {
        Args(members, path)
    }

    /// The path of member `key`, as errors name it.
    pub(crate) fn path(&self, key: &str) -> String {
        if self.1.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.1)
        }
    }

    /// "Parameter ... is missing", for member `key`.
    pub(crate) fn missing(&self, key: &str) -> QmpError {
        QmpError::generic(format!("Parameter '{}' is missing", self.path(key)))
    }

    fn wrong_type(&self, key: &str, expected: &str) -> QmpError {
        QmpError::generic(format!(
            "Invalid parameter type for '{}', expected: {expected}",
            self.path(key)
        ))
    }

    /// An object argument, if given.
    pub(crate) fn opt_object(&mut self, key: &str) -> Result<Option<Map<String, Value>>, QmpError> {
        match self.0.remove(key) {
            None => Ok(None),
            Some(Value::Object(members)) => Ok(Some(members)),
            Some(_) => Err(self.wrong_type(key, "object")),
        }
    }

    /// An array argument that must be given.
    pub(crate) fn array(&mut self, key: &str) -> Result<Vec<Value>, QmpError> {
        match self.0.remove(key) {
            None => Err(self.missing(key)),
            Some(Value::Array(items)) => Ok(items),
            Some(_) => Err(self.wrong_type(key, "array")),
        }
    }

    /// An enum argument (a string, one of `values`), if given. QEMU names the member alone
    /// in this error, whatever its path.
    pub(crate) fn opt_enum(
        &mut self,
        key: &str,
        values: &[&'static str],
    ) -> Result<Option<&'static str>, QmpError> {
        match self.opt_str(key)? {
            None => Ok(None),
            Some(v) => values
                .iter()
                .find(|&&known| known == v)
                .map(|&known| Some(known))
                .ok_or_else(|| {
                    QmpError::generic(format!("Parameter '{key}' does not accept value '{v}'"))
                }),
        }
    }

    /// A string argument, if given.
    pub(crate) fn opt_str(&mut self, key: &str) -> Result<Option<String>, QmpError> {
        match self.0.remove(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(self.wrong_type(key, "string")),
        }
    }

    /// A boolean argument, if given.
    pub(crate) fn opt_bool(&mut self, key: &str) -> Result<Option<bool>, QmpError> {
        match self.0.remove(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(_) => Err(self.wrong_type(key, "bool")),
        }
    }

    /// An integer argument (QMP's `int`) that must be given.
    pub(crate) fn int(&mut self, key: &str) -> Result<i64, QmpError> {
        match self.0.remove(key) {
            None => Err(self.missing(key)),
            Some(Value::Number(n)) => n.as_i64().ok_or_else(|| self.wrong_type(key, "integer")),
            Some(_) => Err(self.wrong_type(key, "integer")),
        }
    }

    /// A signed integer argument (QMP's `int`), if given.
    pub(crate) fn opt_int(&mut self, key: &str) -> Result<Option<i64>, QmpError> {
        match self.0.contains_key(key) {
            true => self.int(key).map(Some),
            false => Ok(None),
        }
    }

    /// An unsigned integer argument (QMP's `uint64`), if given.
    pub(crate) fn opt_u64(&mut self, key: &str) -> Result<Option<u64>, QmpError> {
        match self.0.remove(key) {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.wrong_type(key, "integer")),
            Some(_) => Err(self.wrong_type(key, "integer")),
        }
    }

    /// A list of unsigned integers (QMP's `['uint64']`), if given.
    pub(crate) fn opt_u64_list(&mut self, key: &str) -> Result<Option<Vec<u64>>, QmpError> {
        match self.0.remove(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_u64()
                        .ok_or_else(|| self.wrong_type(&format!("{key}[{i}]"), "integer"))
                })
                .collect::<Result<Vec<u64>, QmpError>>()
                .map(Some),
            Some(_) => Err(self.wrong_type(key, "array")),
        }
    }

    /// A string argument that must be given.
    pub(crate) fn str(&mut self, key: &str) -> Result<String, QmpError> {
        self.opt_str(key)?.ok_or_else(|| self.missing(key))
    }

    /// Any argument that must be given, as it is.
    pub(crate) fn value(&mut self, key: &str) -> Result<Value, QmpError> {
        self.0.remove(key).ok_or_else(|| self.missing(key))
    }

    /// `qmp_capabilities`' arguments: `enable`, a list of capabilities, none of which is
    /// offered here.
    pub(crate) fn capabilities(mut self) -> Result<(), QmpError> {
        match self.0.remove("enable") {
            None => {}
            Some(Value::Array(list)) => {
                if let Some(first) = list.first() {
                    let name = first.as_str().unwrap_or("?");
                    return Err(QmpError::generic(format!(
                        "Capability '{name}' not available"
                    )));
                }
            }
            Some(_) => return Err(self.wrong_type("enable", "array")),
        }
        self.finish()
    }

    /// Refuses what is left.
    pub(crate) fn finish(self) -> Result<(), QmpError> {
        match self.0.keys().next() {
            None => Ok(()),
            Some(key) => Err(QmpError::generic(format!(
                "Parameter '{}' is unexpected",
                self.path(key)
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_splitter_takes_values_split_and_joined_and_skips_garbage_to_the_line_end() {
        let mut s = Splitter::default();
        s.push(br#"{"execute": "a"} {"exe"#);
        assert_eq!(s.next_value().unwrap().unwrap(), json!({"execute": "a"}));
        assert!(s.next_value().is_none(), "half a message waits");
        s.push(b"cute\": \"b\"}\n");
        assert_eq!(s.next_value().unwrap().unwrap(), json!({"execute": "b"}));
        s.push(b"{nope}\n{\"execute\": \"c\"}\n");
        assert!(s.next_value().unwrap().is_err());
        assert_eq!(s.next_value().unwrap().unwrap(), json!({"execute": "c"}));
        assert!(s.next_value().is_none());
        assert_eq!(s.pending(), 0);
    }

    #[test]
    fn requests_are_checked_as_qemu_checks_them_and_keep_their_id() {
        let r = request(json!({"execute": "x", "arguments": {"a": 1}, "id": [1]})).unwrap();
        assert_eq!((r.execute.as_str(), r.id), ("x", Some(json!([1]))));
        let desc = |v: Value| request(v).unwrap_err().1.desc;
        assert!(desc(json!([1])).contains("must be a JSON object"));
        assert!(desc(json!({"id": 1})).contains("lacks member 'execute'"));
        assert!(desc(json!({"execute": 1})).contains("must be a string"));
        assert!(desc(json!({"execute": "x", "arguments": 1})).contains("must be an object"));
        assert!(desc(json!({"execute": "x", "colour": 1})).contains("'colour' is unexpected"));
        assert_eq!(
            request(json!({"execute": 1, "id": "a"})).unwrap_err().0,
            Some(json!("a"))
        );
        let e = failure(Some(json!(7)), &QmpError::command_not_found("no"));
        assert_eq!(
            e,
            json!({"error": {"class": "CommandNotFound", "desc": "no"}, "id": 7})
        );
    }

    #[test]
    fn arguments_name_what_is_missing_wrong_or_unexpected() {
        let mut a = Args::new(json!({"id": 3, "x": "s"}).as_object().unwrap().clone());
        assert!(a.str("id").unwrap_err().desc.contains("expected: string"));
        assert!(a
            .str("name")
            .unwrap_err()
            .desc
            .contains("'name' is missing"));
        assert!(a.finish().unwrap_err().desc.contains("'x' is unexpected"));
    }

    #[test]
    fn nested_arguments_are_named_by_their_path_but_in_an_enums_error() {
        let members = json!({"name": 3, "mode": "m", "extra": 1});
        let mut a = Args::nested(
            members.as_object().unwrap().clone(),
            "actions[1].data".into(),
        );
        assert_eq!(
            a.str("name").unwrap_err().desc,
            "Invalid parameter type for 'actions[1].data.name', expected: string"
        );
        assert_eq!(
            a.str("node").unwrap_err().desc,
            "Parameter 'actions[1].data.node' is missing"
        );
        assert_eq!(
            a.opt_enum("mode", &["a", "b"]).unwrap_err().desc,
            "Parameter 'mode' does not accept value 'm'"
        );
        assert_eq!(
            a.finish().unwrap_err().desc,
            "Parameter 'actions[1].data.extra' is unexpected"
        );
    }
}
