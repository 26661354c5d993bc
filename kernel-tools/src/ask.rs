//! `ask` (`nexus.human.ask`): the grammar of a call and of the answer a person gives to it
//! (`docs/kernel-tools.md`, "ask"). Pure: the server parks the call, holds it and settles it.
//!
//! A call is `{prompt, options?, multi?}` and nothing else ([`Ask::parse`]): `prompt` a non-empty
//! string of at most [`PROMPT_BOUND`] bytes; `options` at most [`OPTIONS_BOUND`] distinct,
//! non-empty strings of at most [`OPTION_BOUND`] bytes each; `multi` a boolean (default false).
//! A refusal is a sentence the model reads as the call's error envelope, saying how to repair the
//! call (`question` is refused with "ask takes prompt, not question").
//!
//! An answer ([`Ask::accept`]) is one of the options when the call has options and `multi` is
//! false; a non-empty list of distinct options (or one option as a string) when `multi` is true;
//! any non-empty text of at most [`ANSWER_BOUND`] bytes when the call has no options.

use std::collections::BTreeSet;

use serde_json::{Value, json};

/// The wire name of `nexus.human.ask`.
pub const WIRE_NAME: &str = "ask";
/// The longest `prompt`, in bytes (4 KiB).
pub const PROMPT_BOUND: usize = 4_096;
/// The most `options` one call may offer.
pub const OPTIONS_BOUND: usize = 32;
/// The longest option, in bytes.
pub const OPTION_BOUND: usize = 256;
/// The longest free-text answer, in bytes (64 KiB).
pub const ANSWER_BOUND: usize = 65_536;

/// The parameters `ask` takes.
const PARAMETERS: [&str; 3] = ["prompt", "options", "multi"];

/// A validated `ask` call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ask {
    /// The question, as the model wrote it.
    pub prompt: String,
    /// The answers to choose from, in the model's order; empty for a free-text question.
    pub options: Vec<String>,
    /// Whether several options may be chosen together.
    pub multi: bool,
}

/// A person's answer to an [`Ask`], validated against it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Free text, or the one option chosen.
    Text(String),
    /// The options chosen together (a `multi` call), in the order given.
    Choices(Vec<String>),
}

impl Answer {
    /// The answer as JSON: a string, or an array of strings.
    pub fn to_value(&self) -> Value {
        match self {
            Answer::Text(text) => json!(text),
            Answer::Choices(choices) => json!(choices),
        }
    }

    /// What the model reads as the call's result: the text itself, or the choices as a JSON
    /// array (`["a","b"]`).
    pub fn model_text(&self) -> String {
        match self {
            Answer::Text(text) => text.clone(),
            Answer::Choices(choices) => json!(choices).to_string(),
        }
    }
}

