//! Strict JSON: what a client sends is read once, here, and an ambiguous text is refused rather
//! than guessed (`docs/protocol.md`, "Refusals").
//!
//! `serde_json` keeps the last of two equal keys (`{"approval_mode":"ask","approval_mode":"bypass"}`
//! reads as `bypass`). [`parse`] builds the same [`Value`] but refuses a key that appears twice in
//! one object, at any depth, and names it with its path. Every door body (HTTP bodies, the JSON
//! fields of the gRPC requests) and every JSON text a runner sends is read through it.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// How many characters of client input a refusal message repeats; longer input is cut and
/// marked with `…`.
pub const ECHO_BOUND: usize = 64;

/// Client input fit for a refusal message: at most [`ECHO_BOUND`] characters, then `…`.
pub fn echo(text: &str) -> String {
    match text.char_indices().nth(ECHO_BOUND) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// Why a text is not one JSON value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JsonFault {
    /// The text is not JSON (a syntax error, an early end, nesting over 128 levels): the parser's
    /// message, with line and column.
    Syntax(String),
    /// An object names `key` twice; `path` is where the object sits (`$` for the root, then
    /// `.field` and `[index]`).
    DuplicateKey {
        /// Where the object is, e.g. `$.configuration`.
        path: String,
        /// The repeated key, cut to [`ECHO_BOUND`] characters.
        key: String,
    },
}

impl fmt::Display for JsonFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JsonFault::Syntax(message) => write!(f, "{message}"),
            JsonFault::DuplicateKey { path, key } => {
                write!(f, "the key {key:?} appears twice in the object at {path}; send each key once")
            }
        }
    }
}

/// Parses `bytes` as one JSON value, refusing duplicate keys at every depth.
///
/// # Errors
/// [`JsonFault::Syntax`] for text that is not JSON, [`JsonFault::DuplicateKey`] for an object
/// that names a key twice.
pub fn parse(bytes: &[u8]) -> Result<Value, JsonFault> {
    let duplicate = std::cell::RefCell::new(None);
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let parsed = Strict { at: At::Root, duplicate: &duplicate }
        .deserialize(&mut deserializer)
        .and_then(|value| deserializer.end().map(|()| value));
    match (parsed, duplicate.into_inner()) {
        (_, Some(fault)) => Err(fault),
        (Ok(value), None) => Ok(value),
        (Err(e), None) => Err(JsonFault::Syntax(e.to_string())),
    }
}

/// [`parse`] over text.
///
/// # Errors
/// As [`parse`].
pub fn parse_str(text: &str) -> Result<Value, JsonFault> {
    parse(text.as_bytes())
}

/// Where a value sits, as a chain of borrowed steps: spelt out only for a refusal, so a large
/// body costs no path strings.
#[derive(Clone, Copy)]
enum At<'p> {
    Root,
    Key(&'p At<'p>, &'p str),
    Index(&'p At<'p>, usize),
}

impl At<'_> {
    fn path(&self) -> String {
        match self {
            At::Root => "$".to_owned(),
            At::Key(parent, key) => format!("{}.{}", parent.path(), echo(key)),
            At::Index(parent, index) => format!("{}[{index}]", parent.path()),
        }
    }
}

/// A value at `at`; the first duplicate found is kept in `duplicate` (the error serde carries
/// up has lost its structure by then).
struct Strict<'a, 'p> {
    at: At<'p>,
    duplicate: &'a std::cell::RefCell<Option<JsonFault>>,
}

impl<'de> DeserializeSeed<'de> for Strict<'_, '_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_, '_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
        Ok(Value::Number(value.into()))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
        Ok(Value::Number(value.into()))
    }

    fn visit_f64<E: serde::de::Error>(self, value: f64) -> Result<Value, E> {
        Number::from_f64(value).map(Value::Number).ok_or_else(|| E::custom("a number out of range"))
    }

    fn visit_str<E>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_owned()))
    }

    fn visit_string<E>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        loop {
            let seed = Strict { at: At::Index(&self.at, items.len()), duplicate: self.duplicate };
            match seq.next_element_seed(seed)? {
                Some(item) => items.push(item),
                None => return Ok(Value::Array(items)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut fields = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if fields.contains_key(&key) {
                let fault = JsonFault::DuplicateKey { path: self.at.path(), key: echo(&key) };
                let message = fault.to_string();
                self.duplicate.borrow_mut().get_or_insert(fault);
                return Err(A::Error::custom(message));
            }
            let seed = Strict { at: At::Key(&self.at, &key), duplicate: self.duplicate };
            let value = map.next_value_seed(seed)?;
            fields.insert(key, value);
        }
        Ok(Value::Object(fields))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn values_parse_as_serde_json_reads_them() {
        for text in [
            r#"{"a": [1, -2, 3.5, true, null, "x"], "b": {"c": {}}}"#,
            "[]",
            "null",
            "\"text\"",
            "18446744073709551615",
            " {\"a\":1} ",
        ] {
            let strict = parse_str(text).expect(text);
            assert_eq!(strict, serde_json::from_str::<Value>(text).expect("json"), "{text}");
        }
    }

    #[test]
    fn a_repeated_key_is_refused_at_every_depth_and_named() {
        let cases = [
            (r#"{"approval_mode":"ask","approval_mode":"bypass"}"#, "$", "approval_mode"),
            (r#"{"configuration":{"a":1,"b":2,"a":3}}"#, "$.configuration", "a"),
            (r#"{"x":[{"k":1},{"k":1,"k":2}]}"#, "$.x[1]", "k"),
        ];
        for (text, path, key) in cases {
            assert_eq!(
                parse_str(text),
                Err(JsonFault::DuplicateKey { path: path.to_owned(), key: key.to_owned() }),
                "{text}"
            );
        }
        // Equal keys in different objects are no ambiguity.
        assert_eq!(parse_str(r#"{"a":{"a":1},"b":{"a":2}}"#), Ok(json!({"a": {"a": 1}, "b": {"a": 2}})));
    }

    #[test]
    fn text_that_is_not_json_is_a_syntax_fault() {
        for text in ["", "{", "{\"a\":1,}", "[1 2]", "{} {}", "nul", &"[".repeat(200)] {
            assert!(matches!(parse_str(text), Err(JsonFault::Syntax(_))), "{text}");
        }
    }

    #[test]
    fn echoed_input_is_cut() {
        assert_eq!(echo("short"), "short");
        let long = "é".repeat(100_000);
        let cut = echo(&long);
        assert_eq!(cut.chars().count(), ECHO_BOUND + 1);
        assert!(cut.ends_with('…'));
    }
}
