//! One option's value in QEMU's two syntaxes: `key=value,...` (QEMU's keyval: `,,` is a
//! literal comma, an optional implied first key, dotted keys such as `cache.direct`) and JSON
//! (`{"driver": "file", "cache": {"direct": true}}`, nested objects flattened to the same
//! dotted keys, booleans as `on` / `off`).
//!
//! This module owns reading one value into keys and typed fields, and the errors that name the
//! option and the key; it knows nothing of what the keys mean (the drivers' readers do).

use std::collections::BTreeMap;

use super::error::QsdError;

/// One option's keys and values, taken one by one by the code that knows them; what is left
/// at the end was not understood and is refused ([`Opts::finish`]).
#[derive(Debug, Clone)]
pub(crate) struct Opts {
    /// The option as given, for messages: `--blockdev driver=file,...`.
    shown: String,
    map: BTreeMap<String, String>,
}

impl Opts {
    /// Parses `text`, the value of `option` (`--blockdev`), in either syntax. `implied` is the
    /// key a first element without `=` stands for (`--object iothread,...`: `qom-type`).
    pub(crate) fn parse(option: &str, text: &str, implied: Option<&str>) -> Result<Self, QsdError> {
        let shown = format!("{option} {text}");
        let pairs = if text.trim_start().starts_with('{') {
            json_pairs(text).map_err(|reason| QsdError::Invalid {
                option: shown.clone(),
                reason,
            })?
        } else {
            keyval_pairs(text, implied).map_err(|reason| QsdError::Invalid {
                option: shown.clone(),
                reason,
            })?
        };
        let mut map = BTreeMap::new();
        for (key, value) in pairs {
            if map.insert(key.clone(), value).is_some() {
                return Err(QsdError::Invalid {
                    option: shown,
                    reason: format!("'{key}' is given twice"),
                });
            }
        }
        Ok(Opts { shown, map })
    }

    /// A QMP command's arguments (`blockdev-add`'s, `block-export-add`'s): the JSON form.
    pub(crate) fn from_json(
        command: &str,
        arguments: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<Self, QsdError> {
        let shown = command.to_string();
        let mut pairs = Vec::new();
        flatten("", arguments, &mut pairs).map_err(|reason| QsdError::Invalid {
            option: shown.clone(),
            reason,
        })?;
        Ok(Opts {
            shown,
            map: pairs.into_iter().collect(),
        })
    }

    /// The option as given, for messages.
    pub(crate) fn shown(&self) -> &str {
        &self.shown
    }

    /// An error about this option.
    pub(crate) fn invalid(&self, reason: impl Into<String>) -> QsdError {
        QsdError::Invalid {
            option: self.shown.clone(),
            reason: reason.into(),
        }
    }

    /// An error: this option asks for something the daemon does not serve.
    pub(crate) fn not_served(&self, what: impl Into<String>) -> QsdError {
        QsdError::NotServed {
            option: self.shown.clone(),
            what: what.into(),
        }
    }

    /// Takes `key`'s value, if given.
    pub(crate) fn take(&mut self, key: &str) -> Option<String> {
        self.map.remove(key)
    }

    /// Takes `key`'s value, which must be given.
    pub(crate) fn required(&mut self, key: &str) -> Result<String, QsdError> {
        self.take(key)
            .ok_or_else(|| self.invalid(format!("'{key}' is missing")))
    }

    /// Takes a boolean (`on`/`off`, `true`/`false`, `yes`/`no`), `default` when not given.
    pub(crate) fn take_bool(&mut self, key: &str, default: bool) -> Result<bool, QsdError> {
        match self.take(key).as_deref() {
            None => Ok(default),
            Some("on" | "true" | "yes") => Ok(true),
            Some("off" | "false" | "no") => Ok(false),
            Some(other) => Err(self.invalid(format!("{key}={other}: expected on or off"))),
        }
    }

    /// Takes an unsigned number, `default` when not given.
    pub(crate) fn take_u64(&mut self, key: &str, default: u64) -> Result<u64, QsdError> {
        match self.take(key) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| self.invalid(format!("{key}={v}: expected a number"))),
        }
    }

    /// Takes every key under `prefix.` (without the prefix), as an option of its own: an
    /// inline child node (`file.driver=file,file.filename=...`).
    pub(crate) fn take_child(&mut self, prefix: &str) -> Option<Opts> {
        let dotted = format!("{prefix}.");
        let keys: Vec<String> = self
            .map
            .keys()
            .filter(|k| k.starts_with(&dotted))
            .cloned()
            .collect();
        if keys.is_empty() {
            return None;
        }
        let mut map = BTreeMap::new();
        for key in keys {
            let value = self.map.remove(&key).expect("listed above");
            map.insert(key[dotted.len()..].to_string(), value);
        }
        Some(Opts {
            shown: self.shown.clone(),
            map,
        })
    }

    /// Refuses what is left: keys nothing here understands, named.
    pub(crate) fn finish(self) -> Result<(), QsdError> {
        match self.map.keys().next() {
            None => Ok(()),
            Some(key) => {
                let value = &self.map[key];
                Err(self.not_served(format!("the option '{key}={value}'")))
            }
        }
    }
}