impl Ask {
    /// Reads the input of an `ask` call.
    ///
    /// # Errors
    /// A sentence for the model (the call's error envelope): an input that is not an object, an
    /// unknown key (`question` gets its own repair sentence), a missing or empty `prompt`, a
    /// `prompt` over [`PROMPT_BOUND`], `options` that are not an array of distinct non-empty
    /// strings, more than [`OPTIONS_BOUND`] options or one over [`OPTION_BOUND`], or a `multi`
    /// that is not a boolean.
    pub fn parse(input: &Value) -> Result<Ask, String> {
        let Some(fields) = input.as_object() else {
            return Err("ask takes an object: {\"prompt\": \"...\", \"options\": [...], \"multi\": false}".into());
        };
        if fields.contains_key("question") {
            return Err("ask takes prompt, not question: pass the question as prompt".into());
        }
        if let Some(unknown) = fields.keys().find(|key| !PARAMETERS.contains(&key.as_str())) {
            return Err(format!("ask takes prompt, options and multi; remove {}", shown(unknown)));
        }
        let prompt = match fields.get("prompt") {
            Some(Value::String(prompt)) if !prompt.trim().is_empty() => prompt.clone(),
            Some(Value::String(_)) => return Err("prompt is empty: write the question to ask".into()),
            None | Some(Value::Null) => return Err("prompt is required: write the question to ask".into()),
            Some(_) => return Err("prompt must be a string: the question to ask".into()),
        };
        if prompt.len() > PROMPT_BOUND {
            return Err(format!(
                "prompt is {} bytes; a question is at most {PROMPT_BOUND} bytes: shorten it",
                prompt.len()
            ));
        }
        let options = match fields.get("options") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => options(items)?,
            Some(_) => return Err("options must be an array of non-empty strings".into()),
        };
        let multi = match fields.get("multi") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(multi)) => *multi,
            Some(_) => return Err("multi must be true or false.".into()),
        };
        // `multi` chooses among options: without any it would ask for free text all the same.
        if multi && options.is_empty() {
            return Err(
                "multi: true needs options to choose from; offer options, or leave multi out for a free-text answer"
                    .into(),
            );
        }
        Ok(Ask { prompt, options, multi })
    }

    /// Judges a person's `answer` (the JSON of the door's `answer` field) against this call.
    ///
    /// # Errors
    /// A sentence for the person: an answer of the wrong type, empty, over [`ANSWER_BOUND`],
    /// holding NUL, not one of the options, or (for `multi`) a repeated or empty list.
    pub fn accept(&self, answer: &Value) -> Result<Answer, String> {
        match answer {
            Value::String(text) if self.options.is_empty() => {
                if text.trim().is_empty() {
                    return Err("answer is empty: write the answer to the question".into());
                }
                if text.len() > ANSWER_BOUND {
                    return Err(format!("answer is {} bytes; an answer is at most {ANSWER_BOUND} bytes", text.len()));
                }
                if text.contains('\0') {
                    return Err("answer must not contain NUL (U+0000); remove it and send again".into());
                }
                Ok(Answer::Text(text.clone()))
            }
            Value::String(text) => {
                self.option(text)?;
                Ok(Answer::Text(text.clone()))
            }
            Value::Array(items) if self.multi && !self.options.is_empty() => {
                if items.is_empty() {
                    return Err(format!("answer is an empty list; choose at least one of {}", self.listed()));
                }
                let mut seen = BTreeSet::new();
                let mut choices = Vec::with_capacity(items.len());
                for item in items {
                    let Some(choice) = item.as_str() else {
                        return Err(format!("answer must list options as strings, one or more of {}", self.listed()));
                    };
                    self.option(choice)?;
                    if !seen.insert(choice) {
                        return Err(format!("answer names {} twice; name each option once", shown(choice)));
                    }
                    choices.push(choice.to_owned());
                }
                Ok(Answer::Choices(choices))
            }
            _ if self.options.is_empty() => Err("answer must be a string: the answer to the question".into()),
            _ if self.multi => Err(format!("answer must be one option or a list of options, from {}", self.listed())),
            _ => Err(format!("answer must be exactly one of {}, as a string", self.listed())),
        }
    }

    /// `Ok` when `choice` is one of the options.
    fn option(&self, choice: &str) -> Result<(), String> {
        if self.options.iter().any(|option| option == choice) {
            return Ok(());
        }
        Err(format!("{} is not one of the options; answer with one of {}", shown(choice), self.listed()))
    }

    /// The options as the refusals list them: `"a", "b"`, cut after a few.
    fn listed(&self) -> String {
        const LISTED: usize = 8;
        let mut listed: Vec<String> = self.options.iter().take(LISTED).map(|option| shown(option)).collect();
        if self.options.len() > LISTED {
            listed.push(format!("… ({} in all)", self.options.len()));
        }
        listed.join(", ")
    }
}

/// The options of a call, validated.
fn options(items: &[Value]) -> Result<Vec<String>, String> {
    if items.is_empty() {
        return Err("options is empty; offer at least one option, or leave options out for a free-text answer".into());
    }
    if items.len() > OPTIONS_BOUND {
        return Err(format!("options has {} entries; offer at most {OPTIONS_BOUND}", items.len()));
    }
    let mut seen = BTreeSet::new();
    let mut options = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let option = match item.as_str() {
            Some(option) if !option.trim().is_empty() => option,
            _ => return Err(format!("options[{index}] must be a non-empty string")),
        };
        if option.len() > OPTION_BOUND {
            return Err(format!(
                "options[{index}] is {} bytes; an option is at most {OPTION_BOUND} bytes",
                option.len()
            ));
        }
        if !seen.insert(option) {
            return Err(format!("options[{index}] repeats {}; offer each option once", shown(option)));
        }
        options.push(option.to_owned());
    }
    Ok(options)
}

/// `text` quoted for a sentence, cut to 64 characters.
fn shown(text: &str) -> String {
    const SHOWN: usize = 64;
    match text.char_indices().nth(SHOWN) {
        Some((end, _)) => format!("{:?}…", &text[..end]),
        None => format!("{text:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_prompt_options_and_multi_and_nothing_else() {
        let ask = Ask::parse(&json!({"prompt": "Which?", "options": ["a", "b"], "multi": true})).expect("valid");
        assert_eq!(ask, Ask { prompt: "Which?".into(), options: vec!["a".into(), "b".into()], multi: true });
        let plain = Ask::parse(&json!({"prompt": "Why?", "options": null})).expect("valid");
        assert_eq!((plain.options.len(), plain.multi), (0, false));

        let refused = |input: Value| Ask::parse(&input).expect_err("refused");
        assert_eq!(
            refused(json!({"question": "Which?"})),
            "ask takes prompt, not question: pass the question as prompt"
        );
        assert!(refused(json!({"prompt": "x", "choices": []})).contains("remove \"choices\""));
        assert!(refused(json!([])).starts_with("ask takes an object"));
        assert!(refused(json!({})).starts_with("prompt is required"));
        assert!(refused(json!({"prompt": "  "})).starts_with("prompt is empty"));
        assert!(refused(json!({"prompt": 7})).starts_with("prompt must be a string"));
        assert!(refused(json!({"prompt": "x".repeat(PROMPT_BOUND + 1)})).contains("at most 4096 bytes"));
        assert!(Ask::parse(&json!({"prompt": "x".repeat(PROMPT_BOUND)})).is_ok(), "the bound itself is allowed");
        assert_eq!(refused(json!({"prompt": "x", "options": "a"})), "options must be an array of non-empty strings");
        assert_eq!(refused(json!({"prompt": "x", "options": ["a", ""]})), "options[1] must be a non-empty string");
        assert_eq!(refused(json!({"prompt": "x", "options": ["a", 2]})), "options[1] must be a non-empty string");
        assert!(refused(json!({"prompt": "x", "options": ["a", "a"]})).contains("repeats \"a\""));
        let many: Vec<String> = (0..=OPTIONS_BOUND).map(|i| format!("o{i}")).collect();
        assert!(refused(json!({"prompt": "x", "options": many})).contains("at most 32"));
        assert!(refused(json!({"prompt": "x", "options": ["o".repeat(OPTION_BOUND + 1)]})).contains("at most 256"));
        assert_eq!(refused(json!({"prompt": "x", "multi": "yes"})), "multi must be true or false.");
        assert!(refused(json!({"prompt": "x", "options": []})).starts_with("options is empty"));
        assert!(refused(json!({"prompt": "x", "multi": true})).starts_with("multi: true needs options"));
    }

    #[test]
    fn an_answer_is_judged_against_the_call() {
        let single = Ask::parse(&json!({"prompt": "?", "options": ["red", "blue"]})).expect("valid");
        assert_eq!(single.accept(&json!("blue")), Ok(Answer::Text("blue".into())));
        assert!(single.accept(&json!("green")).expect_err("not an option").contains("not one of the options"));
        assert!(single.accept(&json!(["red"])).expect_err("one only").contains("exactly one of"));
        assert!(single.accept(&json!(3)).is_err());

        let multi = Ask::parse(&json!({"prompt": "?", "options": ["a", "b", "c"], "multi": true})).expect("valid");
        let both = multi.accept(&json!(["c", "a"])).expect("two options");
        assert_eq!(both, Answer::Choices(vec!["c".into(), "a".into()]));
        assert_eq!((both.to_value(), both.model_text()), (json!(["c", "a"]), r#"["c","a"]"#.to_owned()));
        assert_eq!(multi.accept(&json!("b")), Ok(Answer::Text("b".into())), "one option as a string");
        assert!(multi.accept(&json!([])).is_err());
        assert!(multi.accept(&json!(["a", "a"])).expect_err("twice").contains("twice"));
        assert!(multi.accept(&json!(["a", "z"])).is_err());
        assert!(multi.accept(&json!(["a", 1])).is_err());

        let free = Ask::parse(&json!({"prompt": "?"})).expect("valid");
        assert_eq!(free.accept(&json!("anything")).map(|a| a.model_text()), Ok("anything".into()));
        assert!(free.accept(&json!(" ")).is_err());
        assert!(free.accept(&json!(["a"])).is_err());
        assert!(free.accept(&json!("nul\0")).is_err());
        assert!(free.accept(&json!("x".repeat(ANSWER_BOUND + 1))).is_err());
        assert!(free.accept(&json!("x".repeat(ANSWER_BOUND))).is_ok());
        assert!(free.accept(&Value::Null).is_err());
    }
}