/// QEMU's keyval syntax: `a=1,b=x,,y` (a `,,` is a comma in a value); a first element with
/// no `=` is the value of `implied`.
fn keyval_pairs(text: &str, implied: Option<&str>) -> Result<Vec<(String, String)>, String> {
    let mut elements = Vec::new();
    let mut current = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ',' {
            if chars.peek() == Some(&',') {
                chars.next();
                current.push(',');
            } else {
                elements.push(std::mem::take(&mut current));
            }
        } else {
            current.push(c);
        }
    }
    elements.push(current);
    let mut pairs = Vec::new();
    for (i, element) in elements.into_iter().enumerate() {
        match element.split_once('=') {
            Some(("", _)) => return Err(format!("'{element}' has no key")),
            Some((key, value)) => pairs.push((key.to_string(), value.to_string())),
            None if i == 0 && implied.is_some() && !element.is_empty() => {
                pairs.push((implied.expect("checked").to_string(), element));
            }
            None if element.is_empty() => return Err("an empty element (two commas?)".into()),
            None => return Err(format!("'{element}' is not KEY=VALUE")),
        }
    }
    Ok(pairs)
}

/// A JSON object, nested objects flattened to dotted keys.
fn json_pairs(text: &str) -> Result<Vec<(String, String)>, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let serde_json::Value::Object(object) = value else {
        return Err("expected a JSON object".into());
    };
    let mut pairs = Vec::new();
    flatten("", &object, &mut pairs)?;
    Ok(pairs)
}

fn flatten(
    prefix: &str,
    object: &serde_json::Map<String, serde_json::Value>,
    out: &mut Vec<(String, String)>,
) -> Result<(), String> {
    use serde_json::Value;
    for (key, value) in object {
        let key = format!("{prefix}{key}");
        let text = match value {
            Value::Object(inner) => {
                flatten(&format!("{key}."), inner, out)?;
                continue;
            }
            Value::String(s) => s.clone(),
            Value::Bool(true) => "on".into(),
            Value::Bool(false) => "off".into(),
            Value::Number(n) => n.to_string(),
            // `backing: null` is QEMU's keyval `backing=null`: no backing.
            Value::Null if key == "backing" || key.ends_with(".backing") => "null".into(),
            Value::Null => return Err(format!("'{key}': null is not served")),
            // A list of objects (`server`) as QEMU's keyval writes it: `server.0.host`.
            Value::Array(items) => {
                let mut indexed = serde_json::Map::new();
                for (i, item) in items.iter().enumerate() {
                    indexed.insert(i.to_string(), item.clone());
                }
                flatten(&format!("{key}."), &indexed, out)?;
                continue;
            }
        };
        out.push((key, text));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyval_takes_escaped_commas_implied_keys_and_dotted_keys() {
        let mut o = Opts::parse(
            "--object",
            "iothread,id=io0,poll-max-ns=0",
            Some("qom-type"),
        )
        .unwrap();
        assert_eq!(o.take("qom-type").as_deref(), Some("iothread"));
        assert_eq!(o.take("id").as_deref(), Some("io0"));
        assert_eq!(o.take_u64("poll-max-ns", 32768).unwrap(), 0);
        o.finish().unwrap();
        let mut o = Opts::parse("--blockdev", "filename=/a,,b,cache.direct=on", None).unwrap();
        assert_eq!(o.take("filename").as_deref(), Some("/a,b"));
        assert!(o.take_bool("cache.direct", false).unwrap());
        let e = Opts::parse("--blockdev", "driver", None).unwrap_err();
        assert!(e.to_string().contains("not KEY=VALUE"), "{e}");
        let e = Opts::parse("--blockdev", "a=1,a=2", None).unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
    }

    #[test]
    fn json_flattens_to_the_same_keys() {
        let text = r#"{"driver": "file", "node-name": "f0", "cache": {"direct": true}, "x": 3}"#;
        let mut o = Opts::parse("--blockdev", text, None).unwrap();
        assert_eq!(o.take("cache.direct").as_deref(), Some("on"));
        assert_eq!(o.take_u64("x", 0).unwrap(), 3);
        let mut child = Opts::parse("--blockdev", r#"{"file": {"driver": "file"}}"#, None)
            .unwrap()
            .take_child("file")
            .unwrap();
        assert_eq!(child.take("driver").as_deref(), Some("file"));
        assert!(Opts::parse("--blockdev", "{nope", None).is_err());
        assert!(Opts::parse("--blockdev", "[1]", None).is_err());
    }

    #[test]
    fn what_is_left_is_refused_by_name_and_bad_values_name_their_key() {
        let mut o = Opts::parse("--export", "type=nbd,colour=red", None).unwrap();
        o.take("type");
        let e = o.clone().finish().unwrap_err();
        assert!(e.to_string().contains("colour=red"), "{e}");
        let mut o = Opts::parse("--export", "writable=maybe", None).unwrap();
        let e = o.take_bool("writable", false).unwrap_err();
        assert!(e.to_string().contains("writable=maybe"), "{e}");
        let mut o = Opts::parse("--export", "num-queues=x", None).unwrap();
        assert!(o.take_u64("num-queues", 1).is_err());
    }
}
